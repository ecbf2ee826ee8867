package schema

import (
	"fmt"

	"github.com/hamba/avro/v2"
)

// IndexKind is how a field is indexed.
type IndexKind string

// Index kinds, the values of a field's "index" annotation.
const (
	// IndexAttribute indexes a field's value for exact match and range:
	// strings, enums, numbers, booleans, and each element of an array of
	// those.
	IndexAttribute IndexKind = "attribute"
	// IndexText indexes a string field's words (lower-cased, split at
	// Unicode word boundaries) with their positions, for word, phrase and
	// relevance queries.
	IndexText IndexKind = "text"
)

// TermType is the type an indexed field's terms are encoded as: the
// order terms sort in and the values a query on the field may compare.
type TermType string

// Term types.
const (
	TermString TermType = "string" // strings and enum symbols
	TermLong   TermType = "long"   // int and long
	TermDouble TermType = "double" // float and double
	TermBool   TermType = "boolean"
)

// Index is one indexed top-level field of a schema version.
type Index struct {
	Field string
	Kind  IndexKind
	Type  TermType
	Array bool // the field is an array: each element is a term
	// StopWords: a text index leaves out common English words
	// ("stopWords": true on the field).
	StopWords bool
}

// indexes reads the "index" annotations of a record schema's top-level
// fields. Nested fields are not indexed (an annotation there is refused,
// so it is never silently ignored).
func indexes(s avro.Schema) ([]Index, error) {
	rec, ok := s.(*avro.RecordSchema)
	if !ok {
		return nil, nil
	}
	var out []Index
	for _, f := range rec.Fields() {
		raw := f.Prop("index")
		if raw == nil {
			if err := noNestedIndex(f.Type(), f.Name()); err != nil {
				return nil, err
			}
			continue
		}
		kind, _ := raw.(string)
		if kind != string(IndexAttribute) && kind != string(IndexText) {
			return nil, fieldErr(f.Name(), `"index" must be "attribute" or "text", not %v`, raw)
		}
		ix := Index{Field: f.Name(), Kind: IndexKind(kind)}
		switch sw := f.Prop("stopWords"); sw {
		case nil, false:
		case true:
			if ix.Kind != IndexText {
				return nil, fieldErr(f.Name(), `"stopWords" applies to a "text" index only`)
			}
			ix.StopWords = true
		default:
			return nil, fieldErr(f.Name(), `"stopWords" must be true or false, not %v`, sw)
		}
		t := nonNull(f.Type())
		if a, ok := t.(*avro.ArraySchema); ok {
			ix.Array, t = true, nonNull(a.Items())
		}
		switch t.Type() {
		case avro.String, avro.Enum:
			ix.Type = TermString
		case avro.Int, avro.Long:
			ix.Type = TermLong
		case avro.Float, avro.Double:
			ix.Type = TermDouble
		case avro.Boolean:
			ix.Type = TermBool
		default:
			return nil, fieldErr(f.Name(), "an index needs a string, enum, number or boolean field (or an array of those), not %s", t.Type())
		}
		if ix.Kind == IndexText && t.Type() != avro.String {
			return nil, fieldErr(f.Name(), `a "text" index needs a string field (or an array of strings), not %s`, t.Type())
		}
		if err := noNestedIndex(f.Type(), f.Name()); err != nil {
			return nil, err
		}
		out = append(out, ix)
	}
	return out, nil
}

// nonNull is s without the null branch of a nullable union.
func nonNull(s avro.Schema) avro.Schema {
	s = deref(s)
	if u, ok := s.(*avro.UnionSchema); ok {
		if _, v, ok := nullableBranch(u); ok {
			return deref(u.Types()[v])
		}
	}
	return s
}

// noNestedIndex refuses an "index" annotation below the top level (the
// fields inside a top-level field's type).
func noNestedIndex(s avro.Schema, path string) error {
	return eachField(s, path, func(f *avro.Field, p string) error {
		if f.Prop("index") != nil {
			return fieldErr(p, "only top-level fields can be indexed")
		}
		return nil
	})
}

// Index returns the index on field of this version, or nil.
func (v *Version) Index(field string) *Index {
	for i := range v.Indexes {
		if v.Indexes[i].Field == field {
			return &v.Indexes[i]
		}
	}
	return nil
}

// IndexState says whether a query may use the index on field: the latest
// version must index it, and every version must have indexed it the
// same way, because a document is indexed as the version it was written
// with says. A field indexed only from some version on has documents
// written before that are not in the index (building them in is not done
// yet): building is true. A field the latest version does not index is an
// error naming it.
func (t *Table) IndexState(field string) (ix *Index, building bool, err error) {
	ix, remaining, err := t.IndexStateFor(field, nil)
	return ix, remaining > 0, err
}

// IndexStateFor is IndexState for a partition that holds counts[v]
// documents of each version v (nil: every version may have documents):
// remaining is how many documents are not in the field's index — those
// written with a version that does not index it the latest's way.
func (t *Table) IndexStateFor(field string, counts map[int]uint64) (ix *Index, remaining uint64, err error) {
	ix = t.Latest().Index(field)
	if ix == nil {
		return nil, 0, fieldErr(field, "field %s of table %s is not indexed (annotate it with \"index\": \"attribute\" or \"text\")", field, t.Name)
	}
	for _, v := range t.Versions {
		if o := v.Index(field); o == nil || *o != *ix {
			if counts == nil {
				remaining++
			} else {
				remaining += counts[v.Number]
			}
		}
	}
	return ix, remaining, nil
}

// IndexedFields returns the fields version v indexes, in field order.
func (v *Version) IndexedFields() []string {
	out := make([]string, len(v.Indexes))
	for i, ix := range v.Indexes {
		out[i] = ix.Field
	}
	return out
}

func (ix Index) String() string {
	a := ""
	if ix.Array {
		a = "[]"
	}
	return fmt.Sprintf("%s:%s%s(%s)", ix.Field, ix.Type, a, ix.Kind)
}

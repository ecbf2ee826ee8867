package schema

import (
	"fmt"
	"hash/crc32"
	"slices"
	"strconv"
	"strings"

	"github.com/hamba/avro/v2"
)

// Project builds the reader schema that keeps only the fields named by dot
// paths, in the schema's own field order (so a plan can stream them).
//
// Path rules:
//   - a segment names a record field; "a.b" keeps field b of record a;
//   - maps and arrays are transparent: "positions.title" keeps field title
//     of every value of map (or item of array) positions;
//   - unions are transparent: a segment applies to every record branch that
//     has the field, and the other branches (null, primitives) stay;
//   - a path naming a non-record, or a field no branch has, is an error;
//   - a named record projected differently at two places keeps the union of
//     the fields asked for anywhere (a named type has one definition), and a
//     record kept whole anywhere is whole everywhere.
func Project(s avro.Schema, paths []string) (avro.Schema, error) {
	if len(paths) == 0 {
		return s, nil
	}
	root := &pathTree{}
	for _, p := range paths {
		if p == "" {
			return nil, &FieldError{Reason: "empty projection path"}
		}
		root.add(strings.Split(p, "."))
	}
	pr := projector{keep: map[string]map[string]bool{}, whole: map[string]bool{}, built: map[string]avro.Schema{}}
	if err := pr.mark(s, root, ""); err != nil {
		return nil, err
	}
	return pr.build(s)
}

// pathTree is the set of requested paths as a tree; a leaf keeps the whole
// field.
type pathTree struct {
	children map[string]*pathTree
	order    []string
}

func (t *pathTree) add(segs []string) {
	if len(segs) == 0 {
		t.children, t.order = nil, nil
		return
	}
	if t.children == nil {
		if t.order != nil {
			return // an ancestor already keeps the whole field
		}
		t.children = map[string]*pathTree{}
	}
	c, ok := t.children[segs[0]]
	if !ok {
		c = &pathTree{}
		t.children[segs[0]] = c
		t.order = append(t.order, segs[0])
		c.add(segs[1:])
		return
	}
	if c.children == nil && len(c.order) == 0 {
		return // already whole
	}
	c.add(segs[1:])
}

func (t *pathTree) leaf() bool { return len(t.children) == 0 }

type projector struct {
	keep  map[string]map[string]bool // record full name → fields kept
	whole map[string]bool            // records kept with every field
	built map[string]avro.Schema
}

// mark records which fields of which records the tree keeps. It reports
// whether anything in s matched.
func (p *projector) mark(s avro.Schema, t *pathTree, path string) error {
	matched, err := p.markAny(s, t, path)
	if err != nil {
		return err
	}
	if !matched {
		return fieldErr(path, "projection path names no field")
	}
	return nil
}

func (p *projector) markAny(s avro.Schema, t *pathTree, path string) (bool, error) {
	s = deref(s)
	switch s := s.(type) {
	case *avro.RecordSchema:
		if p.keep[s.FullName()] == nil {
			p.keep[s.FullName()] = map[string]bool{}
		}
		for _, name := range t.order {
			idx := slices.IndexFunc(s.Fields(), func(f *avro.Field) bool { return f.Name() == name })
			if idx < 0 {
				return false, fieldErr(join(path, name), "no such field in record %s", s.Name())
			}
			f := s.Fields()[idx]
			p.keep[s.FullName()][name] = true
			child := t.children[name]
			if child.leaf() {
				p.markWhole(f.Type())
				continue
			}
			if err := p.mark(f.Type(), child, join(path, name)); err != nil {
				return false, err
			}
		}
		return true, nil
	case *avro.MapSchema:
		return p.markAny(s.Values(), t, path)
	case *avro.ArraySchema:
		return p.markAny(s.Items(), t, path)
	case *avro.UnionSchema:
		any := false
		var firstErr error
		for _, b := range s.Types() {
			if _, isRec := deref(b).(*avro.RecordSchema); !isRec && !isContainer(b) {
				continue
			}
			ok, err := p.markAny(b, t, path)
			if err != nil && firstErr == nil {
				firstErr = err
			}
			any = any || (ok && err == nil)
		}
		if !any && firstErr != nil {
			return false, firstErr
		}
		return any, nil
	}
	return false, fieldErr(join(path, t.order[0]), "%s has no fields", s.Type())
}

func isContainer(s avro.Schema) bool {
	t := deref(s).Type()
	return t == avro.Map || t == avro.Array
}

// markWhole marks every record reachable from s as kept whole.
func (p *projector) markWhole(s avro.Schema) {
	s = deref(s)
	switch s := s.(type) {
	case *avro.RecordSchema:
		if p.whole[s.FullName()] {
			return
		}
		p.whole[s.FullName()] = true
		for _, f := range s.Fields() {
			p.markWhole(f.Type())
		}
	case *avro.MapSchema:
		p.markWhole(s.Values())
	case *avro.ArraySchema:
		p.markWhole(s.Items())
	case *avro.UnionSchema:
		for _, b := range s.Types() {
			p.markWhole(b)
		}
	}
}

func (p *projector) build(s avro.Schema) (avro.Schema, error) {
	s = deref(s)
	switch s := s.(type) {
	case *avro.RecordSchema:
		if b, ok := p.built[s.FullName()]; ok {
			if b == nil {
				return nil, &FieldError{Reason: fmt.Sprintf("projection through recursive record %s is not supported", s.FullName())}
			}
			return avro.NewRefSchema(b.(*avro.RecordSchema)), nil
		}
		if p.whole[s.FullName()] || p.keep[s.FullName()] == nil {
			p.built[s.FullName()] = s
			return s, nil
		}
		p.built[s.FullName()] = nil
		var fields []*avro.Field
		for _, f := range s.Fields() {
			if !p.keep[s.FullName()][f.Name()] {
				continue
			}
			typ, err := p.build(f.Type())
			if err != nil {
				return nil, err
			}
			opts := []avro.SchemaOption{avro.WithAliases(f.Aliases())}
			if f.HasDefault() {
				opts = append(opts, avro.WithDefault(pruneDefault(f.Type(), typ, f.Default())))
			}
			nf, err := avro.NewField(f.Name(), typ, opts...)
			if err != nil {
				return nil, fmt.Errorf("projected field %s: %w", f.Name(), err)
			}
			fields = append(fields, nf)
		}
		rec, err := avro.NewRecordSchema(s.Name(), s.Namespace(), fields, avro.WithAliases(s.Aliases()))
		if err != nil {
			return nil, fmt.Errorf("projected record %s: %w", s.FullName(), err)
		}
		p.built[s.FullName()] = rec
		return rec, nil
	case *avro.MapSchema:
		v, err := p.build(s.Values())
		if err != nil {
			return nil, err
		}
		return avro.NewMapSchema(v), nil
	case *avro.ArraySchema:
		v, err := p.build(s.Items())
		if err != nil {
			return nil, err
		}
		return avro.NewArraySchema(v), nil
	case *avro.UnionSchema:
		types := make([]avro.Schema, len(s.Types()))
		for i, b := range s.Types() {
			t, err := p.build(b)
			if err != nil {
				return nil, err
			}
			types[i] = t
		}
		return avro.NewUnionSchema(types)
	case avro.NamedSchema:
		// Enums and fixed are defined once too.
		if b, ok := p.built[s.FullName()]; ok && b != nil {
			return refTo(b), nil
		}
		p.built[s.FullName()] = s
		return s, nil
	}
	return s, nil
}

func refTo(s avro.Schema) avro.Schema {
	if n, ok := s.(avro.NamedSchema); ok {
		return avro.NewRefSchema(n)
	}
	return s
}

// pruneDefault drops from a record default the fields the projection
// removed, so the default stays valid for the projected type.
func pruneDefault(orig, projected avro.Schema, v any) any {
	orig, projected = deref(orig), deref(projected)
	switch pr := projected.(type) {
	case *avro.RecordSchema:
		m, ok := v.(map[string]any)
		if !ok {
			return v
		}
		or := orig.(*avro.RecordSchema)
		out := map[string]any{}
		for _, f := range pr.Fields() {
			if fv, ok := m[f.Name()]; ok {
				for _, of := range or.Fields() {
					if of.Name() == f.Name() {
						out[f.Name()] = pruneDefault(of.Type(), f.Type(), fv)
					}
				}
			}
		}
		return out
	case *avro.UnionSchema:
		// A union's default belongs to its first branch.
		return pruneDefault(orig.(*avro.UnionSchema).Types()[0], pr.Types()[0], v)
	case *avro.ArraySchema:
		arr, ok := v.([]any)
		if !ok {
			return v
		}
		out := make([]any, len(arr))
		for i := range arr {
			out[i] = pruneDefault(orig.(*avro.ArraySchema).Items(), pr.Items(), arr[i])
		}
		return out
	case *avro.MapSchema:
		m, ok := v.(map[string]any)
		if !ok {
			return v
		}
		out := map[string]any{}
		for k := range m {
			out[k] = pruneDefault(orig.(*avro.MapSchema).Values(), pr.Values(), m[k])
		}
		return out
	}
	return v
}

// ProjectionSuffix names a projection in its representation's ETag: "+f"
// and the CRC-32 of the comma-joined field list ("" without a projection).
// A projected read's ETag is the document's with this suffix inside the
// quotes (WithSuffix), on the server and in clients that project locally.
func ProjectionSuffix(fields []string) string {
	if len(fields) == 0 {
		return ""
	}
	return fmt.Sprintf("+f%08x", crc32.ChecksumIEEE([]byte(strings.Join(fields, ","))))
}

// VersionSuffix names, in a representation's ETag, the schema version
// read a document written at version written is read at: "+v" and the
// version, or "" when the two are the same or read is 0 (as written).
// Such a representation holds what the later version adds or drops, so
// it must not share the stored document's ETag: a cache revalidating
// what it read before a version was registered would be told 304 and
// keep the old shape. It comes before a projection's suffix.
func VersionSuffix(written, read int) string {
	if read == 0 || read == written {
		return ""
	}
	return "+v" + strconv.Itoa(read)
}

// WithSuffix adds a version's or a projection's suffix inside a
// document's quoted ETag.
func WithSuffix(etag, suffix string) string {
	if suffix == "" || len(etag) < 2 {
		return etag
	}
	return etag[:len(etag)-1] + suffix + `"`
}

package schema

import "github.com/hamba/avro/v2"

// sameTypes decides which writer subtrees a plan may copy unchanged.
//
// Two subtrees with equal canonical text can still differ: canonical text
// names a type already defined elsewhere instead of repeating it, so
// ["null","Node"] reads the same on both sides even when the reader's Node
// gained a field. A subtree is unchanged only if its text is equal and every
// named type it mentions is defined identically on both sides, where
// "identically" is itself transitive over the types a definition mentions.
type sameTypes struct {
	changed map[string]bool // full names defined differently (or on one side)
}

func newSameTypes(writer, reader avro.Schema) *sameTypes {
	wDefs, rDefs := namedDefs(writer), namedDefs(reader)
	st := &sameTypes{changed: map[string]bool{}}
	for name, w := range wDefs {
		if r, ok := rDefs[name]; !ok || r.String() != w.String() {
			st.changed[name] = true
		}
	}
	for name := range rDefs {
		if _, ok := wDefs[name]; !ok {
			st.changed[name] = true
		}
	}
	// Propagate: a definition mentioning a changed type is changed.
	for grew := true; grew; {
		grew = false
		for name, w := range wDefs {
			if st.changed[name] {
				continue
			}
			for _, n := range mentions(w) {
				if st.changed[n] {
					st.changed[name], grew = true, true
					break
				}
			}
		}
	}
	return st
}

// same reports whether writer subtree w may be copied as reader subtree r.
func (st *sameTypes) same(w, r avro.Schema) bool {
	if w.String() != r.String() {
		return false
	}
	for _, n := range mentions(w) {
		if st.changed[n] {
			return false
		}
	}
	return true
}

// namedDefs maps the full name of every named type defined in s to its
// definition.
func namedDefs(s avro.Schema) map[string]avro.Schema {
	defs := map[string]avro.Schema{}
	walkNamed(s, func(n avro.NamedSchema, ref bool) {
		if !ref {
			defs[n.FullName()] = n
		}
	})
	return defs
}

// mentions lists the full names of the named types that s defines or
// refers to, without following references.
func mentions(s avro.Schema) []string {
	var out []string
	seen := map[string]bool{}
	walkNamed(s, func(n avro.NamedSchema, _ bool) {
		if !seen[n.FullName()] {
			seen[n.FullName()] = true
			out = append(out, n.FullName())
		}
	})
	return out
}

// walkNamed calls visit for every named type s defines (ref false) or
// refers to (ref true), visiting each record's fields once and never
// following a reference.
func walkNamed(s avro.Schema, visit func(n avro.NamedSchema, ref bool)) {
	records := map[string]bool{}
	var walk func(avro.Schema)
	walk = func(s avro.Schema) {
		switch s := s.(type) {
		case *avro.RefSchema:
			visit(s.Schema(), true)
		case *avro.RecordSchema:
			if records[s.FullName()] {
				return
			}
			records[s.FullName()] = true
			visit(s, false)
			for _, f := range s.Fields() {
				walk(f.Type())
			}
		case avro.NamedSchema: // enum, fixed
			visit(s, false)
		case *avro.ArraySchema:
			walk(s.Items())
		case *avro.MapSchema:
			walk(s.Values())
		case *avro.UnionSchema:
			for _, b := range s.Types() {
				walk(b)
			}
		}
	}
	walk(s)
}

package schema

import (
	"fmt"

	"github.com/hamba/avro/v2"
)

// Parse parses Avro schema text. Each call uses its own name cache: hamba's
// global cache would let version 2 of a record silently replace version 1.
func Parse(text string) (avro.Schema, error) {
	s, err := avro.ParseWithCache(text, "", &avro.SchemaCache{})
	if err != nil {
		return nil, fmt.Errorf("parse avro schema: %w", err)
	}
	return s, nil
}

// deref follows named-type references.
func deref(s avro.Schema) avro.Schema {
	for {
		r, ok := s.(*avro.RefSchema)
		if !ok {
			return s
		}
		s = r.Schema()
	}
}

// nullableBranch reports whether u is a union of null and exactly one other
// type, and returns the index of the null branch and of the other branch.
func nullableBranch(u *avro.UnionSchema) (nullIdx, valIdx int, ok bool) {
	types := u.Types()
	if len(types) != 2 {
		return 0, 0, false
	}
	if types[0].Type() == avro.Null && types[1].Type() != avro.Null {
		return 0, 1, true
	}
	if types[1].Type() == avro.Null && types[0].Type() != avro.Null {
		return 1, 0, true
	}
	return 0, 0, false
}

// branchName is the name that identifies a union branch in JSON: the full
// name of a named type, else the type name.
func branchName(s avro.Schema) string {
	s = deref(s)
	if n, ok := s.(avro.NamedSchema); ok {
		return n.FullName()
	}
	return string(s.Type())
}

package schema

import (
	"fmt"

	"github.com/hamba/avro/v2"
)

// Parse parses Avro schema text. Each call uses its own name cache: hamba's
// global cache would let version 2 of a record silently replace version 1.
//
// Schemas are bounded before they are parsed: their JSON nests at most
// 4 × MaxDepth() deep (an Avro type is two or three JSON levels), and a fixed
// type is at most MaxFixedBytes, so no schema walk or document is
// unbounded.
func Parse(text string) (avro.Schema, error) {
	if d, limit := jsonDepth(text), 4*MaxDepth(); d > limit {
		return nil, fmt.Errorf("parse avro schema: its JSON nests %d deep, over the limit of %d", d, limit)
	}
	s, err := avro.ParseWithCache(text, "", &avro.SchemaCache{})
	if err != nil {
		return nil, fmt.Errorf("parse avro schema: %w", err)
	}
	var big *avro.FixedSchema
	walkNamed(s, func(n avro.NamedSchema, _ bool) {
		if f, ok := n.(*avro.FixedSchema); ok && f.Size() > MaxFixedBytes {
			big = f
		}
	})
	if big != nil {
		return nil, fmt.Errorf("parse avro schema: fixed %s of %d bytes is over the limit of %d", big.FullName(), big.Size(), MaxFixedBytes)
	}
	return s, nil
}

// MaxFixedBytes bounds a fixed type's size: every document holds one
// whole, and request bodies are bounded too.
const MaxFixedBytes = 1 << 20

// jsonDepth returns how deeply the JSON text nests objects and arrays (it
// does not check that the text is JSON).
func jsonDepth(text string) int {
	depth, deepest, inString := 0, 0, false
	for i := 0; i < len(text); i++ {
		c := text[i]
		switch {
		case inString:
			if c == '\\' {
				i++
			} else if c == '"' {
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			depth++
			deepest = max(deepest, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return deepest
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

package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/hamba/avro/v2"
)

// checkRawDefaults validates every field default in a schema's text
// against the field's type, as Avro's specification defines the JSON of
// defaults (a union's default is of its first branch; bytes and fixed are
// strings of code points 0–255). It reads the text itself: hamba converts
// defaults to Go types while parsing, so an int default of 99999999999
// would already be truncated to 1215752191 in the parsed schema.
func checkRawDefaults(text string, s avro.Schema) error {
	dec := json.NewDecoder(bytes.NewReader([]byte(text)))
	dec.UseNumber()
	var raw any
	if err := dec.Decode(&raw); err != nil {
		return err
	}
	return walkRawType(raw, s, "")
}

// walkRawType walks a schema's JSON (raw) alongside its parsed form (s),
// checking the defaults of the records defined inline.
func walkRawType(raw any, s avro.Schema, path string) error {
	switch r := raw.(type) {
	case []any: // a union
		u, ok := s.(*avro.UnionSchema)
		if !ok || len(u.Types()) != len(r) {
			return nil
		}
		for i, b := range r {
			if err := walkRawType(b, u.Types()[i], path); err != nil {
				return err
			}
		}
	case map[string]any:
		switch s := s.(type) {
		case *avro.RecordSchema:
			fields, _ := r["fields"].([]any)
			if len(fields) != len(s.Fields()) {
				return nil
			}
			for i, f := range s.Fields() {
				rf, _ := fields[i].(map[string]any)
				p := join(path, f.Name())
				if def, ok := rf["default"]; ok {
					if err := checkDefault(def, f.Type(), p, 0); err != nil {
						return err
					}
				}
				if err := walkRawType(rf["type"], f.Type(), p); err != nil {
					return err
				}
			}
		case *avro.ArraySchema:
			return walkRawType(r["items"], s.Items(), path)
		case *avro.MapSchema:
			return walkRawType(r["values"], s.Values(), path)
		}
	}
	return nil
}

// checkDefault checks one default value v against type s.
func checkDefault(v any, s avro.Schema, path string, depth int) error {
	if depth > MaxDepth() {
		return tooDeep(path)
	}
	bad := func(format string, args ...any) error {
		return fieldErr(path, "default %s does not fit the field's type: %s", shortJSON(v), fmt.Sprintf(format, args...))
	}
	s = deref(s)
	switch s := s.(type) {
	case *avro.UnionSchema:
		return checkDefault(v, s.Types()[0], path, depth+1) // the first branch's
	case *avro.RecordSchema:
		obj, ok := v.(map[string]any)
		if !ok {
			return bad("a record %s needs an object", s.Name())
		}
		for _, f := range s.Fields() {
			fv, ok := obj[f.Name()]
			if !ok {
				if !f.HasDefault() {
					return bad("field %s is missing and has no default", f.Name())
				}
				continue
			}
			if err := checkDefault(fv, f.Type(), join(path, f.Name()), depth+1); err != nil {
				return err
			}
		}
		return nil
	case *avro.ArraySchema:
		arr, ok := v.([]any)
		if !ok {
			return bad("an array needs a JSON array")
		}
		for i, item := range arr {
			if err := checkDefault(item, s.Items(), path+"["+strconv.Itoa(i)+"]", depth+1); err != nil {
				return err
			}
		}
		return nil
	case *avro.MapSchema:
		obj, ok := v.(map[string]any)
		if !ok {
			return bad("a map needs an object")
		}
		for k, item := range obj {
			if err := checkDefault(item, s.Values(), join(path, k), depth+1); err != nil {
				return err
			}
		}
		return nil
	case *avro.EnumSchema:
		sym, ok := v.(string)
		if !ok || !slices.Contains(s.Symbols(), sym) {
			return bad("not a symbol of enum %s", s.Name())
		}
		return nil
	case *avro.FixedSchema:
		str, ok := v.(string)
		if !ok || !latin1(str) || len([]rune(str)) != s.Size() {
			return bad("fixed %s needs a string of %d code points 0–255", s.Name(), s.Size())
		}
		return nil
	}
	switch s.Type() {
	case avro.Null:
		if v != nil {
			return bad("null needs null")
		}
	case avro.Boolean:
		if _, ok := v.(bool); !ok {
			return bad("boolean needs true or false")
		}
	case avro.Int, avro.Long:
		n, ok := v.(json.Number)
		if !ok {
			return bad("%s needs an integer", s.Type())
		}
		i, err := strconv.ParseInt(string(n), 10, 64)
		if err != nil || s.Type() == avro.Int && (i < math.MinInt32 || i > math.MaxInt32) {
			return bad("out of range for %s", s.Type())
		}
	case avro.Float, avro.Double:
		n, ok := v.(json.Number)
		if !ok {
			return bad("%s needs a number", s.Type())
		}
		f, err := strconv.ParseFloat(string(n), 64)
		if err != nil || !fits(f, s.Type() == avro.Float, string(n)) {
			return bad("out of range for %s", s.Type())
		}
	case avro.String:
		if _, ok := v.(string); !ok {
			return bad("string needs a string")
		}
	case avro.Bytes:
		str, ok := v.(string)
		if !ok || !latin1(str) {
			return bad("bytes needs a string of code points 0–255")
		}
	}
	return nil
}

func latin1(s string) bool {
	for _, r := range s {
		if r > 0xFF {
			return false
		}
	}
	return true
}

// shortJSON renders v for an error message, cut to a few dozen bytes.
func shortJSON(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 40 {
		return string(b[:37]) + "..."
	}
	return string(b)
}

// checkFinite refuses a schema with a record type that has no finite
// instance (every way to build it needs another of itself, as in
// A {a: A}): no document could ever be written with it.
func checkFinite(s avro.Schema) error {
	var records []*avro.RecordSchema
	walkNamed(s, func(n avro.NamedSchema, ref bool) {
		if r, ok := n.(*avro.RecordSchema); ok && !ref {
			records = append(records, r)
		}
	})
	finite := map[string]bool{}
	var fin func(s avro.Schema) bool
	fin = func(s avro.Schema) bool {
		switch s := deref(s).(type) {
		case *avro.RecordSchema:
			return finite[s.FullName()]
		case *avro.UnionSchema:
			return slices.ContainsFunc(s.Types(), fin)
		}
		return true // primitives, enums, fixed; arrays and maps may be empty
	}
	for grew := true; grew; {
		grew = false
		for _, r := range records {
			if !finite[r.FullName()] && !slices.ContainsFunc(r.Fields(), func(f *avro.Field) bool { return !fin(f.Type()) }) {
				finite[r.FullName()], grew = true, true
			}
		}
	}
	for _, r := range records {
		if !finite[r.FullName()] {
			return fmt.Errorf("record %s has no finite instance: every value of it must contain another (make a recursive field nullable, or an array or map)", r.FullName())
		}
	}
	return nil
}

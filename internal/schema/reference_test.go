package schema

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"reflect"

	"github.com/hamba/avro/v2"
)

// referenceConfig is hamba with allocation limits, so random bytes
// claiming a huge array cannot exhaust memory.
var referenceConfig = avro.Config{MaxByteSliceSize: 1 << 20, MaxSliceAllocSize: 1 << 20}

// referenceAPI is a fresh hamba API for each reference decoding: one API
// caches a decoder by the schema's fingerprint, and a resolved schema has
// its reader's fingerprint whatever the writer, so a fuzzer's earlier
// pair with the same reader and another writer left a decoder that read
// this pair's bytes as that writer's (FuzzPlan found it: a double read
// as null).
func referenceAPI() avro.API { return referenceConfig.Freeze() }

// referenceJSON decodes b with hamba/avro (resolving writer to reader, or
// reading as reader when writer is nil) and returns the datum in Cortado's
// JSON form (see JSONWriter), as a generic JSON value. It is the reference
// the plans and the JSON writer are checked against.
func referenceJSON(writer, reader avro.Schema, b []byte) (any, error) {
	s := reader
	if writer != nil {
		r, err := avro.NewSchemaCompatibility().Resolve(reader, writer)
		if err != nil {
			return nil, err
		}
		s = r
	}
	var v any
	if err := referenceAPI().Unmarshal(s, b, &v); err != nil {
		return nil, err
	}
	n, err := normalize(reader, v)
	if err != nil {
		return nil, err
	}
	// Round-trip through encoding/json so numbers compare as float64.
	js, err := json.Marshal(n)
	if err != nil {
		return nil, err
	}
	var out any
	return out, json.Unmarshal(js, &out)
}

// normalize turns hamba's generic value of schema s into Cortado's JSON form.
func normalize(s avro.Schema, v any) (any, error) {
	s = deref(s)
	switch s := s.(type) {
	case *avro.RecordSchema:
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("record %s: hamba gave %T", s.Name(), v)
		}
		out := map[string]any{}
		for _, f := range s.Fields() {
			n, err := normalize(f.Type(), m[f.Name()])
			if err != nil {
				return nil, err
			}
			out[f.Name()] = n
		}
		return out, nil
	case *avro.MapSchema:
		m, _ := v.(map[string]any)
		out := map[string]any{}
		for k, e := range m {
			n, err := normalize(s.Values(), e)
			if err != nil {
				return nil, err
			}
			out[k] = n
		}
		return out, nil
	case *avro.ArraySchema:
		arr, _ := v.([]any)
		out := []any{}
		for _, e := range arr {
			n, err := normalize(s.Items(), e)
			if err != nil {
				return nil, err
			}
			out = append(out, n)
		}
		return out, nil
	case *avro.UnionSchema:
		if v == nil {
			return nil, nil
		}
		i, inner := hambaBranch(s, v)
		if i < 0 {
			return nil, fmt.Errorf("union: cannot tell the branch of %T", v)
		}
		n, err := normalize(s.Types()[i], inner)
		if err != nil {
			return nil, err
		}
		if _, _, nullable := nullableBranch(s); nullable {
			return n, nil
		}
		return map[string]any{branchName(s.Types()[i]): n}, nil
	case *avro.FixedSchema:
		rv := reflect.ValueOf(v)
		b := make([]byte, rv.Len())
		reflect.Copy(reflect.ValueOf(b), rv)
		return base64.StdEncoding.EncodeToString(b), nil
	}
	if s.Type() == avro.Bytes && v == nil {
		return "", nil // hamba decodes empty bytes as nil
	}
	switch x := v.(type) {
	case []byte:
		return base64.StdEncoding.EncodeToString(x), nil
	case float32:
		if f := jsonFloat(float64(x)); f != float64(x) {
			return f, nil
		}
		return x, nil // encoding/json formats a float32 with 32 bits
	case float64:
		return jsonFloat(x), nil
	}
	return v, nil
}

func jsonFloat(f float64) any {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	return f
}

// hambaBranch finds which branch of u hamba decoded v from: named types
// (and, after resolution, primitives) come wrapped in a one-key map, other
// values unwrapped.
func hambaBranch(u *avro.UnionSchema, v any) (int, any) {
	if m, ok := v.(map[string]any); ok && len(m) == 1 {
		for k, inner := range m {
			for i, t := range u.Types() {
				if n, ok := deref(t).(avro.NamedSchema); ok && (n.Name() == k || n.FullName() == k) {
					return i, inner
				}
				if branchName(t) == k && deref(t).Type() != avro.Record {
					// hamba wraps every branch but null in a one-key
					// map, maps and arrays included: {"map": {}} is
					// an empty map of the map branch (FuzzPlan found
					// one read as a map holding the key "map").
					return i, inner
				}
			}
		}
	}
	want := map[string]avro.Type{"int": avro.Int, "int64": avro.Long, "float32": avro.Float, "float64": avro.Double,
		"string": avro.String, "[]uint8": avro.Bytes, "bool": avro.Boolean, "[]interface {}": avro.Array, "map[string]interface {}": avro.Map}[fmt.Sprintf("%T", v)]
	for i, t := range u.Types() {
		tt := deref(t).Type()
		if tt == want || (want == avro.String && tt == avro.Enum) || (tt == avro.Fixed && reflect.TypeOf(v).Kind() == reflect.Array) {
			return i, v
		}
	}
	return -1, nil
}

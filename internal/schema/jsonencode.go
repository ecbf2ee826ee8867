package schema

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/hamba/avro/v2"
)

// DecodeJSON parses a JSON document keeping numbers exact (json.Number).
// It is strict where encoding/json is lenient, so that what is stored is
// exactly what was sent: invalid UTF-8 (raw, or a lone surrogate escape)
// and an object naming a key twice are errors, not U+FFFD and last-wins;
// and objects and arrays may nest at most MaxDepth deep.
//
// Strings in the result without escapes share data's memory (a 1 KB
// string is not copied before it is encoded): data must not change while
// the result is in use.
func DecodeJSON(data []byte) (any, error) {
	if !utf8.Valid(data) {
		return nil, &FieldError{Reason: "malformed JSON: invalid UTF-8"}
	}
	if i := loneSurrogate(data); i >= 0 {
		return nil, &FieldError{Reason: fmt.Sprintf("malformed JSON: a \\u escape at byte %d is half a surrogate pair (not a character)", i)}
	}
	p := jsonParser{b: data}
	p.ws()
	v, err := p.value("", 0)
	if err != nil {
		return nil, err
	}
	p.ws()
	if p.i != len(data) {
		return nil, &FieldError{Reason: "malformed JSON: trailing data after the document"}
	}
	return v, nil
}

// loneSurrogate returns the offset of a \u escape that is half of a UTF-16
// surrogate pair without its other half, or -1. (encoding/json would turn
// it into U+FFFD, storing something other than what was sent.)
func loneSurrogate(data []byte) int {
	hex := func(i int) (rune, bool) {
		if i+6 > len(data) || data[i] != '\\' || data[i+1] != 'u' {
			return 0, false
		}
		v, err := strconv.ParseUint(string(data[i+2:i+6]), 16, 16)
		return rune(v), err == nil
	}
	for i := 0; i < len(data); i++ {
		j := bytes.IndexByte(data[i:], '\\')
		if j < 0 {
			return -1
		}
		i += j
		r, ok := hex(i)
		if !ok {
			i++ // some other escape: skip its second byte
			continue
		}
		switch {
		case r >= 0xD800 && r < 0xDC00:
			if lo, ok := hex(i + 6); !ok || lo < 0xDC00 || lo > 0xDFFF {
				return i
			}
			i += 11
		case r >= 0xDC00 && r <= 0xDFFF:
			return i
		default:
			i += 5
		}
	}
	return -1
}

// EncodeJSON validates a JSON value (as produced by DecodeJSON) against s and
// appends its Avro binary encoding to dst. A wrong type, a missing required
// field or an unknown field yields a *FieldError naming the field; see
// JSONWriter for the JSON form.
func EncodeJSON(dst []byte, s avro.Schema, v any) ([]byte, error) {
	return encodeValue(dst, s, v, "", 0)
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number, float64, int, int64:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

// encodeValue encodes v as s; depth counts the records, arrays and maps
// around it.
func encodeValue(dst []byte, s avro.Schema, v any, path string, depth int) ([]byte, error) {
	s = deref(s)
	switch s.(type) {
	case *avro.RecordSchema, *avro.ArraySchema, *avro.MapSchema:
		if depth >= MaxDepth() {
			return dst, tooDeep(path)
		}
	}
	switch s := s.(type) {
	case *avro.RecordSchema:
		obj, ok := v.(map[string]any)
		if !ok {
			return dst, fieldErr(path, "expected an object (record %s), got %s", s.Name(), typeName(v))
		}
		for name := range obj {
			if !slices.ContainsFunc(s.Fields(), func(f *avro.Field) bool { return f.Name() == name }) {
				return dst, fieldErr(join(path, name), "unknown field (not in record %s)", s.Name())
			}
		}
		for _, f := range s.Fields() {
			fv, present := obj[f.Name()]
			if !present {
				if !f.HasDefault() {
					return dst, fieldErr(join(path, f.Name()), "missing required field")
				}
				def, err := encodeDefault(f)
				if err != nil {
					return dst, fieldErr(join(path, f.Name()), "default: %v", err)
				}
				dst = append(dst, def...)
				continue
			}
			var err error
			if dst, err = encodeValue(dst, f.Type(), fv, join(path, f.Name()), depth+1); err != nil {
				return dst, err
			}
		}
		return dst, nil
	case *avro.ArraySchema:
		arr, ok := v.([]any)
		if !ok {
			return dst, fieldErr(path, "expected an array, got %s", typeName(v))
		}
		if len(arr) > 0 {
			dst = appendLong(dst, int64(len(arr)))
			start := len(dst)
			for i, item := range arr {
				var err error
				if dst, err = encodeValue(dst, s.Items(), item, path+"["+strconv.Itoa(i)+"]", depth+1); err != nil {
					return dst, err
				}
			}
			// What every decoder refuses (maxItems), said here in the
			// JSON the client sent.
			if int64(len(arr)) > maxItems(len(dst)-start) {
				return dst, fieldErr(path, "%d items that take %d bytes: an array holds at most 1,024 items of no bytes (nulls, records of no fields)", len(arr), len(dst)-start)
			}
		}
		return appendLong(dst, 0), nil
	case *avro.MapSchema:
		obj, ok := v.(map[string]any)
		if !ok {
			return dst, fieldErr(path, "expected an object (map), got %s", typeName(v))
		}
		if len(obj) > 0 {
			// Sorted keys make equal documents encode to equal bytes,
			// and so to equal CRCs.
			names := make([]string, 0, len(obj))
			for k := range obj {
				names = append(names, k)
			}
			slices.Sort(names)
			dst = appendLong(dst, int64(len(names)))
			for _, k := range names {
				dst = appendBytes(dst, []byte(k))
				var err error
				if dst, err = encodeValue(dst, s.Values(), obj[k], join(path, k), depth+1); err != nil {
					return dst, err
				}
			}
		}
		return appendLong(dst, 0), nil
	case *avro.UnionSchema:
		return encodeUnion(dst, s, v, path, depth)
	case *avro.EnumSchema:
		sym, ok := v.(string)
		if !ok {
			return dst, fieldErr(path, "expected an enum symbol string, got %s", typeName(v))
		}
		i := slices.Index(s.Symbols(), sym)
		if i < 0 {
			return dst, fieldErr(path, "%q is not a symbol of enum %s", sym, s.Name())
		}
		return appendLong(dst, int64(i)), nil
	case *avro.FixedSchema:
		b, err := decodeBase64(v, path)
		if err != nil {
			return dst, err
		}
		if len(b) != s.Size() {
			return dst, fieldErr(path, "fixed %s takes %d bytes, got %d", s.Name(), s.Size(), len(b))
		}
		return append(dst, b...), nil
	}
	return encodePrimitive(dst, s.Type(), v, path)
}

func encodeUnion(dst []byte, u *avro.UnionSchema, v any, path string, depth int) ([]byte, error) {
	types := u.Types()
	if nullIdx, valIdx, ok := nullableBranch(u); ok {
		if v == nil {
			return appendLong(dst, int64(nullIdx)), nil
		}
		return encodeValue(appendLong(dst, int64(valIdx)), types[valIdx], v, path, depth)
	}
	if v == nil {
		for i, t := range types {
			if t.Type() == avro.Null {
				return appendLong(dst, int64(i)), nil
			}
		}
		return dst, fieldErr(path, "null is not allowed by union %s", u.String())
	}
	obj, ok := v.(map[string]any)
	if ok && len(obj) == 1 {
		for name, inner := range obj {
			for i, t := range types {
				if branchName(t) == name || string(deref(t).Type()) == name {
					return encodeValue(appendLong(dst, int64(i)), t, inner, path, depth)
				}
			}
		}
	}
	names := make([]string, len(types))
	for i, t := range types {
		names[i] = branchName(t)
	}
	return dst, fieldErr(path, `a union value must be {"<branch>": value} with branch one of %v`, names)
}

func encodePrimitive(dst []byte, t avro.Type, v any, path string) ([]byte, error) {
	switch t {
	case avro.Null:
		if v != nil {
			return dst, fieldErr(path, "expected null, got %s", typeName(v))
		}
		return dst, nil
	case avro.Boolean:
		b, ok := v.(bool)
		if !ok {
			return dst, fieldErr(path, "expected a boolean, got %s", typeName(v))
		}
		if b {
			return append(dst, 1), nil
		}
		return append(dst, 0), nil
	case avro.Int, avro.Long:
		n, err := toInt(v)
		if err != nil {
			return dst, fieldErr(path, "expected an integer (%s), got %s", t, describe(v))
		}
		if t == avro.Int && (n < math.MinInt32 || n > math.MaxInt32) {
			return dst, fieldErr(path, "%d is out of range for int", n)
		}
		return appendLong(dst, n), nil
	case avro.Float, avro.Double:
		f, err := toFloat(v)
		// A JSON number that does not fit (1e39 as a float, 1e400) is an
		// error, not Infinity, and one too small for the type (1e-400,
		// 1e-46 as a float) is an error, not 0, as PostgreSQL's real and
		// double precision refuse them; the strings "Infinity" and "NaN"
		// say so on purpose.
		if n, number := v.(json.Number); number && (errors.Is(err, strconv.ErrRange) || err == nil && !fits(f, t == avro.Float, string(n))) {
			return dst, fieldErr(path, "%s is out of range for %s", describe(v), t)
		}
		if err != nil {
			return dst, fieldErr(path, "expected a number (%s), got %s", t, describe(v))
		}
		if t == avro.Float {
			return appendFloat(dst, float32(f)), nil
		}
		return appendDouble(dst, f), nil
	case avro.String:
		str, ok := v.(string)
		if !ok {
			return dst, fieldErr(path, "expected a string, got %s", typeName(v))
		}
		return appendBytes(dst, []byte(str)), nil
	case avro.Bytes:
		b, err := decodeBase64(v, path)
		if err != nil {
			return dst, err
		}
		return appendBytes(dst, b), nil
	}
	return dst, fieldErr(path, "unsupported type %s", t)
}

func describe(v any) string {
	if n, ok := v.(json.Number); ok {
		return "number " + n.String()
	}
	return typeName(v)
}

func toInt(v any) (int64, error) {
	switch n := v.(type) {
	case json.Number:
		return strconv.ParseInt(n.String(), 10, 64)
	case int64:
		return n, nil
	case int:
		return int64(n), nil
	case float64:
		if n == math.Trunc(n) && math.Abs(n) < 1<<53 {
			return int64(n), nil
		}
	}
	return 0, fmt.Errorf("not an integer")
}

// fits reports whether f, parsed from the JSON number text, is held by a
// float (single) or a double: not infinite, and not zero unless the text
// is (a value too small for the type underflows to zero).
func fits(f float64, single bool, text string) bool {
	if single {
		f = float64(float32(f))
	}
	if math.IsInf(f, 0) {
		return false
	}
	if f != 0 {
		return true
	}
	for _, c := range text {
		switch {
		case c == 'e' || c == 'E':
			return true
		case c >= '1' && c <= '9':
			return false
		}
	}
	return true
}

func toFloat(v any) (float64, error) {
	switch n := v.(type) {
	case json.Number:
		return strconv.ParseFloat(n.String(), 64)
	case float64:
		return n, nil
	case int64:
		return float64(n), nil
	case int:
		return float64(n), nil
	case string:
		switch n {
		case "NaN":
			return math.NaN(), nil
		case "Infinity":
			return math.Inf(1), nil
		case "-Infinity":
			return math.Inf(-1), nil
		}
	}
	return 0, fmt.Errorf("not a number")
}

func decodeBase64(v any, path string) ([]byte, error) {
	s, ok := v.(string)
	if !ok {
		return nil, fieldErr(path, "expected a base64 string, got %s", typeName(v))
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fieldErr(path, "invalid base64: %v", err)
	}
	return b, nil
}

// DecodeInto reads one JSON document into v as strictly as DecodeJSON
// reads it (valid UTF-8, no member named twice, bounded nesting, nothing
// after it), with no member v does not name and numbers as json.Number
// where v holds any: a request body or a line of the API's own formats.
// DecodeJSON's errors come back as they are; encoding/json's as a
// *FieldError saying "malformed <what>: …".
func DecodeInto(data []byte, v any, what string) error {
	if _, err := DecodeJSON(data); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &FieldError{Reason: "malformed " + what + ": " + err.Error()}
	}
	return nil
}

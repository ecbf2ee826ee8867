package schema

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/hamba/avro/v2"
)

// JSONWriter writes Avro binary of one schema as JSON, straight from the
// bytes. It is safe for concurrent use.
//
// The JSON form of a document (also what the JSON encoder accepts):
//   - record: object with the fields in schema order;
//   - map: object; array: array; enum: the symbol as a string;
//   - int, long: integer; float, double: number, or the strings "NaN",
//     "Infinity", "-Infinity";
//   - bytes, fixed: base64 (standard, padded) string;
//   - union of null and one type: null or the plain value;
//   - any other union: null, or {"<branch name>": value} where the branch
//     name is the full name of a named type or the primitive type name.
type JSONWriter struct {
	write jsonFn
}

type jsonFn func(d *decoder, dst []byte) ([]byte, error)

// NewJSONWriter compiles the JSON writer for schema s.
func NewJSONWriter(s avro.Schema) *JSONWriter {
	c := jsonCompiler{fns: map[avro.Schema]*jsonFn{}}
	return &JSONWriter{write: c.fn(s, "")}
}

// Append appends the JSON form of src to dst.
func (w *JSONWriter) Append(dst, src []byte) ([]byte, error) {
	d := getDecoder(src)
	defer putDecoder(d)
	out, err := w.write(d, dst)
	if err != nil {
		return dst, err
	}
	return out, nil
}

type jsonCompiler struct {
	fns map[avro.Schema]*jsonFn
}

func (c *jsonCompiler) fn(s avro.Schema, path string) jsonFn {
	s = deref(s)
	if p, ok := c.fns[s]; ok {
		return func(d *decoder, dst []byte) ([]byte, error) { return (*p)(d, dst) }
	}
	slot := new(jsonFn)
	c.fns[s] = slot
	*slot = c.build(s, path)
	return *slot
}

func (c *jsonCompiler) build(s avro.Schema, path string) jsonFn {
	switch s := s.(type) {
	case *avro.RecordSchema:
		type field struct {
			name []byte // `"name":` with the leading comma where needed
			fn   jsonFn
		}
		fields := make([]field, len(s.Fields()))
		for i, f := range s.Fields() {
			var name []byte
			if i > 0 {
				name = append(name, ',')
			}
			name = appendJSONString(name, f.Name())
			name = append(name, ':')
			fields[i] = field{name: name, fn: c.fn(f.Type(), join(path, f.Name()))}
		}
		return nest(path, func(d *decoder, dst []byte) ([]byte, error) {
			dst = append(dst, '{')
			var err error
			for i := range fields {
				dst = append(dst, fields[i].name...)
				if dst, err = fields[i].fn(d, dst); err != nil {
					return dst, err
				}
			}
			return append(dst, '}'), nil
		})
	case *avro.ArraySchema:
		return nest(path, jsonBlocks(c.fn(s.Items(), path), false, path))
	case *avro.MapSchema:
		return nest(path, jsonBlocks(c.fn(s.Values(), path), true, path))
	case *avro.UnionSchema:
		return c.union(s, path)
	case *avro.EnumSchema:
		syms := make([][]byte, len(s.Symbols()))
		for i, sym := range s.Symbols() {
			syms[i] = appendJSONString(nil, sym)
		}
		return func(d *decoder, dst []byte) ([]byte, error) {
			i, err := d.int()
			if err != nil {
				return dst, fieldErr(path, "%v", err)
			}
			if i < 0 || i >= int64(len(syms)) {
				return dst, fieldErr(path, "enum index %d out of range", i)
			}
			return append(dst, syms[i]...), nil
		}
	case *avro.FixedSchema:
		n := s.Size()
		return func(d *decoder, dst []byte) ([]byte, error) {
			b, err := d.fixed(n)
			if err != nil {
				return dst, fieldErr(path, "%v", err)
			}
			return appendBase64(dst, b), nil
		}
	}
	return primitiveJSON(s.Type(), path)
}

func primitiveJSON(t avro.Type, path string) jsonFn {
	switch t {
	case avro.Null:
		return func(_ *decoder, dst []byte) ([]byte, error) { return append(dst, "null"...), nil }
	case avro.Boolean:
		return func(d *decoder, dst []byte) ([]byte, error) {
			b, err := d.boolean()
			if err != nil {
				return dst, fieldErr(path, "%v", err)
			}
			if b {
				return append(dst, "true"...), nil
			}
			return append(dst, "false"...), nil
		}
	case avro.Int, avro.Long:
		read := readerOf(t)
		return func(d *decoder, dst []byte) ([]byte, error) {
			v, err := read(d)
			if err != nil {
				return dst, fieldErr(path, "%v", err)
			}
			return strconv.AppendInt(dst, v, 10), nil
		}
	case avro.Float:
		return func(d *decoder, dst []byte) ([]byte, error) {
			v, err := d.float()
			if err != nil {
				return dst, fieldErr(path, "%v", err)
			}
			return appendJSONFloat(dst, float64(v), 32), nil
		}
	case avro.Double:
		return func(d *decoder, dst []byte) ([]byte, error) {
			v, err := d.double()
			if err != nil {
				return dst, fieldErr(path, "%v", err)
			}
			return appendJSONFloat(dst, v, 64), nil
		}
	case avro.String:
		return func(d *decoder, dst []byte) ([]byte, error) {
			b, err := d.bytes()
			if err != nil {
				return dst, fieldErr(path, "%v", err)
			}
			if d.utf8 && !utf8.Valid(b) {
				return dst, fieldErr(path, "%v", errNotUTF8)
			}
			return appendJSONStringBytes(dst, b), nil
		}
	default: // bytes
		return func(d *decoder, dst []byte) ([]byte, error) {
			b, err := d.bytes()
			if err != nil {
				return dst, fieldErr(path, "%v", err)
			}
			return appendBase64(dst, b), nil
		}
	}
}

func (c *jsonCompiler) union(u *avro.UnionSchema, path string) jsonFn {
	types := u.Types()
	fns := make([]jsonFn, len(types))
	prefixes := make([][]byte, len(types))
	_, _, nullable := nullableBranch(u)
	for i, t := range types {
		fns[i] = c.fn(t, path)
		if !nullable && t.Type() != avro.Null {
			p := append([]byte{'{'}, appendJSONString(nil, branchName(t))...)
			prefixes[i] = append(p, ':')
		}
	}
	return func(d *decoder, dst []byte) ([]byte, error) {
		i, err := d.int()
		if err != nil {
			return dst, fieldErr(path, "%v", err)
		}
		if i < 0 || i >= int64(len(fns)) {
			return dst, fieldErr(path, "union branch %d out of range", i)
		}
		if prefixes[i] == nil {
			return fns[i](d, dst)
		}
		dst = append(dst, prefixes[i]...)
		if dst, err = fns[i](d, dst); err != nil {
			return dst, err
		}
		return append(dst, '}'), nil
	}
}

func jsonBlocks(item jsonFn, isMap bool, path string) jsonFn {
	open, closing := byte('['), byte(']')
	if isMap {
		open, closing = '{', '}'
	}
	return func(d *decoder, dst []byte) ([]byte, error) {
		dst = append(dst, open)
		first := true
		for {
			n, size, err := d.blockCount()
			if err != nil {
				return dst, fieldErr(path, "%v", err)
			}
			if n == 0 {
				return append(dst, closing), nil
			}
			start := d.i
			for ; n > 0; n-- {
				if !first {
					dst = append(dst, ',')
				}
				first = false
				if isMap {
					k, err := d.bytes()
					if err != nil {
						return dst, fieldErr(path, "%v", err)
					}
					if d.utf8 && !utf8.Valid(k) {
						return dst, fieldErr(path, "map key: %v", errNotUTF8)
					}
					dst = appendJSONStringBytes(dst, k)
					dst = append(dst, ':')
				}
				if dst, err = item(d, dst); err != nil {
					return dst, err
				}
			}
			if size > 0 && int64(d.i-start) != size {
				return dst, fieldErr(path, "%v", errBlockSize)
			}
		}
	}
}

func appendJSONFloat(dst []byte, f float64, bits int) []byte {
	switch {
	case math.IsNaN(f):
		return append(dst, `"NaN"`...)
	case math.IsInf(f, 1):
		return append(dst, `"Infinity"`...)
	case math.IsInf(f, -1):
		return append(dst, `"-Infinity"`...)
	}
	// Same format as encoding/json: shortest representation, exponent for
	// very large or small magnitudes.
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 && (bits == 64 && (abs < 1e-6 || abs >= 1e21) || bits == 32 && (float32(abs) < 1e-6 || float32(abs) >= 1e21)) {
		format = 'e'
	}
	dst = strconv.AppendFloat(dst, f, format, -1, bits)
	if format == 'e' {
		// Clean up e-09 to e-9, as encoding/json does.
		n := len(dst)
		if n >= 4 && dst[n-4] == 'e' && dst[n-3] == '-' && dst[n-2] == '0' {
			dst[n-2] = dst[n-1]
			dst = dst[:n-1]
		}
	}
	return dst
}

func appendBase64(dst, b []byte) []byte {
	dst = append(dst, '"')
	dst = base64.StdEncoding.AppendEncode(dst, b)
	return append(dst, '"')
}

func appendJSONString(dst []byte, s string) []byte {
	return appendJSONStringBytes(dst, []byte(s))
}

const hexDigits = "0123456789abcdef"

// plainByte marks the ASCII bytes JSON copies unchanged.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

const (
	swarOnes = 0x0101010101010101
	swarHigh = 0x8080808080808080
)

// plainWord reports whether all eight bytes of x are printable ASCII that
// JSON copies unchanged: no control byte, no '"', no '\\', no byte >= 0x80.
// (The zero-byte tests can flag a byte next to a real match, never miss
// one, which is all a yes/no answer needs.)
func plainWord(x uint64) bool { return badBytes(x)&swarHigh == 0 }

// plainPrefix returns how many leading bytes of s, in whole words, need no
// escaping: thirty-two bytes per step while it can, then sixteen, then
// eight.
func plainPrefix(s []byte) int {
	n := 0
	for len(s) >= 32 {
		w := s[:32]
		if (badBytes(binary.LittleEndian.Uint64(w[0:8]))|badBytes(binary.LittleEndian.Uint64(w[8:16]))|
			badBytes(binary.LittleEndian.Uint64(w[16:24]))|badBytes(binary.LittleEndian.Uint64(w[24:32])))&swarHigh != 0 {
			break
		}
		s, n = s[32:], n+32
	}
	for len(s) >= 16 {
		if (badBytes(binary.LittleEndian.Uint64(s[:8]))|badBytes(binary.LittleEndian.Uint64(s[8:16])))&swarHigh != 0 {
			break
		}
		s, n = s[16:], n+16
	}
	if len(s) >= 8 && plainWord(binary.LittleEndian.Uint64(s[:8])) {
		n += 8
	}
	return n
}

// badBytes has the high bit set in (at least) every byte of x that needs
// escaping; see plainWord.
func badBytes(x uint64) uint64 {
	quote := x ^ swarOnes*'"'
	slash := x ^ swarOnes*'\\'
	return x | (x-swarOnes*0x20)&^x | (quote-swarOnes)&^quote | (slash-swarOnes)&^slash
}

// appendJSONStringBytes escapes exactly as an encoding/json Encoder with
// SetEscapeHTML(false) does: '"', '\\' and control characters, U+2028 and
// U+2029, and invalid UTF-8 as U+FFFD. <, > and & stay as they are: API
// responses are read by programs and people, not pasted into HTML.
func appendJSONStringBytes(dst, s []byte) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		// Fast path: skip eight bytes at a time while none of them needs
		// attention (control, '"', '\\', '<', '>', '&', or non-ASCII).
		i += plainPrefix(s[i:])
		// A tail shorter than a word: check the string's last eight
		// bytes as one (overlapping) word instead of byte by byte.
		if rest := len(s) - i; rest > 0 && rest < 8 && len(s) >= 8 && plainWord(binary.LittleEndian.Uint64(s[len(s)-8:])) {
			i = len(s)
			break
		}
		if i >= len(s) {
			break
		}
		c := s[i]
		if plainByte[c] {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

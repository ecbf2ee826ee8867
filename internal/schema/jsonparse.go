package schema

import (
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// jsonParser reads one JSON value into the tree encoding/json's Decode
// into any (with UseNumber) would give: map[string]any, []any, string,
// json.Number, bool, nil. It is DecodeJSON's engine: one pass over the
// bytes, no token values boxed, strings without escapes not copied.
// Its input has been checked for UTF-8 and lone surrogate escapes.
type jsonParser struct {
	b []byte
	i int
}

func (p *jsonParser) fail(format string, args ...any) error {
	return &FieldError{Reason: "malformed JSON: " + fmt.Sprintf(format, args...)}
}

func (p *jsonParser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonParser) value(path string, depth int) (any, error) {
	if p.i >= len(p.b) {
		return nil, p.fail("unexpected end of input")
	}
	switch c := p.b[p.i]; {
	case c == '{' || c == '[':
		// A non-nullable union's {"branch": value} adds a JSON level to
		// each document level: deeper than twice the limit is never a
		// document (EncodeJSON checks the document's own depth).
		if depth >= 2*MaxDepth() {
			return nil, tooDeep(path)
		}
		if c == '{' {
			return p.object(path, depth)
		}
		return p.array(path, depth)
	case c == '"':
		return p.str()
	case c == 't':
		return true, p.literal("true")
	case c == 'f':
		return false, p.literal("false")
	case c == 'n':
		return nil, p.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	default:
		return nil, p.fail("invalid character %q at byte %d", c, p.i)
	}
}

func (p *jsonParser) literal(word string) error {
	if len(p.b)-p.i < len(word) || string(p.b[p.i:p.i+len(word)]) != word {
		return p.fail("invalid literal at byte %d", p.i)
	}
	p.i += len(word)
	return nil
}

func (p *jsonParser) object(path string, depth int) (any, error) {
	p.i++ // '{'
	obj := map[string]any{}
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
		return obj, nil
	}
	for {
		p.ws()
		if p.i >= len(p.b) || p.b[p.i] != '"' {
			return nil, p.fail("expected a key at byte %d", p.i)
		}
		k, err := p.str()
		if err != nil {
			return nil, err
		}
		p.ws()
		if p.i >= len(p.b) || p.b[p.i] != ':' {
			return nil, p.fail("expected ':' at byte %d", p.i)
		}
		p.i++
		p.ws()
		if _, dup := obj[k]; dup {
			return nil, fieldErr(join(path, k), "the object names this key twice")
		}
		v, err := p.value(join(path, k), depth+1)
		if err != nil {
			return nil, err
		}
		obj[k] = v
		p.ws()
		if p.i >= len(p.b) {
			return nil, p.fail("unexpected end of input in an object")
		}
		switch p.b[p.i] {
		case ',':
			p.i++
		case '}':
			p.i++
			return obj, nil
		default:
			return nil, p.fail("expected ',' or '}' at byte %d", p.i)
		}
	}
}

func (p *jsonParser) array(path string, depth int) (any, error) {
	p.i++ // '['
	arr := []any{}
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == ']' {
		p.i++
		return arr, nil
	}
	for {
		p.ws()
		v, err := p.value(path+"["+strconv.Itoa(len(arr))+"]", depth+1)
		if err != nil {
			return nil, err
		}
		arr = append(arr, v)
		p.ws()
		if p.i >= len(p.b) {
			return nil, p.fail("unexpected end of input in an array")
		}
		switch p.b[p.i] {
		case ',':
			p.i++
		case ']':
			p.i++
			return arr, nil
		default:
			return nil, p.fail("expected ',' or ']' at byte %d", p.i)
		}
	}
}

// str reads a string; p.b[p.i] is its opening quote.
func (p *jsonParser) str() (string, error) {
	start := p.i + 1
	i := start
	for i < len(p.b) {
		c := p.b[i]
		if plain[c] {
			i++
			continue
		}
		if c == '"' {
			p.i = i + 1
			if i == start {
				return "", nil
			}
			// The string shares the document's bytes (DecodeJSON).
			return unsafe.String(&p.b[start], i-start), nil
		}
		if c == '\\' {
			return p.escaped(start, i)
		}
		if c < 0x20 {
			return "", p.fail("control character in a string at byte %d", i)
		}
		i++
	}
	return "", p.fail("unterminated string at byte %d", p.i)
}

// plain marks the bytes a string holds as they are: not a quote, a
// backslash or a control character.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// escaped reads the rest of a string from its first escape at i.
func (p *jsonParser) escaped(start, i int) (string, error) {
	out := append(make([]byte, 0, i-start+16), p.b[start:i]...)
	for i < len(p.b) {
		c := p.b[i]
		switch {
		case c == '"':
			p.i = i + 1
			return string(out), nil
		case c < 0x20:
			return "", p.fail("control character in a string at byte %d", i)
		case c != '\\':
			out = append(out, c)
			i++
			continue
		}
		if i+1 >= len(p.b) {
			break
		}
		switch e := p.b[i+1]; e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := hex4(p.b, i+2)
			if !ok {
				return "", p.fail("bad \\u escape at byte %d", i)
			}
			i += 6
			if utf16.IsSurrogate(r) {
				// A high half followed by a low one (lone halves were
				// refused before parsing).
				lo, ok := hex4(p.b, i+2)
				if !ok || i+1 >= len(p.b) || p.b[i] != '\\' || p.b[i+1] != 'u' {
					return "", p.fail("half a surrogate pair at byte %d", i-6)
				}
				r = utf16.DecodeRune(r, lo)
				i += 6
			}
			out = utf8.AppendRune(out, r)
			continue
		default:
			return "", p.fail("bad escape at byte %d", i)
		}
		i += 2
	}
	return "", p.fail("unterminated string at byte %d", p.i)
}

// hex4 reads the four hex digits at b[i:].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// number reads a number by JSON's grammar, kept as its literal.
func (p *jsonParser) number() (any, error) {
	start := p.i
	digits := func() int {
		n := 0
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	if p.b[p.i] == '-' {
		p.i++
	}
	switch {
	case p.i < len(p.b) && p.b[p.i] == '0':
		p.i++
	case digits() == 0:
		return nil, p.fail("invalid number at byte %d", start)
	}
	if p.i < len(p.b) && p.b[p.i] == '.' {
		p.i++
		if digits() == 0 {
			return nil, p.fail("invalid number at byte %d", start)
		}
	}
	if p.i < len(p.b) && (p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		p.i++
		if p.i < len(p.b) && (p.b[p.i] == '+' || p.b[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return nil, p.fail("invalid number at byte %d", start)
		}
	}
	return json.Number(p.b[start:p.i]), nil
}

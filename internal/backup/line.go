package backup

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/cortado-db/cortado/internal/schema"
)

// parseLine reads a restore body's line. Lines as a backup writes them —
// plain ASCII strings, integer numbers, each member once — take a
// parser of their own, about a third of encoding/json's cost; any other
// line (escapes, other characters, other numbers, an unknown or repeated
// member) takes the strict general path, so both read every line alike
// (FuzzParseLine).
func parseLine(line []byte) (restoreLine, error) {
	if l, ok := parseBackupLine(line); ok {
		return l, nil
	}
	return parseJSONLine(line)
}

// parseJSONLine reads a line as JSON, strictly (schema.DecodeInto: no
// member unknown).
func parseJSONLine(line []byte) (restoreLine, error) {
	var l restoreLine
	if err := schema.DecodeInto(line, &l, "line"); err != nil {
		return restoreLine{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return l, nil
}

// lineScanner walks a line as a backup writes it.
type lineScanner struct {
	b []byte
	i int
}

func (s *lineScanner) ws() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\r' || s.b[s.i] == '\n') {
		s.i++
	}
}

func (s *lineScanner) byte(c byte) bool {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// str reads a string of printable ASCII without escapes.
func (s *lineScanner) str() ([]byte, bool) {
	if !s.byte('"') {
		return nil, false
	}
	start := s.i
	for ; s.i < len(s.b); s.i++ {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return s.b[start : s.i-1], true
		case c == '\\' || c < 0x20 || c >= 0x7f:
			return nil, false
		}
	}
	return nil, false
}

// base64 reads a string of standard base64 and decodes it: the closing
// quote found at once, and the decoder checks every character (a
// backslash or any other is not base64).
func (s *lineScanner) base64() ([]byte, bool) {
	if !s.byte('"') {
		return nil, false
	}
	end := bytes.IndexByte(s.b[s.i:], '"')
	if end < 0 {
		return nil, false
	}
	v := s.b[s.i : s.i+end]
	s.i += end + 1
	out := make([]byte, base64.StdEncoding.DecodedLen(len(v)))
	n, err := base64.StdEncoding.Decode(out, v)
	if err != nil || bytes.ContainsAny(v, "\r\n") {
		return nil, false // encoding/json's decoder takes CR and LF as nothing
	}
	return out[:n], true
}

// integer reads an integer literal (-?(0|[1-9][0-9]*)) that fits int64.
func (s *lineScanner) integer() (int64, []byte, bool) {
	s.ws()
	start := s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	digits := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	if s.i == digits || s.b[digits] == '0' && s.i > digits+1 {
		return 0, nil, false
	}
	if s.i < len(s.b) && (s.b[s.i] == '.' || s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		return 0, nil, false
	}
	n, err := strconv.ParseInt(string(s.b[start:s.i]), 10, 64)
	return n, s.b[start:s.i], err == nil
}

// parseBackupLine reads a line as a backup writes it; false for any
// other (which parseJSONLine reads, or refuses).
func parseBackupLine(line []byte) (restoreLine, bool) {
	var l restoreLine
	s := &lineScanner{b: line}
	if !s.byte('{') {
		return l, false
	}
	var seen [6]bool
	for first := true; ; first = false {
		if !first && !s.byte(',') {
			break
		}
		name, ok := s.str()
		if !ok || !s.byte(':') {
			return l, false
		}
		var field int
		switch string(name) {
		case "type":
			field = 0
			v, ok := s.str()
			if !ok {
				return l, false
			}
			l.Type = string(v)
		case "table":
			field = 1
			v, ok := s.str()
			if !ok {
				return l, false
			}
			l.Table = string(v)
		case "key":
			field = 2
			if !s.byte('[') {
				return l, false
			}
			l.RawKey = []any{}
			if !s.byte(']') {
				for {
					s.ws()
					if s.i < len(s.b) && s.b[s.i] == '"' {
						v, ok := s.str()
						if !ok {
							return l, false
						}
						l.RawKey = append(l.RawKey, string(v))
					} else {
						_, text, ok := s.integer()
						if !ok {
							return l, false
						}
						l.RawKey = append(l.RawKey, json.Number(text))
					}
					if s.byte(']') {
						break
					}
					if !s.byte(',') {
						return l, false
					}
				}
			}
		case "version":
			field = 3
			n, _, ok := s.integer()
			if !ok || int64(int(n)) != n {
				return l, false
			}
			l.Version = int(n)
		case "ts_ms":
			field = 4
			n, _, ok := s.integer()
			if !ok {
				return l, false
			}
			l.TSms = &n
		case "avro":
			field = 5
			v, ok := s.base64()
			if !ok {
				return l, false
			}
			l.Avro = v
		default:
			return l, false
		}
		if seen[field] {
			return l, false
		}
		seen[field] = true
	}
	if !s.byte('}') {
		return l, false
	}
	s.ws()
	return l, s.i == len(s.b)
}

package index

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"

	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/schema"
)

// Term encodings sort as their values do, and each is self-delimiting,
// so a posting key's document key follows its term unambiguously.
const tagDouble byte = 0x30

// appendStringTerm appends the term of a string (an attribute's value, a
// word of a text field): what documents are indexed under and queries
// look up alike.
func appendStringTerm(dst []byte, s string) []byte { return keys.AppendPart(dst, keys.S(s)) }

// EncodeTerm returns the term of a value of type t given as JSON decodes
// it (string, float64 or json.Number, bool).
func EncodeTerm(t schema.TermType, v any) ([]byte, bool) {
	switch t {
	case schema.TermString:
		s, ok := v.(string)
		if !ok {
			return nil, false
		}
		return appendStringTerm(nil, s), true
	case schema.TermBool:
		b, ok := v.(bool)
		if !ok {
			return nil, false
		}
		n := int64(0)
		if b {
			n = 1
		}
		return keys.AppendPart(nil, keys.I(n)), true
	case schema.TermLong, schema.TermDouble:
		var text string
		switch n := v.(type) {
		case float64:
			return encodeNumber(t, n, "")
		case interface{ String() string }: // json.Number
			text = n.String()
		default:
			return nil, false
		}
		return ParseTerm(t, text)
	}
	return nil, false
}

func encodeNumber(t schema.TermType, f float64, text string) ([]byte, bool) {
	if t == schema.TermLong {
		if text != "" {
			if n, err := strconv.ParseInt(text, 10, 64); err == nil {
				return keys.AppendPart(nil, keys.I(n)), true
			}
		}
		if f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
			return nil, false
		}
		return keys.AppendPart(nil, keys.I(int64(f))), true
	}
	if math.IsNaN(f) {
		return nil, false
	}
	if f == 0 {
		f = 0 // -0 and 0 are one term
	}
	bits := math.Float64bits(f)
	if bits>>63 == 1 {
		bits = ^bits
	} else {
		bits |= 1 << 63
	}
	return binary.BigEndian.AppendUint64([]byte{tagDouble}, bits), true
}

// ParseTerm returns the term of a value of type t written in a query.
func ParseTerm(t schema.TermType, text string) ([]byte, bool) {
	switch t {
	case schema.TermString:
		return appendStringTerm(nil, text), true
	case schema.TermBool:
		switch text {
		case "true":
			return EncodeTerm(t, true)
		case "false":
			return EncodeTerm(t, false)
		}
		return nil, false
	case schema.TermLong:
		n, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return nil, false
		}
		return keys.AppendPart(nil, keys.I(n)), true
	case schema.TermDouble:
		f, err := strconv.ParseFloat(text, 64)
		if err != nil {
			return nil, false
		}
		return encodeNumber(t, f, "")
	}
	return nil, false
}

// DecodeTerm returns a term's value as text (for sorting tokens and
// debugging): strings as they are, numbers in decimal.
func DecodeTerm(b []byte) string {
	if len(b) == 9 && b[0] == tagDouble {
		bits := binary.BigEndian.Uint64(b[1:])
		if bits>>63 == 1 {
			bits &^= 1 << 63
		} else {
			bits = ^bits
		}
		return strconv.FormatFloat(math.Float64frombits(bits), 'g', -1, 64)
	}
	p, _, err := keys.DecodePart(b)
	if err != nil {
		return fmt.Sprintf("%x", b)
	}
	return p.String()
}

// MaxWordBytes bounds one indexed word; longer runs are cut.
const MaxWordBytes = 64

// Words splits text into lower-cased words: runs of letters, digits and
// marks (a simplification of Unicode word boundaries: an apostrophe or a
// hyphen ends a word). Each word is at most MaxWordBytes long.
func Words(text string) []string {
	var out []string
	start := -1
	flush := func(end int) {
		if start >= 0 {
			w := strings.ToLower(text[start:end])
			if len(w) > MaxWordBytes {
				w = w[:MaxWordBytes]
				for len(w) > 0 && !validEnd(w) {
					w = w[:len(w)-1]
				}
			}
			out = append(out, w)
			start = -1
		}
	}
	for i, r := range text {
		if wordChar(r) {
			if start < 0 {
				start = i
			}
			continue
		}
		flush(i)
	}
	flush(len(text))
	return out
}

// wordChar reports whether r is part of a word.
func wordChar(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r)
}

// validEnd reports whether s does not end inside a UTF-8 sequence.
func validEnd(s string) bool {
	return strings.ToValidUTF8(s, "\uFFFD") == s
}

// stopWords are the common English words a "stopWords" text index leaves
// out (Lucene's English stop set).
var stopWords = map[string]bool{}

func init() {
	for _, w := range strings.Fields("a an and are as at be but by for if in into is it no not of on or such that the their then there these they this to was will with") {
		stopWords[w] = true
	}
}

// IsStopWord reports whether a lower-cased word is a stop word.
func IsStopWord(w string) bool { return stopWords[w] }

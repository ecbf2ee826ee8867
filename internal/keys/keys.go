// Package keys owns Cortado's order-preserving encoding of typed key parts and
// the layout of every key in a storage node's Pebble keyspace.
//
// Invariant: for two tuples of key parts a and b of the same types,
// bytes.Compare(Encode(a), Encode(b)) has the sign of the tuple comparison,
// and an encoded prefix of a tuple is a byte prefix of the encoded tuple, so a
// collection (all documents under a leading key) is one contiguous key range.
package keys

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
)

// Type is the type of one key part.
type Type string

// Key part types.
const (
	String Type = "string"
	Long   Type = "long"
	Int    Type = "int"
)

// Tags start each encoded part so that a decoder knows its type and so that
// the end-of-key marker sorts before any part.
const (
	tagString byte = 0x10
	tagLong   byte = 0x20
)

// ErrCorrupt is returned when decoding bytes that were not produced by Encode.
var ErrCorrupt = errors.New("keys: corrupt encoded key")

// Part is one typed key part value: a string or an int64.
type Part struct {
	Str   string
	Int   int64
	IsInt bool
}

// S returns a string part.
func S(s string) Part { return Part{Str: s} }

// I returns an integer part.
func I(i int64) Part { return Part{Int: i, IsInt: true} }

// Equal reports whether keys a and b are the same key: they encode alike
// (Encode), without encoding them.
func Equal(a, b []Part) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].IsInt != b[i].IsInt || a[i].IsInt && a[i].Int != b[i].Int || !a[i].IsInt && a[i].Str != b[i].Str {
			return false
		}
	}
	return true
}

// String renders the part as it appears in a URL path segment.
func (p Part) String() string {
	if p.IsInt {
		return strconv.FormatInt(p.Int, 10)
	}
	return p.Str
}

// Range is the smallest and largest value of an integer type's parts.
func (t Type) Range() (lo, hi int64) {
	if t == Int {
		return math.MinInt32, math.MaxInt32
	}
	return math.MinInt64, math.MaxInt64
}

// Parse reads a part of type t from its text form.
func Parse(t Type, s string) (Part, error) {
	if len(s) > MaxPartBytes {
		return Part{}, fmt.Errorf("a key part of %d bytes is over the limit of %d", len(s), MaxPartBytes)
	}
	switch t {
	case Long, Int:
		v, err := strconv.ParseInt(s, 10, 64)
		// Only the canonical decimal form: "+1" and "01" would address
		// key 1 under another name.
		var canonical [20]byte
		if err != nil || string(strconv.AppendInt(canonical[:0], v, 10)) != s {
			return Part{}, fmt.Errorf("%s is not a %s in canonical decimal form", quoteShort(s), t)
		}
		if lo, hi := t.Range(); v < lo || v > hi {
			return Part{}, fmt.Errorf("%q is out of range for %s", s, t)
		}
		return I(v), nil
	case String, "":
		if s == "" {
			// A URL path cannot carry it (an empty segment is refused,
			// and no escape spells nothing): a document under an empty
			// key part could be written in a transaction but never read
			// or deleted by its key.
			return Part{}, fmt.Errorf("a string key part may not be empty")
		}
		if !utf8.ValidString(s) {
			return Part{}, fmt.Errorf("a string key part must be valid UTF-8")
		}
		return S(s), nil
	}
	return Part{}, fmt.Errorf("unknown key type %q", t)
}

// Key size limits: a key part's text, and a whole encoded key.
const (
	MaxPartBytes = 1024
	MaxKeyBytes  = 4096
)

// quoteShort quotes s for an error message, cut to a few dozen bytes.
func quoteShort(s string) string {
	if len(s) > 40 {
		return strconv.Quote(s[:37]) + "…"
	}
	return strconv.Quote(s)
}

// AppendPart appends the order-preserving encoding of p to dst.
//
// Strings: tag, bytes with 0x00 escaped as 0x00 0xFF, then terminator 0x00 0x01.
// Integers: tag, 8 bytes big-endian with the sign bit flipped.
func AppendPart(dst []byte, p Part) []byte {
	if p.IsInt {
		dst = append(dst, tagLong)
		return binary.BigEndian.AppendUint64(dst, uint64(p.Int)^(1<<63))
	}
	dst = append(dst, tagString)
	for i := 0; i < len(p.Str); i++ {
		c := p.Str[i]
		if c == 0 {
			dst = append(dst, 0, 0xFF)
			continue
		}
		dst = append(dst, c)
	}
	return append(dst, 0, 1)
}

// Encode encodes a tuple of parts.
func Encode(parts []Part) []byte { return AppendParts(nil, parts) }

// AppendParts appends the encoding of every part in order.
func AppendParts(dst []byte, parts []Part) []byte {
	for _, p := range parts {
		dst = AppendPart(dst, p)
	}
	return dst
}

// Decode decodes a whole encoded tuple.
func Decode(b []byte) ([]Part, error) {
	var parts []Part
	for len(b) > 0 {
		p, n, err := DecodePart(b)
		if err != nil {
			return nil, err
		}
		parts = append(parts, p)
		b = b[n:]
	}
	return parts, nil
}

// DecodePart decodes the first part of b and returns it with its encoded length.
func DecodePart(b []byte) (Part, int, error) {
	if len(b) == 0 {
		return Part{}, 0, ErrCorrupt
	}
	switch b[0] {
	case tagLong:
		if len(b) < 9 {
			return Part{}, 0, ErrCorrupt
		}
		return I(int64(binary.BigEndian.Uint64(b[1:9]) ^ (1 << 63))), 9, nil
	case tagString:
		var out []byte
		for i := 1; i < len(b); i++ {
			if b[i] != 0 {
				out = append(out, b[i])
				continue
			}
			if i+1 >= len(b) {
				return Part{}, 0, ErrCorrupt
			}
			switch b[i+1] {
			case 0xFF:
				out = append(out, 0)
				i++
			case 1:
				return S(string(out)), i + 2, nil
			default:
				return Part{}, 0, ErrCorrupt
			}
		}
	}
	return Part{}, 0, ErrCorrupt
}

// PrefixEnd returns the smallest key greater than every key with the given
// prefix, or nil when there is none (the prefix is all 0xFF).
func PrefixEnd(prefix []byte) []byte {
	if end := AppendPrefixEnd(nil, prefix); len(end) > 0 {
		return end
	}
	return nil
}

// AppendPrefixEnd appends PrefixEnd(prefix) to dst (nothing when it is
// nil: no key is past every key with the prefix) and returns dst.
func AppendPrefixEnd(dst, prefix []byte) []byte {
	n := len(dst)
	dst = append(dst, prefix...)
	for i := len(dst) - 1; i >= n; i-- {
		dst[i]++
		if dst[i] != 0 {
			return dst[:i+1]
		}
	}
	return dst[:n]
}

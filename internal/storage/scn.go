package storage

import (
	"fmt"
	"strconv"
	"strings"
)

// SCN is a system change number: the position of a commit in its
// partition's timeline. Generation increases with every mastership change;
// sequence increases with every commit within a generation.
type SCN struct {
	Gen uint32
	Seq uint64
}

// Less orders SCNs by generation, then sequence.
func (s SCN) Less(o SCN) bool {
	return s.Gen < o.Gen || (s.Gen == o.Gen && s.Seq < o.Seq)
}

// IsZero reports whether s is before every commit.
func (s SCN) IsZero() bool { return s.Gen == 0 && s.Seq == 0 }

// String renders "generation:sequence", the form used in headers and URLs.
func (s SCN) String() string {
	var b [32]byte
	return string(s.Append(b[:0]))
}

// Append appends String's form to b.
func (s SCN) Append(b []byte) []byte {
	b = strconv.AppendUint(b, uint64(s.Gen), 10)
	b = append(b, ':')
	return strconv.AppendUint(b, s.Seq, 10)
}

// ParseSCN parses the form String produces.
func ParseSCN(text string) (SCN, error) {
	g, q, ok := strings.Cut(text, ":")
	if !ok {
		return SCN{}, fmt.Errorf("SCN %q: want generation:sequence", text)
	}
	gen, err := strconv.ParseUint(g, 10, 32)
	if err != nil {
		return SCN{}, fmt.Errorf("SCN %q: bad generation", text)
	}
	seq, err := strconv.ParseUint(q, 10, 64)
	if err != nil {
		return SCN{}, fmt.Errorf("SCN %q: bad sequence", text)
	}
	return SCN{Gen: uint32(gen), Seq: seq}, nil
}

// MarshalText renders the String form, so SCNs read the same in JSON as in
// headers.
func (s SCN) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText parses the String form.
func (s *SCN) UnmarshalText(b []byte) error {
	v, err := ParseSCN(string(b))
	*s = v
	return err
}

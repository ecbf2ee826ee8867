package keys

import (
	"bytes"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func cmpParts(a, b []Part) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		x, y := a[i], b[i]
		var c int
		if x.IsInt {
			c = cmpInt(x.Int, y.Int)
		} else {
			c = bytes.Compare([]byte(x.Str), []byte(y.Str))
		}
		if c != 0 {
			return c
		}
	}
	return cmpInt(int64(len(a)), int64(len(b)))
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func randString(r *rand.Rand) string {
	alphabet := []byte{0, 1, 2, 'a', 'b', 0xFF, 0xFE}
	n := r.IntN(5)
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

func TestOrderPreserved(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	ints := []int64{math.MinInt64, -1, 0, 1, 255, 256, math.MaxInt64}
	for range 20000 {
		n := 1 + r.IntN(3)
		a, b := make([]Part, n), make([]Part, n)
		for i := range n {
			if i == 1 {
				a[i], b[i] = I(ints[r.IntN(len(ints))]), I(ints[r.IntN(len(ints))])
			} else {
				a[i], b[i] = S(randString(r)), S(randString(r))
			}
		}
		if r.IntN(4) == 0 {
			b = b[:r.IntN(n)+1]
		}
		want := cmpParts(a, b)
		got := bytes.Compare(Encode(a), Encode(b))
		if got != want {
			t.Fatalf("order of %v vs %v: encoded %d, tuples %d", a, b, got, want)
		}
		dec, err := Decode(Encode(a))
		if err != nil || !slices.Equal(dec, a) {
			t.Fatalf("round trip %v: got %v, %v", a, dec, err)
		}
	}
}

func TestPrefixIsBytePrefix(t *testing.T) {
	full := Encode([]Part{S("m\x00box"), I(7)})
	if !bytes.HasPrefix(full, Encode([]Part{S("m\x00box")})) {
		t.Fatal("collection prefix is not a byte prefix")
	}
	// "ab" must not be inside the range of collection "a".
	a := Encode([]Part{S("a")})
	ab := Encode([]Part{S("ab"), I(1)})
	if bytes.HasPrefix(ab, a) {
		t.Fatal("collection a contains key of collection ab")
	}
}

func TestPrefixEnd(t *testing.T) {
	for _, tc := range []struct{ in, want []byte }{
		{[]byte{1, 2}, []byte{1, 3}},
		{[]byte{1, 0xFF}, []byte{2}},
		{[]byte{0xFF}, nil},
	} {
		if got := PrefixEnd(tc.in); !bytes.Equal(got, tc.want) || (tc.want == nil) != (got == nil) {
			t.Errorf("PrefixEnd(%x) = %x, want %x", tc.in, got, tc.want)
		}
		// Appended after other bytes, which it leaves alone.
		dst := []byte{0xFF, 7}
		if got := AppendPrefixEnd(dst, tc.in); !bytes.Equal(got, append([]byte{0xFF, 7}, tc.want...)) {
			t.Errorf("AppendPrefixEnd(ff07, %x) = %x, want ff07%x", tc.in, got, tc.want)
		}
	}
}

func TestDecodeCorrupt(t *testing.T) {
	for _, b := range [][]byte{{0x10, 'a'}, {0x20, 1}, {0x33}, {0x10, 0, 7}} {
		if _, err := Decode(b); err == nil {
			t.Errorf("Decode(%x) succeeded", b)
		}
	}
}

func TestParse(t *testing.T) {
	if p, err := Parse(Long, "-42"); err != nil || p != I(-42) {
		t.Fatalf("Parse long: %v %v", p, err)
	}
	if _, err := Parse(Int, "3000000000"); err == nil {
		t.Fatal("int out of range accepted")
	}
	if _, err := Parse(Long, "x"); err == nil {
		t.Fatal("non-number accepted as long")
	}
	// Only the canonical decimal form names a number: others would
	// address the same key under another name.
	for _, s := range []string{"+1", "01", "-0", "00", " 1", "1 ", "0x1"} {
		if p, err := Parse(Long, s); err == nil {
			t.Fatalf("Parse(Long, %q) = %v, want an error", s, p)
		}
	}
	for _, s := range []string{"0", "-1", "9223372036854775807", "-9223372036854775808"} {
		if _, err := Parse(Long, s); err != nil {
			t.Fatalf("Parse(Long, %q): %v", s, err)
		}
	}
	// An empty string part could be written (a transaction's key) but
	// never named in a URL path, so it is refused as input.
	if p, err := Parse(String, ""); err == nil {
		t.Fatalf("Parse(String, \"\") = %v, want an error", p)
	}
	if n := testing.AllocsPerRun(100, func() { Parse(Long, "-9223372036854775808") }); n != 0 {
		t.Fatalf("Parse of a long allocated %v times", n)
	}
}

// TestEqualIsEncodedEquality: two keys are Equal exactly when they encode
// alike, whatever fields a part of the other type carries.
func TestEqualIsEncodedEquality(t *testing.T) {
	ks := [][]Part{
		nil, {S("")}, {S("1")}, {I(1)}, {I(0)}, {S("a"), I(1)}, {S("a"), I(2)}, {S("a"), S("1")},
		{S("a")}, {I(1), S("a")}, {{Str: "ignored", Int: 1, IsInt: true}}, {{Str: "1", Int: 7}},
	}
	for _, a := range ks {
		for _, b := range ks {
			if got, want := Equal(a, b), bytes.Equal(Encode(a), Encode(b)); got != want {
				t.Errorf("Equal(%v, %v) = %v, the encodings say %v", a, b, got, want)
			}
		}
	}
}

package changes

import (
	"testing"

	"github.com/cortado-db/cortado/internal/storage"
)

func TestTokenRoundTrip(t *testing.T) {
	tok := Token{0: {SCN: storage.SCN{Gen: 3, Seq: 17}}, 5: {SCN: storage.SCN{Gen: 1, Seq: 2}, Skip: 4}, 63: {}}
	text := tok.Encode("shop")
	got, err := ParseToken("shop", 64, text)
	if err != nil || len(got) != len(tok) {
		t.Fatalf("parse %q: %v %v", text, got, err)
	}
	for p, pos := range tok {
		if got[p] != pos {
			t.Fatalf("partition %d: %+v, want %+v", p, got[p], pos)
		}
	}
	if tok.Encode("shop") != text {
		t.Fatal("encoding is not deterministic")
	}
	for name, bad := range map[string]string{
		"another database":   tok.Encode("other"),
		"partition too high": Token{64: {}}.Encode("shop"),
		"not base64":         "!!",
		"truncated":          text[:len(text)-2],
		"empty":              "",
		"oversized":          string(make([]byte, MaxTokenBytes+1)),
	} {
		if _, err := ParseToken("shop", 64, bad); err != ErrBadToken {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func FuzzParseToken(f *testing.F) {
	f.Add(Token{1: {SCN: storage.SCN{Gen: 2, Seq: 3}, Skip: 1}}.Encode("d"))
	f.Add("AQ")
	f.Fuzz(func(t *testing.T, text string) {
		tok, err := ParseToken("d", 16, text)
		if err != nil {
			return
		}
		// What parses re-encodes to a token that parses the same.
		again, err := ParseToken("d", 16, tok.Encode("d"))
		if err != nil || len(again) != len(tok) {
			t.Fatalf("re-parse: %v %v", again, err)
		}
		for p, pos := range tok {
			if p < 0 || p >= 16 || again[p] != pos {
				t.Fatalf("partition %d: %+v vs %+v", p, pos, again[p])
			}
		}
	})
}

package node

import (
	"errors"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/storage"
)

func TestPreconditionsFollowRFC9110Order(t *testing.T) {
	mod := time.Date(2026, 1, 2, 3, 4, 5, 600, time.UTC)
	doc := &storage.Doc{CRC: 0xabc, Modified: mod}
	etag := doc.ETag()
	before, after := mod.Add(-time.Hour), mod.Add(time.Hour)
	cases := []struct {
		name   string
		c      Preconditions
		exists bool
		read   bool
		want   error
	}{
		{"none", Preconditions{}, true, true, nil},
		{"if-match hit", Preconditions{IfMatch: []string{etag}}, true, false, nil},
		{"if-match compares strongly: a weak tag never matches", Preconditions{IfMatch: []string{"W/" + etag}}, true, false, ErrPreconditionFailed},
		{"if-match weak tag beside the strong one", Preconditions{IfMatch: []string{"W/" + etag, etag}}, true, false, nil},
		{"if-match miss", Preconditions{IfMatch: []string{`"1"`}}, true, false, ErrPreconditionFailed},
		{"if-match star on missing", Preconditions{IfMatch: []string{"*"}}, false, false, ErrPreconditionFailed},
		{"if-match wins over if-unmodified-since", Preconditions{IfMatch: []string{etag}, IfUnmodifiedSince: before}, true, false, nil},
		{"if-unmodified-since false", Preconditions{IfUnmodifiedSince: before}, true, false, ErrPreconditionFailed},
		{"if-unmodified-since same second", Preconditions{IfUnmodifiedSince: mod.Truncate(time.Second)}, true, false, nil},
		{"if-none-match star on existing write", Preconditions{IfNoneMatch: []string{"*"}}, true, false, ErrPreconditionFailed},
		{"if-none-match star on missing write", Preconditions{IfNoneMatch: []string{"*"}}, false, false, nil},
		{"if-none-match hit on read", Preconditions{IfNoneMatch: []string{`"x"`, etag}}, true, true, ErrNotModified},
		{"if-none-match compares weakly", Preconditions{IfNoneMatch: []string{"W/" + etag}}, true, true, ErrNotModified},
		{"if-none-match weak hit on write", Preconditions{IfNoneMatch: []string{"W/" + etag}}, true, false, ErrPreconditionFailed},
		{"if-none-match miss on read", Preconditions{IfNoneMatch: []string{`"x"`}}, true, true, nil},
		{"if-modified-since not modified", Preconditions{IfModifiedSince: after}, true, true, ErrNotModified},
		{"if-modified-since same second", Preconditions{IfModifiedSince: mod.Truncate(time.Second)}, true, true, ErrNotModified},
		{"if-modified-since modified", Preconditions{IfModifiedSince: before}, true, true, nil},
		{"if-modified-since ignored on writes", Preconditions{IfModifiedSince: after}, true, false, nil},
		{"if-none-match wins over if-modified-since", Preconditions{IfNoneMatch: []string{`"x"`}, IfModifiedSince: after}, true, true, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.c.Check(doc, tc.exists, tc.read, 0); !errors.Is(got, tc.want) || (tc.want == nil && got != nil) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// A read at a schema version other than the written one is a
// representation of its own; a write compares the document whatever
// version its tag was read at.
func TestPreconditionsAtAnotherVersion(t *testing.T) {
	mod := time.Date(2026, 1, 2, 3, 4, 5, 600, time.UTC)
	doc := &storage.Doc{Version: 1, SCN: storage.SCN{Gen: 1, Seq: 9}, CRC: 0xabc, Modified: mod}
	etag, at2 := doc.ETag(), etagAt(doc, 2)
	if at2 != `"1.9.00000abc+v2"` || etagAt(doc, 1) != etag || etagAt(doc, 0) != etag {
		t.Fatalf("ETags %s %s %s", etag, at2, etagAt(doc, 1))
	}
	after := mod.Add(time.Hour)
	cases := []struct {
		name    string
		c       Preconditions
		read    bool
		version int
		want    error
	}{
		{"the written version's tag does not revalidate a read at another", Preconditions{IfNoneMatch: []string{etag}}, true, 2, nil},
		{"the version's own tag does", Preconditions{IfNoneMatch: []string{at2}}, true, 2, ErrNotModified},
		{"another version's tag does not", Preconditions{IfNoneMatch: []string{`"00000abc+v3"`}}, true, 2, nil},
		{"weakly too", Preconditions{IfNoneMatch: []string{"W/" + at2}}, true, 2, ErrNotModified},
		{"if-modified-since does not", Preconditions{IfModifiedSince: after}, true, 2, nil},
		{"if-modified-since as written", Preconditions{IfModifiedSince: after}, true, 0, ErrNotModified},
		{"if-match on a read at another version", Preconditions{IfMatch: []string{etag}}, true, 2, ErrPreconditionFailed},
		{"a write matches a tag read at any version", Preconditions{IfMatch: []string{at2}}, false, 0, nil},
		{"and as written", Preconditions{IfMatch: []string{etag}}, false, 0, nil},
		{"not another document's", Preconditions{IfMatch: []string{`"00000abd+v2"`}}, false, 0, ErrPreconditionFailed},
		{"not a projection's", Preconditions{IfMatch: []string{`"00000abc+v2+f12345678"`}}, false, 0, ErrPreconditionFailed},
		{"if-none-match on a write, any version", Preconditions{IfNoneMatch: []string{at2}}, false, 0, ErrPreconditionFailed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.c.Check(doc, true, tc.read, tc.version); !errors.Is(got, tc.want) || (tc.want == nil && got != nil) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			// A router's cache checks a read against the document as a
			// read of it as written answered it: the same answer.
			if tc.read {
				whole := &Item{ETag: etag, BodyVersion: doc.Version, Modified: doc.Modified}
				if got := tc.c.CheckRead(whole, tc.version); !errors.Is(got, tc.want) || (tc.want == nil && got != nil) {
					t.Fatalf("CheckRead: got %v, want %v", got, tc.want)
				}
				if got := NotModified(whole, tc.version).ETag; got != etagAt(doc, tc.version) {
					t.Fatalf("NotModified's tag %s, the node's %s", got, etagAt(doc, tc.version))
				}
			}
		})
	}
	for in, want := range map[string]string{
		`"abc+v2"`: `"abc"`, `"abc+v12"`: `"abc"`, `"abc"`: `"abc"`, `"abc+v"`: `"abc+v"`, `"+v2"`: `""`,
		`+v2"`: `+v2"`, `"abc+v2+f1"`: `"abc+v2+f1"`, `"abc+x2"`: `"abc+x2"`, `"`: `"`, ``: ``, `2`: `2`, `"abc+v2`: `"abc+v2`,
	} {
		if got := withoutVersion(in); got != want {
			t.Errorf("withoutVersion(%s) = %s, want %s", in, got, want)
		}
	}
}

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
			if got := tc.c.Check(doc, tc.exists, tc.read); !errors.Is(got, tc.want) || (tc.want == nil && got != nil) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

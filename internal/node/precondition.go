package node

import (
	"slices"
	"time"

	"github.com/cortado-db/cortado/internal/storage"
)

// Check evaluates preconditions against the current state of a document
// (exists false: no document) in RFC 9110 §13.2.2 order. For reads a false
// If-None-Match or If-Modified-Since is ErrNotModified; for writes
// If-Modified-Since is ignored, as the RFC says, and a false If-None-Match
// is ErrPreconditionFailed.
func (c Preconditions) Check(d *storage.Doc, exists, read bool) error {
	etag := ""
	var modified time.Time
	if exists {
		etag = d.ETag()
		// HTTP dates have one-second resolution.
		modified = d.Modified.Truncate(time.Second)
	}
	if len(c.IfMatch) > 0 {
		if !exists || !matches(c.IfMatch, etag, true) {
			return ErrPreconditionFailed
		}
	} else if !c.IfUnmodifiedSince.IsZero() && exists && modified.After(c.IfUnmodifiedSince) {
		return ErrPreconditionFailed
	}
	if len(c.IfNoneMatch) > 0 {
		if exists && matches(c.IfNoneMatch, etag, false) {
			if read {
				return ErrNotModified
			}
			return ErrPreconditionFailed
		}
	} else if read && !c.IfModifiedSince.IsZero() && exists && !modified.After(c.IfModifiedSince) {
		return ErrNotModified
	}
	return nil
}

// matches reports whether one of tags names etag (a document's, which
// is strong), "*" matching any existing document. If-None-Match compares
// weakly (a W/ prefix ignored); If-Match strongly, as RFC 9110 §13.1.1
// requires: a weak tag never matches, since the writer asks that nothing
// at all changed.
func matches(tags []string, etag string, strong bool) bool {
	return slices.ContainsFunc(tags, func(t string) bool {
		if t == "*" {
			return true
		}
		if len(t) > 2 && t[:2] == "W/" {
			if strong {
				return false
			}
			t = t[2:]
		}
		return t == etag
	})
}

// Empty reports whether no precondition is set.
func (c Preconditions) Empty() bool {
	return len(c.IfMatch) == 0 && len(c.IfNoneMatch) == 0 && c.IfModifiedSince.IsZero() && c.IfUnmodifiedSince.IsZero()
}

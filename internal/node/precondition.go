package node

import (
	"slices"
	"time"

	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
)

// Check evaluates preconditions against the current state of a document
// (exists false: no document) in RFC 9110 §13.2.2 order. For reads a false
// If-None-Match or If-Modified-Since is ErrNotModified; for writes
// If-Modified-Since is ignored, as the RFC says, and a false If-None-Match
// is ErrPreconditionFailed.
//
// A read is of the document at schema version version (0: as written),
// whose ETag carries that version when it is not the written one
// (schema.VersionSuffix); such a representation changed when the version
// was registered, not when the document was written, so If-Modified-Since
// never makes it 304. A write compares tags with their version suffixes
// taken off: whatever version the writer read the document at, what it
// asks is that the document did not change.
func (c Preconditions) Check(d *storage.Doc, exists, read bool, version int) error {
	if c.Empty() {
		return nil // nearly every request: no ETag to render
	}
	if !exists {
		return c.check("", 0, time.Time{}, false, read, version)
	}
	return c.check(d.ETag(), d.Version, d.Modified, true, read, version)
}

// CheckRead is Check for a read (at schema version version, 0 as written)
// of a document held as the Item a read of it as written answers (a
// router's cache): its ETag, schema version and modification time are
// the document's.
func (c Preconditions) CheckRead(whole *Item, version int) error {
	if c.Empty() {
		return nil
	}
	return c.check(whole.ETag, whole.BodyVersion, whole.Modified, true, true, version)
}

// NotModified is the answer to a read (at schema version version) of the
// document whole, read as written, that its conditions found not
// modified: its key, SCN, modification time and the representation's
// entity tag, no body.
func NotModified(whole *Item, version int) *Item {
	return &Item{Key: whole.Key, SCN: whole.SCN, Modified: whole.Modified, Stale: whole.Stale,
		ETag: tagAt(whole.ETag, whole.BodyVersion, version)}
}

// check is Check of a document with entity tag etag (as written, at
// schema version written) modified at modified.
func (c Preconditions) check(etag string, written int, modified time.Time, exists, read bool, version int) error {
	evolved := false
	if exists {
		if s := schema.VersionSuffix(written, version); read && s != "" {
			etag, evolved = schema.WithSuffix(etag, s), true
		}
		// HTTP dates have one-second resolution.
		modified = modified.Truncate(time.Second)
	}
	if len(c.IfMatch) > 0 {
		if !exists || !matches(c.IfMatch, etag, true, !read) {
			return ErrPreconditionFailed
		}
	} else if !c.IfUnmodifiedSince.IsZero() && exists && modified.After(c.IfUnmodifiedSince) {
		return ErrPreconditionFailed
	}
	if len(c.IfNoneMatch) > 0 {
		if exists && matches(c.IfNoneMatch, etag, false, !read) {
			if read {
				return ErrNotModified
			}
			return ErrPreconditionFailed
		}
	} else if read && !evolved && !c.IfModifiedSince.IsZero() && exists && !modified.After(c.IfModifiedSince) {
		return ErrNotModified
	}
	return nil
}

// matches reports whether one of tags names etag (a document's, which
// is strong), "*" matching any existing document. If-None-Match compares
// weakly (a W/ prefix ignored); If-Match strongly, as RFC 9110 §13.1.1
// requires: a weak tag never matches, since the writer asks that nothing
// at all changed. anyVersion takes a tag's version suffix off first.
func matches(tags []string, etag string, strong, anyVersion bool) bool {
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
		if anyVersion {
			t = withoutVersion(t)
		}
		return t == etag
	})
}

// etagAt is the ETag of d read at schema version version (0: as
// written).
func etagAt(d *storage.Doc, version int) string {
	return tagAt(d.ETag(), d.Version, version)
}

// tagAt is the entity tag, at schema version version (0: as written), of
// a document whose tag as written (at version written) is etag.
func tagAt(etag string, written, version int) string {
	return schema.WithSuffix(etag, schema.VersionSuffix(written, version))
}

// withoutVersion takes a schema version's suffix ("+v" and digits, last
// inside the quotes) off a tag.
func withoutVersion(t string) string {
	end := len(t) - 1 // the closing quote
	i := end
	for i > 0 && t[i-1] >= '0' && t[i-1] <= '9' {
		i--
	}
	if i == end || i < 3 || t[end] != '"' || t[i-2:i] != "+v" {
		return t
	}
	return t[:i-2] + `"`
}

// Empty reports whether no precondition is set.
func (c Preconditions) Empty() bool {
	return len(c.IfMatch) == 0 && len(c.IfNoneMatch) == 0 && c.IfModifiedSince.IsZero() && c.IfUnmodifiedSince.IsZero()
}

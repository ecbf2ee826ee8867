package node

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/storage"
)

// Errors a node returns; the router maps them to HTTP statuses.
var (
	ErrNotFound           = errors.New("document not found")
	ErrPreconditionFailed = errors.New("precondition failed")
	ErrNotModified        = errors.New("not modified")
	ErrBadPatch           = errors.New("bad patch")
	// ErrTooStale is a slave's refusal of a read whose max-stale it
	// cannot honour.
	ErrTooStale = errors.New("replica too stale")
	// ErrUnavailable means the storage node could not be reached, or
	// stopped answering: a write's outcome is unknown.
	ErrUnavailable = errors.New("storage node unavailable")
	// ErrNotDelivered comes with ErrUnavailable when the request never
	// reached the node (the connection was refused): nothing was done.
	ErrNotDelivered = errors.New("request not delivered")
	// ErrOverloaded is a call a storage node refused at its admission
	// limit: nothing was done.
	ErrOverloaded = errors.New("storage node overloaded")
	// ErrInvalidQuery is a query that does not parse, or names a field
	// it cannot use, or a bad continuation token.
	ErrInvalidQuery = errors.New("invalid query")
	// ErrIndexBuilding is a query on a field whose index does not hold
	// every document yet.
	ErrIndexBuilding = errors.New("index building")
)

// Service is what a router needs from a storage node.
type Service interface {
	Get(ctx context.Context, req GetRequest) (*Item, error)
	MultiGet(ctx context.Context, req MultiGetRequest) (*MultiGetResult, error)
	Scan(ctx context.Context, req ScanRequest) (*ScanResult, error)
	Write(ctx context.Context, req WriteRequest) (*WriteResult, error)
}

// InProcess is implemented by a Service that runs in its caller's own
// process (InProcess true): a router's fan-out calls it in the request's
// goroutine instead of a goroutine of its own.
type InProcess interface {
	InProcess() bool
}

// IsInProcess reports whether s runs in its caller's own process.
func IsInProcess(s Service) bool {
	ip, ok := s.(InProcess)
	return ok && ip.InProcess()
}

// Preconditions are the HTTP conditional headers of a request (RFC 9110
// §13). Empty fields are absent headers.
type Preconditions struct {
	IfMatch           []string // entity tags, or "*"
	IfNoneMatch       []string
	IfModifiedSince   time.Time
	IfUnmodifiedSince time.Time
}

// ReadSpec says how to return documents.
type ReadSpec struct {
	// Version is the schema version to return; 0 returns each document as
	// written.
	Version int
	// Fields projects to these dot paths; none returns whole documents.
	Fields []string
}

// Item is one document as returned by a read.
type Item struct {
	Key      []keys.Part
	SCN      storage.SCN
	Modified time.Time
	ETag     string
	// Body is Avro binary of schema version BodyVersion, projected to the
	// request's fields.
	Body        []byte
	BodyVersion int
	// Stale, set when a slave answered, bounds how far behind its master
	// it may be: the time since it last heard from the master.
	Stale time.Duration `json:",omitempty"`
	// Position is a query hit's place in the query's order (a token
	// index.ComparePositions orders), for merging partitions' hits.
	Position []byte `json:",omitempty"`
}

// GetRequest reads one document.
type GetRequest struct {
	DB, Table string
	Partition int
	Key       []keys.Part
	Read      ReadSpec
	Cond      Preconditions
	// MaxStale, when positive, lets a slave answer if it heard from its
	// master within that long (Cache-Control: max-stale).
	MaxStale time.Duration
}

// MultiGetResult is one partition's answer to a multi-get: the
// documents found, in the request's order of keys (ByteLimit may end it
// early; MultiGetRequest.Answered), and, from a slave, how far behind its
// master it may be — for the keys it reports missing too.
type MultiGetResult struct {
	Items []*Item
	Stale time.Duration
}

// MultiGetRequest reads documents of one partition; missing ones are
// left out of the result.
type MultiGetRequest struct {
	DB, Table string
	Partition int
	Keys      [][]keys.Part
	Read      ReadSpec
	// MaxBytes bounds the answer (ByteLimit): it stops after the
	// document whose body brings the answer's bodies to MaxBytes or
	// more, so it holds the documents of a prefix of Keys, and the
	// caller asks again for the rest (Answered).
	MaxBytes int
	// MaxStale, when positive, lets a slave answer if it heard from its
	// master within that long, as a GetRequest's; each document then
	// carries its Stale.
	MaxStale time.Duration
}

// MaxReadBytes bounds one multi-get's or scan's answer, whatever the
// request asks: a node never holds more for one caller.
const MaxReadBytes = 16 << 20

// itemOverhead is what a scan counts for a document besides its body
// (its key, ETag, SCN, position), so that a scan of empty documents is
// bounded too.
const itemOverhead = 64

// ScanBytes is what it counts toward a scan or query answer's byte bound
// (ScanRequest.ByteLimit): its body and itemOverhead.
func (it *Item) ScanBytes() int { return len(it.Body) + itemOverhead }

// ByteLimit is the bodies' bytes an answer to r holds before its last
// document (MaxBytes within MaxReadBytes).
func (r *MultiGetRequest) ByteLimit() int { return within(r.MaxBytes, MaxReadBytes) }

// within is asked if it is positive and below bound, else bound: a
// request's own bound, 0 when it states none, within the node's.
func within(asked, bound int) int {
	if asked > 0 && asked < bound {
		return asked
	}
	return bound
}

// Answered is how many of r's keys an answer of items covers: all of
// them unless the answer reached r's byte limit, else those up to its
// last document (a key after it may have a document the answer left
// out).
func (r *MultiGetRequest) Answered(items []*Item) int {
	size := 0
	for _, it := range items {
		size += len(it.Body)
	}
	if size < r.ByteLimit() || len(items) == 0 {
		return len(r.Keys)
	}
	i := 0
	for j, k := range r.Keys {
		if keys.Equal(k, items[i].Key) {
			if i++; i == len(items) {
				return j + 1
			}
		}
	}
	return len(r.Keys) // an answer not in the keys' order: take it whole
}

// ScanRequest reads a collection in key order.
type ScanRequest struct {
	DB, Table string
	Partition int
	Prefix    []keys.Part
	// After is the encoded key of the last document of the previous page.
	After []byte
	Limit int
	Read  ReadSpec
	// Query, when set, selects the documents of the collection (the
	// first prefix part) that match it, in Sort's order ("field",
	// "-field", or "": relevance for a text query, else key order);
	// After is then a token of the previous page's last hit.
	Query, Sort string
	// MaxBytes bounds the answer as a multi-get's (ByteLimit): it stops
	// after the document whose body brings the answer to MaxBytes or
	// more, with Next set if there may be more.
	MaxBytes int
	// MaxStale: as a MultiGetRequest's.
	MaxStale time.Duration
}

// MaxScanLimit bounds the documents of one scan or query answer (and the
// index hits a query collects for it), whatever the request asks: a
// router asks for a page, at most 1,000.
const MaxScanLimit = 10000

// CountLimit is how many documents an answer to r holds at most.
func (r *ScanRequest) CountLimit() int { return within(r.Limit, MaxScanLimit) }

// ByteLimit is what an answer to r holds before its last document
// (MaxBytes within MaxReadBytes); each document counts its body and
// itemOverhead.
func (r *ScanRequest) ByteLimit() int { return within(r.MaxBytes, MaxReadBytes) }

// ScanResult is one page of a collection.
type ScanResult struct {
	Items []*Item
	// Next is the encoded key to resume after, nil on the last page.
	Next []byte
	// SCN is the partition's SCN when the page was read.
	SCN storage.SCN
	// Stale, set when a slave answered, bounds how far behind its master
	// the page may be, whether or not it holds documents.
	Stale time.Duration
}

// OpKind is the kind of one write operation.
type OpKind string

// Write operation kinds.
const (
	OpPut              OpKind = "put"    // insert or replace, full key
	OpInsert           OpKind = "insert" // auto-increment the last key part
	OpPatch            OpKind = "patch"
	OpDelete           OpKind = "delete"
	OpDeleteCollection OpKind = "deleteCollection"
	// OpKeepMark raises the auto-increment mark of the collection of Key
	// (a full key, its last part the auto-incremented one) to at least
	// that last part, as if a document of that key had been deleted:
	// an insert never hands it out. A restore carries the marks of the
	// database it was backed up from this way.
	OpKeepMark OpKind = "keepMark"
)

// Op is one write operation.
type Op struct {
	Kind  OpKind
	Table string
	// Key is the full key, or for OpInsert and OpDeleteCollection the
	// leading key parts.
	Key []keys.Part
	// Version and Value: Avro bytes of the document for put and insert.
	Version int
	Value   []byte
	Patch   *Patch
	Cond    Preconditions
}

// OpResult reports one operation of a write.
type OpResult struct {
	Key      []keys.Part
	Created  bool
	ETag     string
	Modified time.Time
	// Deleted counts documents removed by delete operations.
	Deleted int
}

// WriteRequest is a transaction of one partition: every operation commits
// under one SCN, or none does.
type WriteRequest struct {
	DB        string
	Partition int
	Ops       []Op
}

// WriteResult reports a committed write.
type WriteResult struct {
	SCN     storage.SCN
	Results []OpResult
}

// OpError says which operation of a transaction failed.
type OpError struct {
	Index int
	Err   error
}

func (e *OpError) Error() string { return "operation " + strconv.Itoa(e.Index) + ": " + e.Err.Error() }
func (e *OpError) Unwrap() error { return e.Err }

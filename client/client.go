// Package client is the Go client of Cortado's document API. One Client
// type has two transports: New talks HTTP to a router; package
// client/embedded opens a data directory in-process and calls the same
// router code directly, with no network hop, for programs that use
// Cortado as a local library. This package has no server dependencies.
//
// Every call takes a context. Its deadline travels with the request
// (Request-Timeout): the router and the storage nodes stop working on a
// request once its caller has stopped waiting. Failures the server
// reports come back as *Error, which carries the RFC 9457 problem and
// the server's Retry-After, and matches the sentinel errors below with
// errors.Is. The client never retries by itself: under overload a retry
// adds load, so the caller decides, after Error.RetryAfter.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Key is a document key or key prefix: its parts in order, each a string
// or an integer.
type Key []any

func (k Key) texts() ([]string, error) {
	out := make([]string, len(k))
	for i, p := range k {
		switch v := p.(type) {
		case string:
			out[i] = v
		case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
			out[i] = fmt.Sprint(v) // canonical decimal
		case json.Number:
			out[i] = v.String()
		case float64: // from encoding/json
			if v == math.Trunc(v) && math.Abs(v) < 1<<63 {
				out[i] = strconv.FormatInt(int64(v), 10)
			} else {
				// Not an integer: sent as it is, for the server to
				// refuse as an integer key part, never truncated to
				// another key.
				out[i] = strconv.FormatFloat(v, 'g', -1, 64)
			}
		default:
			// Never its fmt form: a nil part would name the key "<nil>".
			return nil, fmt.Errorf("cortado: key part %d is a %T: key parts are strings or integers", i, p)
		}
	}
	return out, nil
}

// Database is a database definition; zero fields take server defaults.
type Database struct {
	// Partitioning is "hash" (default) or "range".
	Partitioning string `json:"partitioning,omitempty"`
	Partitions   int    `json:"partitions,omitempty"`
	// Boundaries, for range partitioning, are the partition keys (all
	// strings or all integers, ascending) at which partitions 1, 2, …
	// begin.
	Boundaries  []any  `json:"boundaries,omitempty"`
	Replicas    int    `json:"replicas,omitempty"`
	Replication string `json:"replication,omitempty"`
	// MinInSync is how many replicas, the master included, must durably
	// hold a semi-sync write before it is acknowledged (default 2 with
	// 2 replicas or more).
	MinInSync int `json:"minInSync,omitempty"`
	// Retention bounds the commit logs (docs/change-stream.md).
	Retention *Retention `json:"retention,omitempty"`
	// FailoverInSync, set only by the server, is the minInSync of before
	// a raise that failovers still count by until it settles
	// (AlterDatabase). The server ignores it in what it is sent.
	FailoverInSync int `json:"failoverInSync,omitempty"`
}

// Retention bounds a database's commit logs; zero fields take the
// server's defaults. Durations are Go durations ("24h").
type Retention struct {
	MaxAge      string `json:"maxAge,omitempty"`
	MaxBytes    int64  `json:"maxBytes,omitempty"`
	MaxSlaveLag string `json:"maxSlaveLag,omitempty"`
}

// KeyPart is one part of a table's key.
type KeyPart struct {
	Name          string `json:"name"`
	Type          string `json:"type,omitempty"` // string (default), long, int
	AutoIncrement bool   `json:"autoIncrement,omitempty"`
}

// TableSchema registers a table version: the key (required for version 1)
// and the Avro record schema.
type TableSchema struct {
	Key    []KeyPart       `json:"key,omitempty"`
	Schema json.RawMessage `json:"schema"`
}

// TableInfo describes a table.
type TableInfo struct {
	Name          string    `json:"name"`
	Key           []KeyPart `json:"key"`
	Latest        int       `json:"latest"`
	Versions      []int     `json:"versions"`
	Compatibility string    `json:"compatibility"`
}

// Conditions are conditional request headers (compare-and-swap).
type Conditions struct {
	IfMatch           string // an ETag, or "*"
	IfNoneMatch       string // an ETag, or "*" (create only)
	IfModifiedSince   time.Time
	IfUnmodifiedSince time.Time
}

// ReadOptions shape a read.
type ReadOptions struct {
	// Fields projects documents to these dot paths.
	Fields []string
	// Version asks for documents as this schema version (default latest).
	Version int
	// PartialOK lets a read of several partitions (a multi-get, a query
	// without a partition key) answer without those that are
	// unavailable: Page.MissingPartitions names them.
	PartialOK bool
	// MaxStale lets the read be answered up to that long stale
	// (Cache-Control: max-stale, in whole seconds rounded up; negative:
	// any staleness): by a router's caches for a single document, and by
	// slaves for partitions whose master cannot answer (a failover).
	// Document.Age and Page.Age then say how far behind the answer may
	// be. A single node (package client/embedded) has no slaves.
	MaxStale time.Duration
	Conditions
}

// Document is one document read.
type Document struct {
	Key           Key
	SCN           string
	ETag          string
	LastModified  time.Time
	SchemaVersion int
	// Body is the JSON document (or Avro binary from GetAvro).
	Body json.RawMessage
	// NotFound marks a key MultiGetStream found no document for (only
	// Key is set).
	NotFound bool
	// Age, on a document Get read with ReadOptions.MaxStale, is how far
	// behind it may be (the Age header) when a cache or a slave answered
	// (FromReplica "slave", or Cache "hit" or "redis"). A slave's
	// ErrNotFound comes with a Document holding only these: the
	// document may have been written within Age.
	Age         time.Duration
	FromReplica string
	Cache       string
}

// Decode unmarshals the JSON body into v.
func (d *Document) Decode(v any) error { return json.Unmarshal(d.Body, v) }

// Page is a collection page or a multi-get result.
type Page struct {
	Documents []Document
	// Missing lists multi-get keys that were not found.
	Missing []Key
	// Next continues a collection; "" on the last page.
	Next string
	SCN  string
	// MissingPartitions are the partitions a partial answer lacks
	// (ReadOptions.PartialOK).
	MissingPartitions []int
	// Replica is "slave" when slaves answered for partitions whose
	// master could not (ReadOptions.MaxStale), and Age then the most any
	// of the page's documents may be behind.
	Replica string
	Age     time.Duration
}

// WriteResult reports a committed write.
type WriteResult struct {
	SCN          string    `json:"scn"`
	Key          Key       `json:"key"`
	Created      bool      `json:"created,omitempty"`
	ETag         string    `json:"etag,omitempty"`
	LastModified time.Time `json:"lastModified,omitzero"`
	Deleted      int       `json:"deleted,omitempty"`
}

// PatchPath is the path of a Patch that names segments: record fields
// and map keys, a dot or a backslash in one escaped.
func PatchPath(segments ...string) string {
	var b strings.Builder
	for i, s := range segments {
		if i > 0 {
			b.WriteByte('.')
		}
		for j := 0; j < len(s); j++ {
			if s[j] == '.' || s[j] == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(s[j])
		}
	}
	return b.String()
}

// Patch is a partial update: set paths to values, remove map entries or
// reset fields to their default, increment numbers.
type Patch struct {
	Set       map[string]any `json:"set,omitempty"`
	Remove    []string       `json:"remove,omitempty"`
	Increment map[string]any `json:"increment,omitempty"`
}

// TxnOp is one operation of a transaction: Op is put, insert (auto
// increment), patch or delete.
type TxnOp struct {
	Op          string `json:"op"`
	Table       string `json:"table"`
	Key         Key    `json:"key"`
	Document    any    `json:"document,omitempty"`
	Patch       *Patch `json:"patch,omitempty"`
	IfMatch     string `json:"ifMatch,omitempty"`
	IfNoneMatch string `json:"ifNoneMatch,omitempty"`
}

// TxnResult reports a committed transaction.
type TxnResult struct {
	SCN     string `json:"scn"`
	Results []struct {
		Key     Key    `json:"key"`
		ETag    string `json:"etag,omitempty"`
		Deleted int    `json:"deleted,omitempty"`
	} `json:"results"`
}

// Error is a problem the server reported (RFC 9457).
type Error struct {
	Status    int    `json:"status"`
	Type      string `json:"type"`
	Title     string `json:"title"`
	Detail    string `json:"detail,omitempty"`
	Field     string `json:"field,omitempty"`
	Operation *int   `json:"operation,omitempty"`
	// Position is where in a query it went wrong (a byte offset).
	Position *int `json:"position,omitempty"`
	// RetryAfter is how long the server asked the client to wait before
	// it tries again (Retry-After), 0 if it did not say: with
	// ErrOverloaded and ErrQuotaExceeded (nothing was done) and
	// ErrUnavailable.
	RetryAfter time.Duration `json:"-"`
}

func (e *Error) Error() string {
	s := fmt.Sprintf("cortado: %d %s", e.Status, e.Title)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Is matches errors of the same problem type, so errors.Is(err,
// client.ErrNotFound) works.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Type == e.Type
}

// Sentinels for errors.Is.
var (
	ErrNotFound           = &Error{Type: "urn:cortado:problem:document-not-found"}
	ErrPreconditionFailed = &Error{Type: "urn:cortado:problem:precondition-failed"}
	ErrInvalidDocument    = &Error{Type: "urn:cortado:problem:invalid-document"}
	ErrIncompatibleSchema = &Error{Type: "urn:cortado:problem:incompatible-schema"}
	ErrNoDatabase         = &Error{Type: "urn:cortado:problem:no-such-database"}
	ErrNoTable            = &Error{Type: "urn:cortado:problem:no-such-table"}
	// ErrConflict: the request conflicts with what exists, and changed
	// nothing: a database created again with another definition, a
	// database setting that cannot change (AlterDatabase), a table's key
	// changed, auto-increment keys exhausted.
	ErrConflict = &Error{Type: "urn:cortado:problem:conflict"}
	// ErrOverloaded: the router or a storage node refused the request
	// before doing anything (its requests in progress and queue were
	// full). Safe to retry after Error.RetryAfter.
	ErrOverloaded = &Error{Type: "urn:cortado:problem:overloaded"}
	// ErrQuotaExceeded: this client (WithClientID) is over its quota;
	// nothing was done. Safe to retry after Error.RetryAfter.
	ErrQuotaExceeded = &Error{Type: "urn:cortado:problem:quota-exceeded"}
	// ErrUnavailable: the partition has no master right now, or its node
	// could not be reached. A read may be retried; a write only when the
	// title is "Storage unreachable" (never delivered), else its outcome
	// is unknown.
	ErrUnavailable = &Error{Type: "urn:cortado:problem:unavailable"}
	// ErrNotReplicated: a write committed on the master but not made
	// durable on enough replicas in time; its outcome is unknown. From a
	// read: what it would return was not yet durable on enough replicas
	// in time; retry it.
	ErrNotReplicated = &Error{Type: "urn:cortado:problem:not-replicated"}
	// ErrLimitExceeded: the registry holds the most databases'
	// partitions, tables of the database, versions of the table or
	// schema text it takes; nothing was created.
	ErrLimitExceeded = &Error{Type: "urn:cortado:problem:limit-exceeded"}
	// ErrDeadlineExceeded: the request's deadline (the context's, sent as
	// Request-Timeout, else the router's default) passed in the server.
	// A write's outcome is unknown.
	ErrDeadlineExceeded = &Error{Type: "urn:cortado:problem:deadline-exceeded"}
	// ErrNotModified is returned by reads whose If-None-Match or
	// If-Modified-Since condition held (HTTP 304).
	ErrNotModified = errors.New("cortado: not modified")
)

// Transport carries a Client's calls to a router: over HTTP (New), or
// in-process (package client/embedded, which brings the server with it,
// so that HTTP users of this package do not). Errors a router reports come
// back as *Error. Collection and MultiGet return the page's JSON body and
// the X-Cortado-SCN it was read at.
type Transport interface {
	CreateDatabase(ctx context.Context, name string, body []byte) error
	// AlterDatabase sends a JSON merge patch of a database's definition.
	AlterDatabase(ctx context.Context, name string, patch []byte) error
	RegisterSchema(ctx context.Context, db, table string, body []byte) (int, error)
	TableInfo(ctx context.Context, db, table string) ([]byte, error)
	DatabaseInfo(ctx context.Context, db string) ([]byte, error)
	// Databases is a page of the databases after the one named after,
	// at most limit (0: the router's default).
	Databases(ctx context.Context, after string, limit int) ([]byte, error)
	SetCompatibility(ctx context.Context, db, table string, body []byte) error
	SchemaVersion(ctx context.Context, db, table string, version int) ([]byte, error)
	Get(ctx context.Context, db, table string, key []string, o *ReadOptions, avro bool) (*Document, error)
	Collection(ctx context.Context, db, table string, prefix []string, limit int, next string, o *ReadOptions) (body []byte, scn string, err error)
	MultiGet(ctx context.Context, db, table string, keys [][]string, o *ReadOptions) (body []byte, scn string, err error)
	// MultiGetLines streams a multi-get's lines (Accept:
	// application/x-ndjson), one JSON object each, to fn until the
	// answer ends or fn fails. A line is valid only during fn's call.
	MultiGetLines(ctx context.Context, db, table string, keys [][]string, o *ReadOptions, fn func(line []byte) error) error
	Query(ctx context.Context, db, table string, prefix []string, q *Query, o *ReadOptions) (body []byte, scn string, err error)
	Put(ctx context.Context, db, table string, key []string, body []byte, c *Conditions) (*WriteResult, error)
	Insert(ctx context.Context, db, table string, prefix []string, body []byte) (*WriteResult, error)
	Patch(ctx context.Context, db, table string, key []string, body []byte, c *Conditions) (*WriteResult, error)
	Delete(ctx context.Context, db, table string, key []string, c *Conditions) (*WriteResult, error)
	Txn(ctx context.Context, db, partitionKey string, body []byte) ([]byte, error)
	// Changes streams the change stream's events, one JSON object each,
	// to fn until ctx ends, the stream breaks, or fn fails. An event is
	// valid only during fn's call.
	Changes(ctx context.Context, db string, query url.Values, fn func(event []byte) error) error
	// Backup streams a backup's lines to fn until the backup ends (its
	// last line) or fails (an "error" line, or the stream breaking).
	Backup(ctx context.Context, db string, query url.Values, fn func(line []byte) error) error
	// Restore sends row and mark lines of a backup and returns the
	// answer ({"rows","marks","commits"}).
	Restore(ctx context.Context, db string, body []byte) ([]byte, error)
	Close() error
}

// NewWithTransport returns a Client that calls through t.
func NewWithTransport(t Transport) *Client { return &Client{t: t, local: newLocalSchemas()} }

// Client is a Cortado client. It is safe for concurrent use.
type Client struct {
	t     Transport
	local *localSchemas
}

// Close releases the client (and, for an embedded client, closes the
// data directory).
func (c *Client) Close() error { return c.t.Close() }

// CreateDatabase creates a database; creating it again with the same
// definition succeeds.
func (c *Client) CreateDatabase(ctx context.Context, name string, def Database) error {
	body, _ := json.Marshal(def)
	return c.t.CreateDatabase(ctx, name, body)
}

// AlterDatabase changes a database's settings: those set in change (its
// zero fields are left as they are), of which only Replicas, Retention
// and MinInSync (upwards only) may change once the database exists
// (another is an ErrConflict). In a cluster the replicas are then added,
// or the extra ones dropped once the others hold all they hold, as when
// nodes come and go; a raised MinInSync counts acknowledgements at once,
// and failovers once every replica set holds the writes of before it
// (until then Database shows it with FailoverInSync). Database shows the
// new definition at once, `cortado cluster status` the replicas as they
// move.
func (c *Client) AlterDatabase(ctx context.Context, name string, change Database) error {
	body, _ := json.Marshal(change)
	return c.t.AlterDatabase(ctx, name, body)
}

// SetCompatibility sets the compatibility level a table's next schema
// versions must meet: BACKWARD, FORWARD, FULL (the default), NONE, or a
// _TRANSITIVE variant (docs/schemas.md).
func (c *Client) SetCompatibility(ctx context.Context, db, table, level string) error {
	body, _ := json.Marshal(map[string]string{"compatibility": level})
	return c.t.SetCompatibility(ctx, db, table, body)
}

// RegisterSchema registers the next schema version of a table (creating
// the table at version 1) and returns the version number.
func (c *Client) RegisterSchema(ctx context.Context, db, table string, s TableSchema) (int, error) {
	body, err := json.Marshal(s)
	if err != nil {
		return 0, err
	}
	return c.t.RegisterSchema(ctx, db, table, body)
}

// DatabaseInfo describes a database: its definition and, from
// Database, its tables.
type DatabaseInfo struct {
	Name string `json:"name"`
	Database
	Tables []TableInfo `json:"tables,omitempty"`
}

// DatabaseList is a page of databases, in name order (Databases); Next,
// when set, is the after of the next page.
type DatabaseList struct {
	Databases []DatabaseInfo `json:"databases"`
	Next      string         `json:"next,omitempty"`
}

// Database describes a database and its tables.
func (c *Client) Database(ctx context.Context, name string) (*DatabaseInfo, error) {
	b, err := c.t.DatabaseInfo(ctx, name)
	if err != nil {
		return nil, err
	}
	var d DatabaseInfo
	return &d, json.Unmarshal(b, &d)
}

// Databases lists the databases whose names follow after (all, from
// ""), in name order, at most limit of them (0: the router's default,
// 1,000; at most 10,000), without their tables.
func (c *Client) Databases(ctx context.Context, after string, limit int) (*DatabaseList, error) {
	b, err := c.t.Databases(ctx, after, limit)
	if err != nil {
		return nil, err
	}
	var l DatabaseList
	return &l, json.Unmarshal(b, &l)
}

// Table describes a table.
func (c *Client) Table(ctx context.Context, db, table string) (*TableInfo, error) {
	b, err := c.t.TableInfo(ctx, db, table)
	if err != nil {
		return nil, err
	}
	var ti TableInfo
	return &ti, json.Unmarshal(b, &ti)
}

// Schema returns one version of a table's Avro schema.
func (c *Client) Schema(ctx context.Context, db, table string, version int) (json.RawMessage, error) {
	b, err := c.t.SchemaVersion(ctx, db, table, version)
	if err != nil {
		return nil, err
	}
	var v struct {
		Schema json.RawMessage `json:"schema"`
	}
	return v.Schema, json.Unmarshal(b, &v)
}

// Get reads one document as JSON.
func (c *Client) Get(ctx context.Context, db, table string, key Key, o *ReadOptions) (*Document, error) {
	texts, err := key.texts()
	if err != nil {
		return nil, err
	}
	return withKey(c.t.Get(ctx, db, table, texts, o, false))(key)
}

// withKey sets the key of a read to the caller's.
func withKey(d *Document, err error) func(Key) (*Document, error) {
	return func(k Key) (*Document, error) {
		if d != nil {
			d.Key = k
		}
		return d, err
	}
}

func writeKey(w *WriteResult, err error) func(Key) (*WriteResult, error) {
	return func(k Key) (*WriteResult, error) {
		if w != nil {
			w.Key = k
		}
		return w, err
	}
}

// normalize makes integer key parts int64 whatever the transport.
func (k Key) normalize() Key {
	for i, p := range k {
		if n, ok := p.(json.Number); ok {
			if v, err := n.Int64(); err == nil {
				k[i] = v
			}
		}
	}
	return k
}

// GetAvro reads one document as Avro binary of o.Version (0: as written;
// the version is in Document.SchemaVersion).
func (c *Client) GetAvro(ctx context.Context, db, table string, key Key, o *ReadOptions) (*Document, error) {
	texts, err := key.texts()
	if err != nil {
		return nil, err
	}
	return withKey(c.t.Get(ctx, db, table, texts, o, true))(key)
}

// Collection reads a page of the documents under a key prefix, in key
// order; pass the previous page's Next to continue.
func (c *Client) Collection(ctx context.Context, db, table string, prefix Key, limit int, next string, o *ReadOptions) (*Page, error) {
	texts, err := prefix.texts()
	if err != nil {
		return nil, err
	}
	return page(c.t.Collection(ctx, db, table, texts, limit, next, o))
}

// Query selects documents of a document group by their indexed fields
// (docs/api.md, "Queries").
type Query struct {
	// Where is the query: field:value, field:[a TO b], words and
	// "phrases" of text fields, AND, OR, NOT, parentheses.
	Where string
	// Sort is "field" or "-field" (an attribute-indexed field), or ""
	// (relevance for a text query, else key order).
	Sort  string
	Limit int
	// Next is the previous page's Next, to continue.
	Next string
}

// Query reads a page of the documents of a document group (prefix: at
// least the partition key) that match q.
func (c *Client) Query(ctx context.Context, db, table string, prefix Key, q Query, o *ReadOptions) (*Page, error) {
	texts, err := prefix.texts()
	if err != nil {
		return nil, err
	}
	return page(c.t.Query(ctx, db, table, texts, &q, o))
}

// MultiGet reads documents by full keys; missing keys are in Page.Missing.
func (c *Client) MultiGet(ctx context.Context, db, table string, keys []Key, o *ReadOptions) (*Page, error) {
	texts := make([][]string, len(keys))
	for i, k := range keys {
		var err error
		if texts[i], err = k.texts(); err != nil {
			return nil, err
		}
	}
	return page(c.t.MultiGet(ctx, db, table, texts, o))
}

// MultiGetStream reads documents by full keys as MultiGet does, but
// yields them as their partitions answer (Accept: application/x-ndjson):
// the first arrive before the slowest partition has answered, and no
// page is held, so it also reads documents too large together for one
// page. A partition's keys come in request order, partitions in the
// order they answered. A key without a document yields a Document with
// only Key set and NotFound true. With o.PartialOK, partitions that did
// not answer end the iteration with a *PartialError naming them; any
// other failure ends it with that error (io.ErrUnexpectedEOF when the
// answer broke off before its end).
func (c *Client) MultiGetStream(ctx context.Context, db, table string, keys []Key, o *ReadOptions) iter.Seq2[*Document, error] {
	return func(yield func(*Document, error) bool) {
		texts := make([][]string, len(keys))
		for i, k := range keys {
			var err error
			if texts[i], err = k.texts(); err != nil {
				yield(nil, err)
				return
			}
		}
		stopped := errors.New("stopped")
		ended := false
		err := c.t.MultiGetLines(ctx, db, table, texts, o, func(line []byte) error {
			var l struct {
				docJSON
				Missing           bool   `json:"missing"`
				End               bool   `json:"end"`
				MissingPartitions []int  `json:"missingPartitions"`
				Error             *Error `json:"error"`
			}
			dec := json.NewDecoder(bytesReader(line))
			dec.UseNumber()
			if err := dec.Decode(&l); err != nil {
				return fmt.Errorf("cortado: bad multi-get line: %w", err)
			}
			switch {
			case l.Error != nil:
				return l.Error
			case l.End:
				ended = true
				if len(l.MissingPartitions) > 0 {
					return &PartialError{Partitions: l.MissingPartitions}
				}
				return nil
			case l.Missing:
				if !yield(&Document{Key: l.Key.normalize(), NotFound: true}, nil) {
					return stopped
				}
			default:
				if !yield(l.document(), nil) {
					return stopped
				}
			}
			return nil
		})
		switch {
		case errors.Is(err, stopped):
		case err != nil:
			yield(nil, err)
		case !ended:
			yield(nil, io.ErrUnexpectedEOF)
		}
	}
}

// PartialError ends a partial multi-get stream (ReadOptions.PartialOK):
// these partitions did not answer, so their keys were neither yielded
// nor reported missing (but for those a partition answered before it
// failed partway through an answer of more than 1 MiB).
type PartialError struct {
	Partitions []int
}

func (e *PartialError) Error() string {
	return fmt.Sprintf("cortado: partitions %v did not answer", e.Partitions)
}

func marshalDoc(doc any) ([]byte, error) {
	switch d := doc.(type) {
	case json.RawMessage:
		return d, nil
	case []byte:
		return d, nil
	}
	return json.Marshal(doc)
}

// Put inserts or replaces a document (doc is marshalled to JSON; a
// json.RawMessage is sent as is).
func (c *Client) Put(ctx context.Context, db, table string, key Key, doc any, cond *Conditions) (*WriteResult, error) {
	body, err := marshalDoc(doc)
	if err != nil {
		return nil, err
	}
	texts, err := key.texts()
	if err != nil {
		return nil, err
	}
	return writeKey(c.t.Put(ctx, db, table, texts, body, cond))(key)
}

// Insert adds a document under a collection with the next auto-increment
// key; the result's Key is the new key.
func (c *Client) Insert(ctx context.Context, db, table string, prefix Key, doc any) (*WriteResult, error) {
	body, err := marshalDoc(doc)
	if err != nil {
		return nil, err
	}
	texts, err := prefix.texts()
	if err != nil {
		return nil, err
	}
	w, err := c.t.Insert(ctx, db, table, texts, body)
	if w != nil {
		w.Key = w.Key.normalize()
	}
	return w, err
}

// Patch partially updates a document.
func (c *Client) Patch(ctx context.Context, db, table string, key Key, p Patch, cond *Conditions) (*WriteResult, error) {
	body, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	texts, err := key.texts()
	if err != nil {
		return nil, err
	}
	return writeKey(c.t.Patch(ctx, db, table, texts, body, cond))(key)
}

// Delete removes a document (full key) or a collection (partial key).
func (c *Client) Delete(ctx context.Context, db, table string, key Key, cond *Conditions) (*WriteResult, error) {
	texts, err := key.texts()
	if err != nil {
		return nil, err
	}
	return writeKey(c.t.Delete(ctx, db, table, texts, cond))(key)
}

// Txn applies ops to one document group atomically.
func (c *Client) Txn(ctx context.Context, db string, partitionKey any, ops []TxnOp) (*TxnResult, error) {
	body, err := json.Marshal(map[string]any{"ops": ops})
	if err != nil {
		return nil, err
	}
	pk, err := Key{partitionKey}.texts()
	if err != nil {
		return nil, err
	}
	b, err := c.t.Txn(ctx, db, pk[0], body)
	if err != nil {
		return nil, err
	}
	var r TxnResult
	return &r, json.Unmarshal(b, &r)
}

// docJSON is the wire form of a document in a page or a streamed
// multi-get.
type docJSON struct {
	Key          Key             `json:"key"`
	ETag         string          `json:"etag"`
	SCN          string          `json:"scn"`
	LastModified time.Time       `json:"lastModified"`
	Document     json.RawMessage `json:"document"`
}

func (d *docJSON) document() *Document {
	return &Document{Key: d.Key.normalize(), SCN: d.SCN, ETag: d.ETag, LastModified: d.LastModified, Body: d.Document}
}

// pageJSON is the wire form of a Page.
type pageJSON struct {
	Documents         []docJSON `json:"documents"`
	Missing           []Key     `json:"missing"`
	Next              string    `json:"next"`
	MissingPartitions []int     `json:"missingPartitions"`
	Replica           string    `json:"replica"`
	Age               int64     `json:"age"`
}

func parsePage(b []byte, scn string) (*Page, error) {
	var pj pageJSON
	if !scanPage(b, &pj) {
		pj = pageJSON{}
		dec := json.NewDecoder(bytesReader(b))
		dec.UseNumber()
		if err := dec.Decode(&pj); err != nil {
			return nil, fmt.Errorf("cortado: bad page: %w", err)
		}
	}
	p := &Page{Next: pj.Next, SCN: scn, MissingPartitions: pj.MissingPartitions, Replica: pj.Replica, Age: seconds(pj.Age)}
	for _, k := range pj.Missing {
		p.Missing = append(p.Missing, k.normalize())
	}
	for _, d := range pj.Documents {
		p.Documents = append(p.Documents, *d.document())
	}
	return p, nil
}

// seconds is an Age of n seconds: none below 0, and at most what a
// Duration holds.
func seconds(n int64) time.Duration {
	return time.Duration(min(max(n, 0), math.MaxInt64/int64(time.Second))) * time.Second
}

// page parses a transport's page.
func page(body []byte, scn string, err error) (*Page, error) {
	if err != nil {
		return nil, err
	}
	return parsePage(body, scn)
}

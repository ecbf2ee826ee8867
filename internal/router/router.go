package router

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cortado-db/cortado/internal/cachetier"
	"github.com/cortado-db/cortado/internal/changes"
	"github.com/cortado-db/cortado/internal/index"
	"github.com/cortado-db/cortado/internal/keycache"
	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
)

// MaxBodyBytesLimit is the largest request body a router can be set to
// take: a document that large replaced by another is a commit within
// storage.MaxCommitBytes.
const MaxBodyBytesLimit = 16 << 20

// Options configures a Router. Zero values take the documented defaults.
type Options struct {
	// MaxBodyBytes caps request bodies (default 2 MiB, at most
	// MaxBodyBytesLimit: more is taken as that); larger is 413.
	MaxBodyBytes int64
	// BodyTimeout is how long a request body may take to arrive
	// (default 30s); a slower client is cut off with 408.
	BodyTimeout time.Duration
	// MaxResponseBytes caps response bodies (default 2 MiB); larger is 413
	// with a hint to use projection.
	MaxResponseBytes int
	// DefaultLimit is a collection page's size when the request sets none
	// (default 100); MaxLimit caps it (default 1000).
	DefaultLimit, MaxLimit int
	// Hedge configures hedged reads (reads that accept a slave's answer).
	Hedge HedgeOptions
	// WriteTimeout is how long a client may take to read a response
	// (default 30 s) after the request's deadline — for the change
	// stream, after each write — before its connection is closed: a
	// client that stops reading holds nothing of the server for longer.
	WriteTimeout time.Duration
	// MaxStreams bounds the change streams and backups open at once
	// (default 1024; more are refused with 503 overloaded).
	MaxStreams int
	// Cache is the hot-key cache of reads that accept staleness
	// (keycache.Options: on by default; MaxBytes negative: off).
	Cache keycache.Options
	// MaxRestores bounds the restore requests (POST /{db}/_restore)
	// served at once (default 4; more are refused with 503 overloaded):
	// each holds its body, up to RestoreBodyBytes, and its checked
	// documents in memory.
	MaxRestores int
}

// Defaults of Options.
const (
	DefaultWriteTimeout = 30 * time.Second
	DefaultMaxStreams   = 1024
	DefaultMaxRestores  = 4
)

// WithDefaults returns o with its zero values replaced by the defaults.
func (o Options) WithDefaults() Options {
	o.fill()
	return o
}

func (o *Options) fill() {
	if o.WriteTimeout == 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.MaxStreams == 0 {
		o.MaxStreams = DefaultMaxStreams
	}
	if o.MaxRestores == 0 {
		o.MaxRestores = DefaultMaxRestores
	}
	if o.BodyTimeout == 0 {
		o.BodyTimeout = 30 * time.Second
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = 2 << 20
	}
	o.MaxBodyBytes = min(o.MaxBodyBytes, MaxBodyBytesLimit)
	if o.MaxResponseBytes == 0 {
		o.MaxResponseBytes = 2 << 20
	}
	if o.DefaultLimit == 0 {
		o.DefaultLimit = 100
	}
	if o.MaxLimit == 0 {
		o.MaxLimit = 1000
	}
}

// Backend finds the storage node serving a partition.
type Backend interface {
	Node(db string, partition int) (node.Service, error)
}

// Router serves the document API.
type Router struct {
	reg     *registry.Registry
	plans   *schema.Plans
	backend Backend
	opts    Options
	log     *slog.Logger
	changes *changes.Feed // GET /{db}/_changes; nil: not served
	// Multi-partition reads by quality of service (FanOutStats).
	fanFull, fanPartial, fanFailed atomic.Uint64
	hedges                         *hosts
	streams                        atomic.Int64 // change streams and backups open
	restores                       atomic.Int64 // restore requests being served
	cache                          *keycache.Cache
	tier                           *cachetier.Tier
}

// New returns a router.
func New(reg *registry.Registry, plans *schema.Plans, backend Backend, opts Options, log *slog.Logger) *Router {
	opts.fill()
	return &Router{reg: reg, plans: plans, backend: backend, opts: opts, log: log, hedges: newHosts(opts.Hedge), cache: keycache.New(opts.Cache)}
}

// Options returns the router's effective options.
func (r *Router) Options() Options { return r.opts }

// Format says how a read wants documents.
type Format struct {
	// Avro asks for Avro binary instead of JSON.
	Avro bool
	// Version is the schema version to return: 0 is the latest for JSON;
	// for Avro, 0 means each document as written.
	Version int
	Fields  []string
	// MaxStale, when positive, lets a slave answer a document read the
	// master cannot (Cache-Control: max-stale), if it heard from the
	// master within that long.
	MaxStale time.Duration
	// PartialOK lets a multi-partition read (a multi-get, a query
	// without a partition key) answer without the partitions that are
	// unavailable, naming them (Prefer: partial-ok), instead of 503.
	PartialOK bool
	// Lines streams a multi-get as NDJSON lines, partition by partition
	// (Accept: application/x-ndjson; see StreamMultiGet). Other reads
	// refuse it.
	Lines bool
}

// Document is one rendered document.
type Document struct {
	Key      []keys.Part
	SCN      storage.SCN
	ETag     string
	Modified time.Time
	// Body is JSON, or Avro of schema BodyVersion.
	Body        []byte
	BodyVersion int
	// FromSlave is set when a slave answered (max-stale), FromCache when
	// the router's hot-key cache did, FromTier when the Redis cache tier
	// did; Stale bounds how far behind the master the answer may be.
	FromSlave, FromCache, FromTier bool
	Stale                          time.Duration
}

func (d *Document) setSource(s source) {
	d.FromSlave, d.FromCache, d.FromTier = s == fromSlave, s == fromHotKeys, s == fromTier
}

// Page is a rendered multi-document response (collection or multi-get).
type Page struct {
	// Body is the JSON page: {"documents":[…],"missing":[…],"next":"…"}.
	Body []byte
	// SCN is set when the page came from one partition.
	SCN storage.SCN
	// Documents counts the documents in Body.
	Documents int
	// MissingPartitions are the partitions a partial answer lacks
	// (Format.PartialOK).
	MissingPartitions []int
	// FromSlave says slaves answered for partitions whose master could
	// not (Format.MaxStale); Stale is then the most any document of the
	// page may be behind.
	FromSlave bool
	Stale     time.Duration
	// buf is the pooled buffer Body was rendered into (Release).
	buf *[]byte
}

// fromSlave records that slaves answered for some of the page's
// partitions, and the most the page may be behind: stale, the most any
// answering slave said its answer may be (with or without documents), or
// more if one of items says so (each slave's documents carry how long
// since it heard from its master), in the page's JSON too
// ("replica":"slave","age":seconds).
func (p *Page) fromSlave(items []*node.Item, stale time.Duration) {
	p.FromSlave, p.Stale = true, max(p.Stale, stale)
	for _, it := range items {
		p.Stale = max(p.Stale, it.Stale)
	}
	p.Body = fmt.Appendf(p.Body[:len(p.Body)-1], `,"replica":"slave","age":%d}`, AgeSeconds(p.Stale))
}

// setMissingPartitions records the partitions a partial page lacks, in
// the page's JSON ("missingPartitions") too.
func (p *Page) setMissingPartitions(parts []int) {
	if len(parts) == 0 {
		return
	}
	slices.Sort(parts)
	p.MissingPartitions = parts
	b := append(p.Body[:len(p.Body)-1], `,"missingPartitions":[`...)
	p.Body = append(appendInts(b, parts), "]}"...)
}

// appendInts appends ns to b, separated by commas: a JSON array's
// elements, or a header's list.
func appendInts(b []byte, ns []int) []byte {
	for i, n := range ns {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(n), 10)
	}
	return b
}

// WriteResult reports a committed write.
type WriteResult struct {
	SCN      storage.SCN
	Key      []keys.Part
	Created  bool
	ETag     string
	Modified time.Time
	Deleted  int
	// Body is the JSON response body, if the call has one.
	Body []byte
}

type target struct {
	db    *schema.Database
	table *schema.Table
	key   []keys.Part
	part  int
}

// resolve finds the database, table, key and partition of a request. A key
// must have at least the partition key unless allowEmpty.
func (r *Router) resolve(db, table string, keyText []string, allowEmpty bool) (*target, error) {
	d, t, err := r.tableOf(db, table)
	if err != nil {
		return nil, err
	}
	key, err := t.ParseKey(keyText)
	if err != nil {
		return nil, &keyError{err}
	}
	tg := &target{db: d, table: t, key: key, part: -1}
	if len(key) > 0 {
		tg.part = d.PartitionOf(key[0])
	} else if !allowEmpty {
		return nil, &keyError{fmt.Errorf("table %s needs at least its partition key %s", t.Name, t.Key[0].Name)}
	}
	return tg, nil
}

// tableOf finds a database and one of its tables.
func (r *Router) tableOf(db, table string) (*schema.Database, *schema.Table, error) {
	d, err := r.reg.Database(db)
	if err != nil {
		return nil, nil, err
	}
	t, err := r.reg.Table(db, table)
	if err != nil {
		return nil, nil, err
	}
	return d, t, nil
}

func (r *Router) full(tg *target) bool { return len(tg.key) == len(tg.table.Key) }

func (r *Router) nodeFor(tg *target) (node.Service, error) {
	return r.backend.Node(tg.db.Name, tg.part)
}

// readSpec checks a format against the table and turns it into what the
// node needs.
func (r *Router) readSpec(t *schema.Table, f Format) (node.ReadSpec, error) {
	v := f.Version
	if v == 0 && !f.Avro {
		v = t.Latest().Number
	}
	if v != 0 && t.Version(v) == nil {
		return node.ReadSpec{}, fmt.Errorf("table %s version %d: %w", t.Name, v, registry.ErrNoVersion)
	}
	if len(f.Fields) > 0 {
		// Check the paths once against the version asked for (or the
		// latest), so a bad path is a 400 even when nothing is found.
		check := v
		if check == 0 {
			check = t.Latest().Number
		}
		if _, err := r.plans.Reader(t, check, f.Fields); err != nil {
			return node.ReadSpec{}, &projectionError{err}
		}
	}
	return node.ReadSpec{Version: v, Fields: f.Fields}, nil
}

// document is it as a response in format f. A JSON body is appended to
// dst (a pooled buffer, or nil); an Avro one is the stored bytes
// themselves.
func (r *Router) document(t *schema.Table, it *node.Item, f Format, dst []byte) (*Document, error) {
	d := &Document{Key: it.Key, SCN: it.SCN, ETag: it.ETag, Modified: it.Modified, BodyVersion: it.BodyVersion}
	if f.Avro {
		d.Body = it.Body
		return d, nil
	}
	var err error
	if d.Body, err = r.appendJSON(dst, t, it, f); err != nil {
		return nil, err
	}
	return d, nil
}

// appendJSON appends it's document as JSON (in f's projection) to dst.
func (r *Router) appendJSON(dst []byte, t *schema.Table, it *node.Item, f Format) ([]byte, error) {
	rd, err := r.plans.Reader(t, it.BodyVersion, f.Fields)
	if err != nil {
		return nil, err
	}
	return rd.JSON.Append(dst, it.Body)
}

// Get reads one document by full key.
func (r *Router) Get(ctx context.Context, db, table string, key []string, f Format, cond node.Preconditions) (*Document, error) {
	tg, err := r.resolve(db, table, key, false)
	if err != nil {
		return nil, err
	}
	return r.get(ctx, tg, f, cond, nil)
}

// get reads the document tg names; a JSON body is appended to dst (see
// document).
func (r *Router) get(ctx context.Context, tg *target, f Format, cond node.Preconditions, dst []byte) (_ *Document, err error) {
	defer readFailed(&err)
	if !r.full(tg) {
		return nil, &keyError{fmt.Errorf("a document read needs the full key (%d parts)", len(tg.table.Key))}
	}
	spec, err := r.readSpec(tg.table, f)
	if err != nil {
		return nil, err
	}
	n, err := r.nodeFor(tg)
	if err != nil {
		return nil, err
	}
	// A projection is a representation of its own, with its own ETag
	// (the document's plus a suffix naming the fields): conditions name
	// it, and are checked against the document's.
	suffix := schema.ProjectionSuffix(f.Fields)
	if suffix != "" {
		cond.IfNoneMatch = forProjection(cond.IfNoneMatch, suffix)
		cond.IfMatch = forProjection(cond.IfMatch, suffix)
	}
	req := node.GetRequest{DB: tg.db.Name, Table: tg.table.Name, Partition: tg.part, Key: tg.key, Read: spec, Cond: cond}
	var it *node.Item
	var from source
	switch {
	case f.MaxStale > 0 && len(cond.IfMatch) == 0 && cond.IfUnmodifiedSince.IsZero() && (r.cache != nil || r.tier != nil):
		// A plain or revalidating read (If-None-Match,
		// If-Modified-Since): the caches answer it, 304 or 200, as
		// RFC 9111 §4.3.2 lets a cache holding a fresh response.
		it, from, err = r.cachedGet(ctx, n, tg, req, f.MaxStale)
	case f.MaxStale > 0:
		var slave bool
		it, slave, err = r.hedgedGet(ctx, n, req, f.MaxStale)
		from = sourceOf(slave)
	default:
		it, err = n.Get(ctx, req)
	}
	if err != nil {
		if it != nil { // not modified, or a slave's not found: headers only
			d := &Document{Key: it.Key, SCN: it.SCN, ETag: schema.WithSuffix(it.ETag, suffix), Modified: it.Modified, Stale: it.Stale}
			d.setSource(from)
			return d, err
		}
		return nil, err
	}
	doc, err := r.document(tg.table, it, f, dst)
	if err != nil {
		return nil, err
	}
	doc.ETag = schema.WithSuffix(doc.ETag, suffix)
	doc.Stale = it.Stale
	doc.setSource(from)
	if len(doc.Body) > r.opts.MaxResponseBytes {
		return nil, &responseTooLarge{size: len(doc.Body), limit: r.opts.MaxResponseBytes}
	}
	return doc, nil
}

// forProjection maps the entity tags of a projected read's conditions to
// the document's: a tag of this projection becomes the document's, a tag
// of the whole document or another projection matches nothing ("*"
// stays).
func forProjection(tags []string, suffix string) []string {
	var out []string
	for _, t := range tags {
		switch {
		case t == "*":
			out = append(out, t)
		case strings.HasSuffix(t, suffix+`"`):
			out = append(out, strings.TrimSuffix(t, suffix+`"`)+`"`)
		default:
			out = append(out, `"-"`) // never a document's ETag
		}
	}
	return out
}

// Collection reads one page of the documents under a partial key, in key
// order. token is the previous page's "next", or "".
func (r *Router) Collection(ctx context.Context, db, table string, prefix []string, limit int, token string, f Format) (_ *Page, err error) {
	defer readFailed(&err)
	tg, err := r.resolve(db, table, prefix, false)
	if err != nil {
		return nil, err
	}
	req, err := r.scanRequest(tg, f, limit, token, nil)
	if err != nil {
		return nil, err
	}
	if parts, err := keys.Decode(req.After); req.After != nil && (err != nil || len(parts) != len(tg.table.Key)) {
		return nil, &keyError{fmt.Errorf("bad continuation token")}
	} else if req.After != nil && !keys.Equal(parts[:len(tg.key)], tg.key) {
		// Another collection's token would start this one over, or
		// end it at once, as if it were read to its end.
		return nil, &keyError{fmt.Errorf("bad continuation token: it continues another collection")}
	}
	res, slave, err := r.scanOne(ctx, tg, req)
	if err != nil {
		return nil, err
	}
	page, err := r.scanPage(tg, res, nil, f, nil)
	if err == nil && slave {
		page.fromSlave(res.Items, res.Stale)
	}
	return page, err
}

// scanOne asks the partition tg names for one page, of its master or,
// when the read accepts staleness and the master cannot answer, of a
// slave (onSlaves; slave says one answered). A master of another process
// that is slow to answer such a read is hedged (hedging).
func (r *Router) scanOne(ctx context.Context, tg *target, req node.ScanRequest) (res *node.ScanResult, slave bool, err error) {
	n, err := r.nodeFor(tg)
	if err == nil {
		res, err = r.hedged(tg.db.Name, tg.part, n, req.MaxStale, &slave).Scan(ctx, req)
	}
	if err != nil {
		slave, err = r.onSlaves(tg.db.Name, tg.part, req.MaxStale, err, func(s node.Service) (err error) {
			res, err = s.Scan(ctx, req)
			return err
		})
	}
	return res, slave, err
}

// scanRequest is the node request of one page of a collection or query:
// the read format, the page size within the router's bounds, and the
// previous page's token (base64 of the position it ended at).
//
// A query's token is bound to its query (queryBinding): it begins with
// bind, which is checked and taken off here.
func (r *Router) scanRequest(tg *target, f Format, limit int, token string, bind []byte) (node.ScanRequest, error) {
	if f.Avro {
		return node.ScanRequest{}, errAvroMulti
	}
	spec, err := r.readSpec(tg.table, f)
	if err != nil {
		return node.ScanRequest{}, err
	}
	if limit <= 0 {
		limit = r.opts.DefaultLimit
	}
	if limit > r.opts.MaxLimit {
		return node.ScanRequest{}, malformed("Bad query parameter", fmt.Sprintf("limit %d is over the maximum %d", limit, r.opts.MaxLimit))
	}
	var after []byte
	if token != "" {
		if after, err = base64.RawURLEncoding.DecodeString(token); err != nil {
			return node.ScanRequest{}, &keyError{fmt.Errorf("bad continuation token")}
		}
		if bind != nil {
			if !bytes.HasPrefix(after, bind) {
				// Another query's position would resume this one at a
				// place of another order or group: a page skipped or
				// read again, or an empty one taken for the end.
				return node.ScanRequest{}, &keyError{fmt.Errorf("bad continuation token: it continues another query (the table, key prefix, query and sort must be the same)")}
			}
			after = after[len(bind):]
		}
	}
	// A node's answer stops at half the page's bound in Avro bytes (the
	// JSON of text is about as large, with field names larger), with a
	// next token: a page of large documents holds fewer than limit, where
	// before it was refused as too large (it still is when its JSON
	// exceeds the bound), and a node holds no more for it.
	return node.ScanRequest{DB: tg.db.Name, Table: tg.table.Name, Partition: tg.part, Prefix: tg.key, After: after, Limit: limit, Read: spec,
		MaxBytes: max(r.opts.MaxResponseBytes/2, 1), MaxStale: f.MaxStale}, nil
}

// scanPage renders a page of scan results, with its token and, for a
// partial answer, the partitions it lacks.
func (r *Router) scanPage(tg *target, res *node.ScanResult, missing []int, f Format, bind []byte) (*Page, error) {
	next := ""
	if res.Next != nil {
		next = base64.RawURLEncoding.EncodeToString(append(bind[:len(bind):len(bind)], res.Next...))
	}
	page, err := r.renderPage(tg.table, res.Items, nil, next, f)
	if err != nil {
		return nil, err
	}
	page.SCN = res.SCN
	page.setMissingPartitions(missing)
	return page, nil
}

// Query reads one page of the documents of a document group (prefix: at
// least the partition key) that match query, in sort's order ("field",
// "-field", or "": relevance for a text query, else key order). token is
// the previous page's "next", or "". The query is parsed and planned here
// first, so a bad one is refused with its position before any node is
// asked. Without a partition key every partition is asked (queryAll).
func (r *Router) Query(ctx context.Context, db, table string, prefix []string, query, sort string, limit int, token string, f Format) (_ *Page, err error) {
	defer readFailed(&err)
	tg, err := r.resolve(db, table, prefix, true)
	if err != nil {
		return nil, err
	}
	if f.Avro {
		return nil, errAvroMulti
	}
	// Whether an index is complete is each partition's to say (it knows
	// which schema versions its documents have): none is building here.
	_, order, err := node.PlanQuery(tg.table, query, sort, map[int]uint64{}, nil)
	if err != nil {
		return nil, err
	}
	bind := queryBinding(tg, query, sort)
	req, err := r.scanRequest(tg, f, limit, token, bind)
	if err != nil {
		return nil, err
	}
	req.Query, req.Sort = query, sort
	var res *node.ScanResult
	var missing []int
	var slave bool
	if len(tg.key) == 0 {
		res, missing, slave, err = r.queryAll(ctx, tg, req, order, f.PartialOK)
	} else {
		res, slave, err = r.scanOne(ctx, tg, req)
	}
	if err != nil {
		return nil, err
	}
	page, err := r.scanPage(tg, res, missing, f, bind)
	if err == nil && slave {
		page.fromSlave(res.Items, res.Stale)
	}
	return page, err
}

// queryBinding is what a query's page tokens begin with: four bytes of a
// checksum of the table, the key prefix, the query and the sort, so that
// a token resumes only the query that gave it.
func queryBinding(tg *target, query, sort string) []byte {
	h := crc32.NewIEEE()
	h.Write([]byte(tg.table.Name))
	h.Write([]byte{0})
	h.Write(keys.Encode(tg.key))
	h.Write([]byte{0})
	h.Write([]byte(query))
	h.Write([]byte{0})
	h.Write([]byte(sort))
	return binary.BigEndian.AppendUint32(make([]byte, 0, 4), h.Sum32())
}

// fanOut calls fn for each partition of db in parts, in parallel, with
// the partition's master; the first error cancels the others and is
// returned once every call has ended. With maxStale, a partition whose
// master cannot answer (a failover) is asked of its slaves (onSlaves),
// and fromSlave says whether one answered for any partition. With
// partial, a partition that is unavailable (an error answered as 503) is
// left out instead and its index in parts returned in missing, unless
// every partition is.
func (r *Router) fanOut(ctx context.Context, db string, parts []int, partial bool, maxStale time.Duration, fn func(ctx context.Context, i int, n node.Service) error) (missing []int, fromSlave bool, err error) {
	type call struct {
		i    int
		n    node.Service
		err  error // finding the node
		here bool  // n is in this process
	}
	calls, remote := make([]call, len(parts)), 0
	for i, p := range parts {
		n, err := r.backend.Node(db, p)
		calls[i] = call{i, n, err, err == nil && node.IsInProcess(n)}
		if !calls[i].here {
			remote++
		}
	}
	// Calls to other processes run in goroutines and are cancelled by a
	// context when one fails. Calls to this process's nodes run one
	// after another (below), and once one failed the rest are not made:
	// they need no context of their own, whose making would also start
	// the request's deadline timer (admission.WithDeadline defers it
	// until something waits on the deadline).
	callCtx, cancel := ctx, context.CancelFunc(func() {})
	if remote > 0 {
		callCtx, cancel = context.WithCancel(ctx)
		defer cancel()
	}
	var failed atomic.Bool
	errs := make([]error, len(parts))
	var slaves []bool // which partitions a slave answered: only reads that accept staleness ask slaves
	if maxStale > 0 {
		slaves = make([]bool, len(parts))
	}
	run := func(c call) {
		err := c.err
		if err == nil && failed.Load() {
			err = context.Canceled
		}
		hedgedToSlave := false
		if err == nil {
			err = fn(callCtx, c.i, r.hedged(db, parts[c.i], c.n, maxStale, &hedgedToSlave))
		}
		if err != nil && maxStale > 0 && !failed.Load() {
			slaves[c.i], err = r.onSlaves(db, parts[c.i], maxStale, err, func(s node.Service) error { return fn(callCtx, c.i, s) })
		}
		if hedgedToSlave {
			slaves[c.i] = true
		}
		if err != nil {
			errs[c.i] = err
			if !partial || Problem(err).Status != http.StatusServiceUnavailable {
				failed.Store(true)
				cancel()
			}
		}
	}
	var wg sync.WaitGroup
	for _, c := range calls {
		if !c.here {
			wg.Go(func() { run(c) })
		}
	}
	// Nodes of this process are called one after another in the
	// request's goroutine: on the same cores, calls in goroutines of
	// their own only interleave with other requests', and this request
	// waits for the last of them.
	for _, c := range calls {
		if c.here {
			run(c)
		}
	}
	wg.Wait()
	defer func() { r.countFanOut(len(parts), len(missing), err) }()
	var first error
	for i, err := range errs {
		switch {
		case err == nil:
			fromSlave = fromSlave || slaves != nil && slaves[i]
		case partial && Problem(err).Status == http.StatusServiceUnavailable && !errors.Is(err, context.Canceled):
			missing = append(missing, i)
			if first == nil {
				first = err
			}
		case !errors.Is(err, context.Canceled):
			return nil, false, err // the first error that is not the cancellation it caused
		}
	}
	for _, err := range errs {
		if err != nil && errors.Is(err, context.Canceled) && !partial {
			return nil, false, err
		}
	}
	if len(missing) == len(parts) && len(parts) > 0 {
		return nil, false, first
	}
	return missing, fromSlave, nil
}

// onSlaves asks a partition's slaves, in order, for a read its master
// could not answer (masterErr) when the read accepts staleness
// (Cache-Control: max-stale): call makes the read of one node, with the
// read's MaxStale in its requests, which a master in force ignores. A
// slave that is not current enough, or not a slave, is passed over for
// the next; any other error of a slave is the read's. Without an answer
// it returns masterErr. It tries slaves only when the master is
// unavailable or no longer master (a failover): an overloaded master's
// read is not doubled on its slaves (a single-document read asks them
// within a budget per host instead, hedgedGet). A master that is only
// slow is hedged before this (hedging).
func (r *Router) onSlaves(db string, part int, maxStale time.Duration, masterErr error, call func(s node.Service) error) (bool, error) {
	if maxStale <= 0 || !errors.Is(masterErr, node.ErrUnavailable) && !errors.Is(masterErr, node.ErrNotMaster) {
		return false, masterErr
	}
	rb, ok := r.backend.(replicaBackend)
	if !ok {
		return false, masterErr
	}
	for _, s := range rb.Slaves(db, part) {
		err := call(s)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, node.ErrTooStale), errors.Is(err, node.ErrNotMaster), errors.Is(err, node.ErrUnavailable):
		default:
			return true, err
		}
	}
	return false, masterErr
}

// countFanOut counts a multi-partition read's quality of service: every
// partition answered, some did, or it failed.
func (r *Router) countFanOut(parts, missing int, err error) {
	switch {
	case err != nil:
		r.fanFailed.Add(1)
	case missing > 0:
		r.fanPartial.Add(1)
	default:
		r.fanFull.Add(1)
	}
}

// FanOutStats counts multi-partition reads (multi-gets, queries without a
// partition key): all partitions answered, some did (Prefer:
// partial-ok), or the read failed.
func (r *Router) FanOutStats() (full, partial, failed uint64) {
	return r.fanFull.Load(), r.fanPartial.Load(), r.fanFailed.Load()
}

// queryAll runs a query without a partition key on every partition in
// parallel and merges their pages: each partition answers its first
// limit hits after the token, so the first limit of all of them, in the
// query's order, are the page (at most partitions × limit items held).
func (r *Router) queryAll(ctx context.Context, tg *target, req node.ScanRequest, order index.Order, partial bool) (_ *node.ScanResult, missing []int, fromSlave bool, _ error) {
	parts := make([]int, tg.db.Partitions)
	for i := range parts {
		parts[i] = i
	}
	results := make([]*node.ScanResult, len(parts))
	missing, fromSlave, err := r.fanOut(ctx, tg.db.Name, parts, partial, req.MaxStale, func(ctx context.Context, i int, n node.Service) (err error) {
		q := req
		q.Partition = parts[i]
		// The partitions share the page's bound (each answers at least
		// one document), so the router holds about one page's worth.
		q.MaxBytes = max(req.ByteLimit()/len(parts), 64<<10)
		results[i], err = n.Scan(ctx, q)
		if errors.Is(err, node.ErrIndexBuilding) {
			// Its count of documents left is this partition's.
			err = fmt.Errorf("partition %d: %w", q.Partition, err)
		}
		return err
	})
	if err != nil {
		return nil, nil, false, err
	}
	out := &node.ScanResult{}
	more := false
	// A partition with more to give bounds the page at its last item:
	// past it, that partition's items are not known yet.
	var bound []byte
	for _, res := range results {
		if res == nil {
			continue // a partition left out
		}
		out.Items = append(out.Items, res.Items...)
		out.Stale = max(out.Stale, res.Stale)
		more = more || res.Next != nil
		if res.Next != nil && len(res.Items) > 0 {
			if p := res.Items[len(res.Items)-1].Position; bound == nil || index.ComparePositions(order, p, bound) < 0 {
				bound = p
			}
		}
	}
	slices.SortStableFunc(out.Items, func(a, b *node.Item) int { return index.ComparePositions(order, a.Position, b.Position) })
	if bound != nil {
		n := len(out.Items)
		for n > 0 && index.ComparePositions(order, out.Items[n-1].Position, bound) > 0 {
			n--
		}
		out.Items = out.Items[:n]
	}
	if len(out.Items) > req.Limit {
		out.Items, more = out.Items[:req.Limit], true
	}
	size := 0
	for i, it := range out.Items {
		if size >= req.ByteLimit() {
			out.Items, more = out.Items[:i], true // as a node stops its answer
			break
		}
		size += it.ScanBytes()
	}
	if more && len(out.Items) > 0 {
		out.Next = out.Items[len(out.Items)-1].Position
	}
	return out, missing, fromSlave, nil
}

// bufferPool holds response bodies between requests; a buffer grown
// past max (a large document or page) is left to the collector rather
// than kept.
type bufferPool struct {
	pool    sync.Pool
	initial int
	max     int
}

// get returns a pooled buffer of at least size bytes.
func (p *bufferPool) get(size int) *[]byte {
	buf, _ := p.pool.Get().(*[]byte)
	if buf == nil {
		b := make([]byte, 0, p.initial)
		buf = &b
	}
	if cap(*buf) < size {
		*buf = make([]byte, 0, size)
	}
	return buf
}

// put gives buf back, b being what it grew to.
func (p *bufferPool) put(buf *[]byte, b []byte) {
	if cap(b) <= p.max {
		*buf = b[:0]
		p.pool.Put(buf)
	}
}

// pageBuffers hold rendered pages and streamed lines (Page.Release). A
// multi-get of 10 documents of 1 KB allocated 55 KB, most of it its page
// growing by doubling, and its collections were the tail of its latency.
var pageBuffers = &bufferPool{initial: 16 << 10, max: 256 << 10}

// renderedSize guesses the JSON of items: their Avro bodies, a quarter
// more for names and quoting, and each entry's key, ETag, SCN and time.
func renderedSize(items []*node.Item) int {
	n := 64
	for _, it := range items {
		n += len(it.Body) + len(it.Body)/4 + 160
	}
	return n
}

// Release gives the page's buffer back once its body has been written;
// the page is not used after.
func (p *Page) Release() {
	if p.buf != nil {
		pageBuffers.put(p.buf, p.Body)
		p.buf, p.Body = nil, nil
	}
}

func (r *Router) renderPage(t *schema.Table, items []*node.Item, missing [][]keys.Part, next string, f Format) (*Page, error) {
	buf := pageBuffers.get(renderedSize(items) + 32*len(missing) + len(next))
	b := append((*buf)[:0], `{"documents":[`...)
	for i, it := range items {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = r.appendItem(b, t, it, f); err != nil {
			pageBuffers.put(buf, b)
			return nil, err
		}
		if len(b) > r.opts.MaxResponseBytes {
			pageBuffers.put(buf, b)
			return nil, &responseTooLarge{size: len(b), limit: r.opts.MaxResponseBytes, partial: true}
		}
	}
	b = append(b, ']')
	if missing != nil {
		b = append(b, `,"missing":[`...)
		for i, k := range missing {
			if i > 0 {
				b = append(b, ',')
			}
			b = schema.AppendKeyJSON(b, k)
		}
		b = append(b, ']')
	}
	if next != "" {
		b = fmt.Appendf(b, `,"next":%q`, next)
	}
	b = append(b, '}')
	return &Page{Body: b, Documents: len(items), buf: buf}, nil
}

// replicaBackend is a Backend that also knows a partition's slaves.
type replicaBackend interface {
	Slaves(db string, partition int) []node.Service
}

// slaveGet asks the partition's slaves, in order, for a read the master
// could not answer (masterErr); the first that is current enough answers.
// Without an answer it returns masterErr. budgeted asks only slaves whose
// hedge budget has a token (the master refused the read as overloaded: a
// cluster-wide overload must not double its reads).
func (r *Router) slaveGet(ctx context.Context, req node.GetRequest, maxStale time.Duration, masterErr error, budgeted bool) (*node.Item, bool, error) {
	rb, ok := r.backend.(replicaBackend)
	if !ok {
		return nil, false, masterErr
	}
	req.MaxStale = maxStale
	for _, s := range rb.Slaves(req.DB, req.Partition) {
		a := addrOf(s)
		if budgeted && (a == "" || !r.hedges.spend(a)) {
			continue
		}
		t0 := time.Now()
		it, err := s.Get(ctx, req)
		switch {
		case err == nil:
			if budgeted {
				r.hedges.observe(a, time.Since(t0))
			}
			return it, true, nil
		case errors.Is(err, node.ErrNotFound), errors.Is(err, node.ErrNotModified):
			return it, true, err // a current-enough slave's answer
		}
	}
	return nil, false, masterErr
}

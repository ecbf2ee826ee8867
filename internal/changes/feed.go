package changes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/problem"
	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
)

// Sources finds, for one partition, where its log is read (a relay, or
// the storage node itself) and who streams its snapshot (its master).
type Sources interface {
	Log(db string, partition int) (node.LogSource, error)
	Snapshot(db string, partition int) (node.Snapshotter, error)
}

// Since says where a stream starts for partitions its token does not
// name.
type Since int

const (
	// SinceBeginning starts at each partition's first retained commit (a
	// snapshot when the log was trimmed).
	SinceBeginning Since = iota
	// SinceNow starts after each partition's latest commit.
	SinceNow
)

// Request is one change-stream request.
type Request struct {
	DB string
	// Tables and Partitions filter (empty: all).
	Tables     []string
	Partitions []int
	// Fields projects documents (empty: whole documents).
	Fields []string
	// Version renders documents in that schema version (0: the latest).
	Version int
	// Before adds pre-images to updates and deletes.
	Before bool
	// Transactions adds BEGIN and END events around each transaction.
	Transactions bool
	// Token resumes; partitions it does not name start as Since says.
	Token Token
	Since Since
	// Heartbeat is how often a partition whose position moved without
	// an event says so in a resolved event (default 1 s).
	Heartbeat time.Duration
}

// Event is one event of a stream, rendered: JSON is one object, the
// resume token included.
type Event struct {
	// Kind is "change", "resolved", "rollback" or "transaction".
	Kind  string
	JSON  []byte
	Token string
}

// Feed serves change streams.
type Feed struct {
	Reg     *registry.Registry
	Plans   *schema.Plans
	Sources Sources
	Logger  *slog.Logger
	// StreamBytes bounds what one stream holds in memory (default
	// DefaultStreamBytes): its events on their way from the partitions'
	// readers to the consumer (one event at least, whatever its size),
	// and, shared out between its partitions, the log answers they read
	// (each at least one commit whatever its size).
	StreamBytes int
}

// DefaultStreamBytes is Feed.StreamBytes's default. Without a bound, 20
// consumers that did not read, of a database holding 256 documents of
// 1 MB, took a router to 9.5 GB: each stream held 256 rendered events
// and each of its 64 partitions' readers a log answer of up to 16 MiB.
const DefaultStreamBytes = 4 << 20

// minAnswerBytes is the least a partition's reader asks a log answer to
// hold (when a stream has many partitions).
const minAnswerBytes = 16 << 10

// catchUpReaders is how many of a stream's partitions read a backlog at
// once: a reader behind its partition's log (its answers come full), or
// reading its snapshot, holds one of these while it reads; one that is
// current does not. An answer holds at least one commit, so without it
// every partition of a stream replaying large documents held one while
// it waited for room: 64 MB a stream for documents of 1 MB.
const catchUpReaders = 4

// RequestError is a request the stream cannot serve (a 400).
type RequestError struct{ Err error }

func (e *RequestError) Error() string { return e.Err.Error() }
func (e *RequestError) Unwrap() error { return e.Err }

// Stream is a checked request, ready to run.
type Stream struct {
	f      *Feed
	req    Request
	db     *schema.Database
	tables map[string]bool // nil: all
	parts  []int
	held   *budget       // the events on their way to the consumer
	behind chan struct{} // catchUpReaders slots for readers reading a backlog
}

// budget bounds the bytes of events a stream's readers have handed its
// writer and it has not yet written: a reader waits for room, except
// when nothing is held (an event larger than the bound passes alone).
type budget struct {
	max   int
	mu    sync.Mutex
	used  int
	freed chan struct{} // closed (and replaced) when bytes are released
}

func newBudget(max int) *budget { return &budget{max: max, freed: make(chan struct{})} }

// take waits until n bytes fit, or ctx ends (false).
func (b *budget) take(ctx context.Context, n int) bool {
	for {
		b.mu.Lock()
		if b.used == 0 || b.used+n <= b.max {
			b.used += n
			b.mu.Unlock()
			return true
		}
		freed := b.freed
		b.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return false
		}
	}
}

// adjust changes what is held by n bytes without waiting (an event
// rendered larger or smaller than what was taken for it).
func (b *budget) adjust(n int) {
	if n > 0 {
		b.mu.Lock()
		b.used += n
		b.mu.Unlock()
		return
	}
	b.release(-n)
}

func (b *budget) release(n int) {
	b.mu.Lock()
	b.used -= n
	close(b.freed)
	b.freed = make(chan struct{})
	b.mu.Unlock()
}

func (s *Stream) streamBytes() int {
	if s.f.StreamBytes > 0 {
		return s.f.StreamBytes
	}
	return DefaultStreamBytes
}

// answerBytes is the bytes a partition's reader asks one log answer to
// hold at most (before its last commit): the stream's bound shared out
// between its partitions.
func (s *Stream) answerBytes() int {
	return max(minAnswerBytes, s.streamBytes()/max(1, len(s.parts)))
}

// Open checks a request against the registry: the database, tables,
// partitions, version and fields.
func (f *Feed) Open(ctx context.Context, req Request) (*Stream, error) {
	d, err := f.Reg.Database(req.DB)
	if err != nil {
		return nil, err
	}
	if req.Heartbeat <= 0 {
		req.Heartbeat = time.Second
	}
	s := &Stream{f: f, req: req, db: d}
	check := req.Tables
	if len(req.Tables) > 0 {
		s.tables = map[string]bool{}
		for _, name := range req.Tables {
			if _, err := f.Reg.Table(req.DB, name); err != nil {
				return nil, err
			}
			s.tables[name] = true
		}
	} else {
		for _, t := range f.Reg.Tables(req.DB) {
			check = append(check, t.Name)
		}
	}
	for _, name := range check {
		t, err := f.Reg.Table(req.DB, name)
		if err != nil {
			return nil, err
		}
		v := req.Version
		if v == 0 {
			v = t.Latest().Number
		} else if t.Version(v) == nil {
			return nil, &RequestError{fmt.Errorf("table %s has no schema version %d", name, v)}
		}
		if len(req.Fields) > 0 {
			if _, err := f.Plans.Reader(t, v, req.Fields); err != nil {
				return nil, &RequestError{fmt.Errorf("fields of table %s: %w", name, err)}
			}
		}
	}
	if len(req.Partitions) == 0 {
		for p := range d.Partitions {
			s.parts = append(s.parts, p)
		}
	} else {
		for _, p := range req.Partitions {
			if p < 0 || p >= d.Partitions {
				return nil, &RequestError{fmt.Errorf("database %s has partitions 0 to %d, not %d", d.Name, d.Partitions-1, p)}
			}
			if !slices.Contains(s.parts, p) {
				s.parts = append(s.parts, p)
			}
		}
	}
	return s, nil
}

// item is what a partition's reader hands the writer: an event without
// its token, and the partition's position after it.
type item struct {
	part int
	kind string
	body []byte // a JSON object without its closing brace
	pos  Position
	size int // taken from the stream's budget
}

// Run streams events to emit until ctx ends or emit fails. Each
// partition is read by a goroutine of its own, owned by Run; events of
// one partition keep their commit order, partitions interleave.
func (s *Stream) Run(ctx context.Context, emit func(Event) error, flush func() error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The token: each partition's position, for the partitions it names
	// (ascending); one partition's moves with each event.
	pos := make([]Position, s.db.Partitions)
	var named []int
	for _, p := range s.parts {
		if at, ok := s.req.Token[p]; ok {
			pos[p] = at
			named = append(named, p)
		}
	}
	slices.Sort(named)
	tw := tokenWriter{hash: dbHash(s.db.Name)}
	s.held = newBudget(s.streamBytes())
	s.behind = make(chan struct{}, catchUpReaders)
	out := make(chan item, 256)
	var wg sync.WaitGroup
	for _, p := range s.parts {
		at, known := s.req.Token[p]
		wg.Go(func() { s.follow(ctx, p, at, known, out) })
	}
	defer wg.Wait()
	defer cancel()
	for {
		var it item
		select {
		case <-ctx.Done():
			return ctx.Err()
		case it = <-out:
		}
		pos[it.part] = it.pos
		if i, found := slices.BinarySearch(named, it.part); !found {
			named = slices.Insert(named, i, it.part)
		}
		text := tw.encode(named, func(p int) Position { return pos[p] })
		b := append(it.body, `,"token":"`...)
		b = append(b, text...)
		b = append(b, `"}`...)
		err := emit(Event{Kind: it.kind, JSON: b, Token: string(text)})
		s.held.release(it.size)
		if err != nil {
			return err
		}
		if it.kind == "error" {
			if err := flush(); err != nil {
				return err
			}
			return ErrUnrenderable
		}
		if len(out) == 0 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
}

var errTrimmed = errors.New("changes: behind the retained log")

// follow reads one partition from pos (or as Since says when the token
// does not name it) until ctx ends.
func (s *Stream) follow(ctx context.Context, part int, pos Position, known bool, out chan<- item) {
	r := &reader{s: s, part: part, pos: pos, out: out, ctx: ctx}
	if !known && s.req.Since == SinceNow {
		if !r.now() {
			return
		}
	}
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		src, err := s.f.Sources.Log(s.db.Name, part)
		if err == nil {
			err = r.tail(src)
		}
		if errors.Is(err, errTrimmed) {
			// A snapshot is a backlog too: read under a catch-up slot.
			err = r.ctx.Err()
			if r.catchUp() {
				err = r.snapshot()
				r.caughtUp()
			}
		}
		if err == nil {
			backoff = 100 * time.Millisecond
			continue
		}
		if ctx.Err() != nil {
			return
		}
		var u *unrenderable
		if errors.As(err, &u) {
			// Read again, it would fail again: the stream ends with an
			// error event naming the change, whose token resumes at it.
			r.send(item{kind: "error", body: r.failure(u), pos: u.at})
			return
		}
		s.f.Logger.Debug("changes: partition stream", "db", s.db.Name, "partition", part, "err", err)
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// reader is one partition's reader.
type reader struct {
	s    *Stream
	ctx  context.Context
	part int
	pos  Position
	out  chan<- item
	// sent is the position last sent; said when it was last sent.
	sent Position
	said time.Time
	// scratch holds a document converted to the stream's version.
	scratch []byte
	// behind says the reader holds one of the stream's catch-up slots.
	behind bool
}

// catchUp takes one of the stream's catch-up slots, unless the reader
// holds one; false when the stream ends first.
func (r *reader) catchUp() bool {
	if r.behind {
		return true
	}
	select {
	case r.s.behind <- struct{}{}:
		r.behind = true
		return true
	case <-r.ctx.Done():
		return false
	}
}

// caughtUp gives back the reader's catch-up slot, if it holds one.
func (r *reader) caughtUp() {
	if r.behind {
		<-r.s.behind
		r.behind = false
	}
}

func (r *reader) send(it item) bool {
	it.size = len(it.body)
	if !r.s.held.take(r.ctx, it.size) {
		return false
	}
	return r.sendTaken(it)
}

// sendTaken is send for an item whose size is taken from the budget
// already.
func (r *reader) sendTaken(it item) bool {
	it.part = r.part
	select {
	case r.out <- it:
		r.sent, r.said = it.pos, time.Now()
		return true
	case <-r.ctx.Done():
		return false
	}
}

// now moves the position to the partition's latest commit.
func (r *reader) now() bool {
	for r.ctx.Err() == nil {
		src, err := r.s.f.Sources.Log(r.s.db.Name, r.part)
		if err == nil {
			var res *node.LogResult
			if res, err = src.Log(r.ctx, node.LogRequest{DB: r.s.db.Name, Partition: r.part, Max: 1}); err == nil {
				r.pos = Position{SCN: res.SourceSCN}
				return r.send(item{kind: "resolved", body: r.resolved(), pos: r.pos})
			}
		}
		if !sleep(r.ctx, 200*time.Millisecond) {
			return false
		}
	}
	return false
}

// tail streams the partition's log after the position; it returns
// errTrimmed when the log no longer holds it.
func (r *reader) tail(src node.LogSource) error {
	// The first answer is asked under a catch-up slot and at once: it
	// tells whether the reader is behind (the answer comes full). After
	// it, a reader that is current long-polls without a slot.
	if !r.catchUp() {
		return r.ctx.Err()
	}
	defer r.caughtUp()
	limit := r.s.answerBytes()
	req := node.LogRequest{DB: r.s.db.Name, Partition: r.part, After: r.pos.SCN, MaxBytes: limit}
	return node.StreamFrom(r.ctx, src, req, func(res *node.LogResult) error {
		err := r.answer(res)
		if err != nil {
			return err
		}
		size := 0
		for i := range res.Commits {
			size += res.Commits[i].Size()
		}
		if len(res.Commits) >= node.DefaultLogBatch || size >= limit {
			if !r.catchUp() { // more is waiting: read it under a slot
				return r.ctx.Err()
			}
		} else {
			r.caughtUp()
		}
		return nil
	})
}

// answer sends the events of one log answer.
func (r *reader) answer(res *node.LogResult) error {
	switch {
	case res.Trimmed:
		return errTrimmed
	case res.Diverged:
		// Events after Common were on a timeline the partition no
		// longer has (lost in a failover): the consumer rewinds.
		r.pos = Position{SCN: res.Common}
		if !r.send(item{kind: "rollback", body: r.rollback(res.Common), pos: r.pos}) {
			return r.ctx.Err()
		}
		return nil
	case !res.Holds:
		return nil // the source is catching up
	}
	for i := range res.Commits {
		if err := r.commit(&res.Commits[i]); err != nil {
			return err
		}
	}
	if r.pos != r.sent && (time.Since(r.said) >= r.s.req.Heartbeat || len(res.Commits) == 0) || time.Since(r.said) >= 10*r.s.req.Heartbeat {
		if !r.send(item{kind: "resolved", body: r.resolved(), pos: r.pos}) {
			return r.ctx.Err()
		}
	}
	return nil
}

// commit sends a commit's events that pass the filters.
func (r *reader) commit(c *storage.Commit) error {
	skip := r.pos.Skip
	prev := r.pos.SCN
	// The events the filters pass, and how many of them a consumer
	// resuming inside the commit already had: the ones it gets next are
	// numbered after those (total_order, data_collection_order) and the
	// END counts them all.
	var picked []int
	counts := map[string]int{}
	had := 0
	for i := range c.Events {
		e := &c.Events[i]
		if e.Op == storage.OpAutoIncrement || (r.s.tables != nil && !r.s.tables[e.Table]) {
			continue
		}
		if i < skip {
			counts[e.Table]++
			had++
			continue
		}
		picked = append(picked, i)
	}
	done := Position{SCN: c.SCN}
	if len(picked) == 0 {
		r.pos = done
		return nil
	}
	tx := r.s.req.Transactions
	if tx && skip == 0 {
		if !r.send(item{kind: "transaction", body: r.boundary(c, "BEGIN", nil), pos: Position{SCN: prev}}) {
			return r.ctx.Err()
		}
	}
	for n, i := range picked {
		e := &c.Events[i]
		counts[e.Table]++
		// Room for the event before it is rendered, from its stored
		// size: a reader waiting for room holds the commit, not its
		// rendering too.
		est := len(e.Value) + len(e.PrevValue) + 512
		if !r.s.held.take(r.ctx, est) {
			return r.ctx.Err()
		}
		body, err := r.change(c, e, had+n+1, counts[e.Table])
		if err != nil {
			r.s.held.release(est)
			var u *unrenderable
			if errors.As(err, &u) {
				u.at = Position{SCN: prev, Skip: i} // resume at it
			}
			return err
		}
		r.s.held.adjust(len(body) - est)
		pos := Position{SCN: prev, Skip: i + 1}
		if n == len(picked)-1 && !tx {
			pos = done
		}
		if !r.sendTaken(item{kind: "change", body: body, pos: pos, size: len(body)}) {
			return r.ctx.Err()
		}
	}
	if tx {
		if !r.send(item{kind: "transaction", body: r.boundary(c, "END", counts), pos: done}) {
			return r.ctx.Err()
		}
	}
	r.pos = done
	return nil
}

// ErrUnrenderable ends a stream that met a change it cannot render as
// asked (Run's error, after the stream's "error" event).
var ErrUnrenderable = errors.New("changes: a change cannot be rendered as the stream asks")

// unrenderable is a change (or snapshot row) the stream cannot render in
// the version it asks for: a value that version cannot hold (a promoted
// double read back as a long), or a document the version cannot read (a
// table evolved with compatibility NONE or FORWARD). Read again, it fails
// again; the stream ends with an "error" event instead of retrying it
// forever, which left the partition silent.
type unrenderable struct {
	table   string
	key     []byte
	scn     storage.SCN
	version int      // the document's
	at      Position // where a consumer resumes to meet it again
	err     error
}

func (u *unrenderable) Error() string { return u.err.Error() }
func (u *unrenderable) Unwrap() error { return u.err }

// failure renders the "error" event of an unrenderable change: a problem
// (RFC 9457, as the API's errors) and the change's source.
func (r *reader) failure(u *unrenderable) []byte {
	target := r.s.req.Version
	version := "the latest schema version"
	if target > 0 {
		version = "schema version " + strconv.Itoa(target)
	}
	detail := fmt.Sprintf("the change at SCN %s of table %s (a document of schema version %d) cannot be rendered in %s: %v; "+
		"follow the stream in another version (version=N) from this event's token", u.scn, u.table, u.version, version, u.err)
	p := problem.New(http.StatusBadRequest, problem.TypeInvalidDocument, "Change cannot be rendered", detail)
	var fe *schema.FieldError
	if errors.As(u.err, &fe) {
		p.Field = fe.Path
	}
	pj, _ := json.Marshal(p)
	b := append(make([]byte, 0, 256+len(pj)), `{"type":"error","error":`...)
	b = append(b, pj...)
	if src, err := r.source(b, u.table, u.key, u.scn, u.version, "false", time.Now()); err == nil {
		b = src
	}
	return appendTS(b, time.Now())
}

// snapshot streams a snapshot of the partition as "r" events, then moves
// the position to the snapshot's SCN. Until its last row the events carry
// the position before it: a consumer cut off midway gets the snapshot
// again.
func (r *reader) snapshot() error {
	src, err := r.s.f.Sources.Snapshot(r.s.db.Name, r.part)
	if err != nil {
		return err
	}
	var first *node.SnapshotChunk
	// One row is held back, to be marked "last" if it is.
	var pending *storage.Row
	flush := func(flag string, pos Position) error {
		body, err := r.snapshotRow(first.SCN, pending, flag)
		if err != nil {
			var u *unrenderable
			if errors.As(err, &u) {
				u.at = r.pos // before the snapshot, as its rows' tokens
			}
			return err
		}
		if !r.send(item{kind: "change", body: body, pos: pos}) {
			return r.ctx.Err()
		}
		return nil
	}
	err = src.Snapshot(r.ctx, node.SnapshotRequest{DB: r.s.db.Name, Partition: r.part}, func(c *node.SnapshotChunk) error {
		if first == nil {
			first = c
		}
		for i := range c.Rows {
			row := &c.Rows[i]
			if r.s.tables != nil && !r.s.tables[row.Table] {
				continue
			}
			if pending != nil {
				if err := flush("true", r.pos); err != nil {
					return err
				}
			}
			pending = row
		}
		return nil
	})
	if err != nil {
		return err
	}
	if first == nil {
		return fmt.Errorf("partition %s/%d: an empty snapshot stream", r.s.db.Name, r.part)
	}
	at := Position{SCN: first.SCN}
	if pending != nil {
		if err := flush("last", at); err != nil {
			return err
		}
		r.pos = at
		return nil
	}
	r.pos = at
	if !r.send(item{kind: "resolved", body: r.resolved(), pos: r.pos}) {
		return r.ctx.Err()
	}
	return nil
}

// The envelope. Field order follows Debezium's: op, before, after,
// source, ts_ms, transaction; type and token are Cortado's.

var opCodes = map[storage.Op]string{storage.OpInsert: "c", storage.OpUpdate: "u", storage.OpDelete: "d"}

func (r *reader) change(c *storage.Commit, e *storage.Event, total, perTable int) ([]byte, error) {
	t, err := r.s.f.Reg.TableAtLeast(r.ctx, r.s.db.Name, e.Table, max(e.Version, e.PrevVersion))
	if err != nil {
		return nil, err
	}
	b := append(make([]byte, 0, 256+len(e.Value)*2), `{"type":"change","op":"`...)
	b = append(b, opCodes[e.Op]...)
	b = append(b, `","before":`...)
	if r.s.req.Before && e.Op != storage.OpInsert {
		if b, err = r.render(b, t, e.PrevVersion, e.PrevValue); err != nil {
			return nil, &unrenderable{table: e.Table, key: e.Key, scn: c.SCN, version: e.PrevVersion, err: err}
		}
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"after":`...)
	if e.Op != storage.OpDelete {
		if b, err = r.render(b, t, e.Version, e.Value); err != nil {
			return nil, &unrenderable{table: e.Table, key: e.Key, scn: c.SCN, version: e.Version, err: err}
		}
	} else {
		b = append(b, "null"...)
	}
	version := e.Version
	if e.Op == storage.OpDelete {
		version = e.PrevVersion
	}
	if b, err = r.source(b, e.Table, e.Key, c.SCN, version, "false", c.Timestamp); err != nil {
		return nil, err
	}
	b = appendTS(b, time.Now())
	b = append(b, `,"transaction":{"id":"`...)
	b = r.transactionID(b, c.SCN)
	b = append(b, `","total_order":`...)
	b = strconv.AppendInt(b, int64(total), 10)
	b = append(b, `,"data_collection_order":`...)
	b = strconv.AppendInt(b, int64(perTable), 10)
	b = append(b, '}')
	return b, nil
}

// snapshotRow renders a snapshot row with its snapshot flag.
func (r *reader) snapshotRow(scn storage.SCN, row *storage.Row, flag string) ([]byte, error) {
	d, err := row.Doc()
	if err != nil {
		return nil, err
	}
	t, err := r.s.f.Reg.TableAtLeast(r.ctx, r.s.db.Name, row.Table, d.Version)
	if err != nil {
		return nil, err
	}
	b := append(make([]byte, 0, 256+len(d.Value)*2), `{"type":"change","op":"r","before":null,"after":`...)
	if b, err = r.render(b, t, d.Version, d.Value); err != nil {
		return nil, &unrenderable{table: row.Table, key: row.Key, scn: scn, version: d.Version, err: err}
	}
	if b, err = r.source(b, row.Table, row.Key, scn, d.Version, flag, d.Modified); err != nil {
		return nil, err
	}
	b = appendTS(b, time.Now())
	return append(b, `,"transaction":null`...), nil
}

// source appends the source block.
func (r *reader) source(b []byte, table string, key []byte, scn storage.SCN, version int, snapshot string, when time.Time) ([]byte, error) {
	parts, err := keys.Decode(key)
	if err != nil {
		return nil, err
	}
	b = append(b, `,"source":{"connector":"cortado","db":"`...)
	b = append(b, r.s.db.Name...)
	b = append(b, `","table":"`...)
	b = append(b, table...)
	b = append(b, `","key":`...)
	b = schema.AppendKeyJSON(b, parts)
	b = r.position(b, scn)
	b = append(b, `,"schemaVersion":`...)
	b = strconv.AppendInt(b, int64(version), 10)
	b = appendTS(b, when)
	b = append(b, `,"snapshot":"`...)
	b = append(b, snapshot...)
	return append(b, `"}`...), nil
}

func (r *reader) position(b []byte, scn storage.SCN) []byte {
	b = append(b, `,"partition":`...)
	b = strconv.AppendInt(b, int64(r.part), 10)
	b = append(b, `,"scn":"`...)
	b = scn.Append(b)
	b = append(b, `","generation":`...)
	b = strconv.AppendUint(b, uint64(scn.Gen), 10)
	b = append(b, `,"sequence":`...)
	return strconv.AppendUint(b, scn.Seq, 10)
}

// transactionID appends a transaction's id, "partition/SCN": unique in
// the database, as Debezium's transaction ids are in their source, where
// an SCN alone is not (each partition has its own sequence), so that a
// consumer gathering a transaction's events by id never merges two of
// different partitions.
func (r *reader) transactionID(b []byte, scn storage.SCN) []byte {
	b = strconv.AppendInt(b, int64(r.part), 10)
	b = append(b, '/')
	return scn.Append(b)
}

func appendTS(b []byte, t time.Time) []byte {
	b = append(b, `,"ts_ms":`...)
	return strconv.AppendInt(b, t.UnixMilli(), 10)
}

// render appends a stored document as JSON in the requested version and
// projection.
func (r *reader) render(b []byte, t *schema.Table, written int, value []byte) ([]byte, error) {
	target := r.s.req.Version
	if target == 0 {
		target = t.Latest().Number
	}
	plan, err := r.s.f.Plans.Plan(t, written, target, r.s.req.Fields)
	if err != nil {
		return nil, err
	}
	avro := value // as written: nothing to convert
	if !plan.Identity() {
		if r.scratch, err = plan.Apply(r.scratch[:0], value); err != nil {
			return nil, err
		}
		avro = r.scratch
	}
	rd, err := r.s.f.Plans.Reader(t, target, r.s.req.Fields)
	if err != nil {
		return nil, err
	}
	return rd.JSON.Append(b, avro)
}

func (r *reader) control(kind string, scn storage.SCN) []byte {
	b := append(make([]byte, 0, 160), `{"type":"`...)
	b = append(b, kind...)
	b = append(b, `","source":{"connector":"cortado","db":"`...)
	b = append(b, r.s.db.Name...)
	b = append(b, '"')
	b = r.position(b, scn)
	b = append(b, '}')
	return appendTS(b, time.Now())
}

func (r *reader) resolved() []byte { return r.control("resolved", r.pos.SCN) }

func (r *reader) rollback(to storage.SCN) []byte { return r.control("rollback", to) }

// boundary renders a transaction's BEGIN or END (with counts) event.
func (r *reader) boundary(c *storage.Commit, status string, counts map[string]int) []byte {
	b := append(r.control("transaction", c.SCN), `,"status":"`...)
	b = append(b, status...)
	b = append(b, `","id":"`...)
	b = r.transactionID(b, c.SCN)
	b = append(b, '"')
	if counts == nil {
		return append(b, `,"event_count":null,"data_collections":null`...)
	}
	total := 0
	names := make([]string, 0, len(counts))
	for name, n := range counts {
		total += n
		names = append(names, name)
	}
	slices.Sort(names)
	b = append(b, `,"event_count":`...)
	b = strconv.AppendInt(b, int64(total), 10)
	b = append(b, `,"data_collections":[`...)
	for i, name := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"data_collection":"`...)
		b = append(b, r.s.db.Name...)
		b = append(b, '.')
		b = append(b, name...)
		b = append(b, `","event_count":`...)
		b = strconv.AppendInt(b, int64(counts[name]), 10)
		b = append(b, '}')
	}
	return append(b, ']')
}

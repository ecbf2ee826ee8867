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
	"sync/atomic"
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
	// and the room its readers reserve for the log answers they read
	// next. Its partitions ask for answers of a share of it (an answer
	// holds at least one commit whatever its size).
	StreamBytes int
	// BacklogReaders bounds how many partitions, of all the streams
	// served, read their first log answer at once (default
	// DefaultBacklogReaders): the answers that come without room
	// reserved for them.
	BacklogReaders int

	backlogOnce sync.Once
	backlog     chan struct{}
	letGo       atomic.Uint64 // log answers readers let go for want of room
}

// AnswersLetGo is how many log answers the feed's readers have let go
// because their stream had no room for the next event: each is asked
// for again from that event once there is. Many a second say that
// consumers read slower than their partitions write.
func (f *Feed) AnswersLetGo() uint64 { return f.letGo.Load() }

// backlogSlots returns the feed's slots for readers reading a backlog.
func (f *Feed) backlogSlots() chan struct{} {
	f.backlogOnce.Do(func() {
		n := f.BacklogReaders
		if n <= 0 {
			n = DefaultBacklogReaders
		}
		f.backlog = make(chan struct{}, n)
	})
	return f.backlog
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
// once: a reader behind its partition's log (the answer's source holds
// more after it), or reading its snapshot, holds one of these while it
// reads; one that is current does not. An answer holds at least one
// commit, so without it every partition of a stream replaying large
// documents held one while it waited for room: 64 MB a stream for
// documents of 1 MB.
const catchUpReaders = 4

// DefaultBacklogReaders is Feed.BacklogReaders's default. A reader reads
// its first answer under one of these, the answers after it with room
// reserved in its stream, and never waits for room holding an answer: a
// consumer that does not read holds its stream's events, and no answer.
const DefaultBacklogReaders = 32

// errNoRoom ends a reader's log stream when its stream has no room for
// the next event: rather than hold the answer (and its slots) until the
// consumer reads, the reader lets it go, reserves the room the event
// needs, and asks again from the event.
var errNoRoom = errors.New("changes: no room in the stream")

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
// writer and it has not yet written (each counted with itemOverhead, so
// that many small events are bounded too), and of room reserved for
// events to come: a reader waits for room, or gives up its answer,
// except when nothing is held (an event larger than the bound passes
// alone).
type budget struct {
	max   int
	mu    sync.Mutex
	used  int
	freed chan struct{} // closed (and replaced) when bytes are released
}

// itemOverhead is what an event costs on its way besides its bytes.
const itemOverhead = 128

func newBudget(max int) *budget { return &budget{max: max, freed: make(chan struct{})} }

// fits says whether n more bytes fit; b.mu is held.
func (b *budget) fits(n int) bool { return b.used == 0 || b.used+n <= b.max }

// take waits until n bytes fit, or ctx ends (false).
func (b *budget) take(ctx context.Context, n int) bool {
	for {
		b.mu.Lock()
		if b.fits(n) {
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

// tryTake takes n bytes if they fit now.
func (b *budget) tryTake(n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.fits(n) {
		return false
	}
	b.used += n
	return true
}

// swap gives back room reserved (had bytes) and takes n bytes if they
// fit; if they do not, the room stays reserved.
func (b *budget) swap(had, n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= had
	if !b.fits(n) {
		b.used += had
		return false
	}
	b.used += n
	if had > n {
		b.wake()
	}
	return true
}

// force takes n bytes whether they fit or not: a small event that must
// follow the one before it (a transaction's boundaries), bounded by the
// reader, which takes one at most before it next asks for room.
func (b *budget) force(n int) {
	b.mu.Lock()
	b.used += n
	b.mu.Unlock()
}

// adjust changes what is held by n bytes without waiting (an event
// rendered larger or smaller than what was taken for it).
func (b *budget) adjust(n int) {
	b.mu.Lock()
	b.used += n
	if n < 0 {
		b.wake()
	}
	b.mu.Unlock()
}

// release gives back n bytes: an event written, or room reserved and
// not taken.
func (b *budget) release(n int) {
	b.mu.Lock()
	b.used -= n
	b.wake()
	b.mu.Unlock()
}

// wake tells the waiters that room was made; b.mu is held.
func (b *budget) wake() {
	close(b.freed)
	b.freed = make(chan struct{})
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

// eventBuffer returns a buffer for an event of documents of n bytes as
// stored, with room for their JSON (an eighth more: escapes and numbers
// may take more, and the buffer then grows), the envelope and the token,
// which the writer appends: a stream holding a large event holds about
// its size, not twice it.
func eventBuffer(n int) []byte {
	return make([]byte, 0, n+n/8+1024)
}

// before says whether the stream renders e's pre-image.
func (s *Stream) before(e *storage.Event) bool {
	return s.req.Before && e.Op != storage.OpInsert
}

// storedBytes is the stored size of the documents the stream renders of
// e: its value, and its pre-image if the stream asks for it.
func (s *Stream) storedBytes(e *storage.Event) int {
	if s.before(e) {
		return len(e.Value) + len(e.PrevValue)
	}
	return len(e.Value)
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
	// A reader takes room for an event before it queues it, so the queue
	// never makes it wait.
	s.held = newBudget(s.streamBytes())
	s.behind = make(chan struct{}, catchUpReaders)
	out := newQueue()
	var wg sync.WaitGroup
	for _, p := range s.parts {
		at, known := s.req.Token[p]
		wg.Go(func() { s.follow(ctx, p, at, known, out) })
	}
	defer wg.Wait()
	defer cancel()
	for {
		it, ok := out.pop()
		if !ok {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-out.ready:
			}
			continue
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
		if out.empty() {
			if err := flush(); err != nil {
				return err
			}
		}
	}
}

// queue holds the events a stream's readers hand its writer, bounded
// by the stream's budget, not by a count: a reader never waits on it.
type queue struct {
	mu    sync.Mutex
	items []item
	head  int
	ready chan struct{} // a token when items were pushed
}

func newQueue() *queue { return &queue{ready: make(chan struct{}, 1)} }

func (q *queue) push(it item) {
	q.mu.Lock()
	q.items = append(q.items, it)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

func (q *queue) pop() (item, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.head == len(q.items) {
		return item{}, false
	}
	it := q.items[q.head]
	q.items[q.head] = item{}
	q.head++
	if q.head == len(q.items) {
		// Drained: start again at the front, and let a large array go.
		q.head = 0
		if cap(q.items) > 1024 {
			q.items = nil
		} else {
			q.items = q.items[:0]
		}
	}
	return it, true
}

func (q *queue) empty() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.head == len(q.items)
}

var errTrimmed = errors.New("changes: behind the retained log")

// follow reads one partition from pos (or as Since says when the token
// does not name it) until ctx ends.
func (s *Stream) follow(ctx context.Context, part int, pos Position, known bool, out *queue) {
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
		if errors.Is(err, errNoRoom) {
			// Wait, holding nothing, until the event that did not fit
			// does, and keep that room for it.
			r.s.f.letGo.Add(1)
			if !r.reserve() {
				return
			}
			err = nil
		}
		if err == nil {
			backoff = 100 * time.Millisecond
			continue
		}
		if ctx.Err() != nil {
			return
		}
		// Room reserved waits for an answer; none comes while the
		// source fails, and the stream's other partitions need it.
		r.unreserve()
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
	out  *queue
	// sent is the position last sent; said when it was last sent.
	sent Position
	said time.Time
	// scratch holds a document converted to the stream's version.
	scratch []byte
	// behind says the reader holds one of the stream's catch-up slots,
	// and backlog one of the feed's.
	behind, backlog bool
	// room is the room the reader reserved for its next answer's
	// events; need, the room it needs before it asks again (errNoRoom);
	// asked, the room the events of its last answer took.
	room, need, asked int
}

// catchUp takes one of the stream's catch-up slots and one of the feed's
// backlog slots, unless the reader holds them; false when the stream
// ends first.
func (r *reader) catchUp() bool {
	if !r.streamSlot() {
		return false
	}
	if !r.backlog {
		select {
		case r.s.f.backlogSlots() <- struct{}{}:
			r.backlog = true
		case <-r.ctx.Done():
			return false
		}
	}
	return true
}

// streamSlot takes one of the stream's catch-up slots, unless the reader
// holds one.
func (r *reader) streamSlot() bool {
	if !r.behind {
		select {
		case r.s.behind <- struct{}{}:
			r.behind = true
		case <-r.ctx.Done():
			return false
		}
	}
	return true
}

// caughtUp gives back the reader's slots, if it holds them.
func (r *reader) caughtUp() {
	r.giveBacklog()
	if r.behind {
		<-r.s.behind
		r.behind = false
	}
}

func (r *reader) giveBacklog() {
	if r.backlog {
		<-r.s.f.backlogSlots()
		r.backlog = false
	}
}

// send hands over an event, waiting for room: an event that cannot be
// given up (a snapshot's row, a rollback). While it waits the reader
// gives back its backlog slot, so a consumer that does not read holds
// none of the feed's.
func (r *reader) send(it item) bool {
	it.size = len(it.body) + itemOverhead
	if !r.s.held.tryTake(it.size) {
		had := r.backlog
		r.giveBacklog()
		if !r.s.held.take(r.ctx, it.size) {
			return false
		}
		if had && !r.catchUp() {
			r.s.held.release(it.size)
			return false
		}
	}
	return r.sendTaken(it)
}

// offer hands over an event if there is room for it now (a resolved
// event: the next one says as much).
func (r *reader) offer(it item) bool {
	it.size = len(it.body) + itemOverhead
	if !r.s.held.tryTake(it.size) {
		return true
	}
	return r.sendTaken(it)
}

// sendForced hands over a small event whatever the room (a transaction's
// boundary, which must follow or precede the events around it).
func (r *reader) sendForced(it item) bool {
	it.size = len(it.body) + itemOverhead
	r.s.held.force(it.size)
	return r.sendTaken(it)
}

// sendTaken is send for an item whose size is taken from the budget
// already.
func (r *reader) sendTaken(it item) bool {
	if r.ctx.Err() != nil {
		r.s.held.release(it.size)
		return false
	}
	it.part = r.part
	r.out.push(it)
	r.sent, r.said = it.pos, time.Now()
	return true
}

// roomWait is how long a reader that read an answer with more behind it
// waits for room for the next before it lets its log stream go. It
// waits holding no answer and none of the feed's slots (only its
// stream's catch-up slot, which only its own stream's readers want): a
// consumer that reads makes room within it, one that does not is left
// holding no stream either.
const roomWait = time.Second

// takeRoom takes room for an event of n bytes without waiting: from the
// room reserved for the reader's answer, or room free now. A reader
// never waits for room while it holds an answer and a slot (a consumer
// that does not read would hold them, and the stream's room would wait
// on the slot): without room it lets the answer go (errNoRoom) and
// reserves what the event needs before it asks again.
func (r *reader) takeRoom(n int) bool {
	if r.room >= n {
		r.room -= n
		return true
	}
	if r.s.held.swap(r.room, n) {
		r.room = 0
		return true
	}
	// Room for an answer's worth before asking again: room for this
	// event alone would have the next answer let go after it.
	r.need = max(n, min(r.s.answerBytes(), r.s.streamBytes()))
	return false
}

// reserveWithin reserves n bytes for the reader's next answer if the
// stream has them within roomWait; if not, the reader needs them before
// it asks again.
func (r *reader) reserveWithin(n int) bool {
	r.unreserve()
	ctx, cancel := context.WithTimeout(r.ctx, roomWait)
	defer cancel()
	if r.s.held.take(ctx, n) {
		r.room = n
		return true
	}
	r.need = n
	return false
}

// reserve waits, holding no answer, no slot and no log stream, until the
// room the reader needs (r.need) fits, and reserves it.
func (r *reader) reserve() bool {
	if !r.s.held.take(r.ctx, r.need) {
		return false
	}
	r.room, r.need = r.need, 0
	return true
}

// unreserve gives back the room the reader reserved and did not use.
func (r *reader) unreserve() {
	if r.room > 0 {
		r.s.held.release(r.room)
		r.room = 0
	}
}

// now moves the position to the partition's latest commit.
func (r *reader) now() bool {
	for r.ctx.Err() == nil {
		src, err := r.s.f.Sources.Log(r.s.db.Name, r.part)
		if err == nil {
			var res *node.LogResult
			if res, err = src.Log(r.ctx, node.LogRequest{DB: r.s.db.Name, Partition: r.part, Max: 1, AckedOnly: true}); err == nil {
				r.pos = Position{SCN: head(res)}
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
	// The first answer is asked at once and read under one of the
	// stream's catch-up slots and one of the feed's backlog slots: it
	// comes without room reserved for it. After an answer with more
	// waiting behind it, the reader keeps (or takes) its catch-up slot
	// and reserves room for an answer like it before it reads the next;
	// a reader that is current long-polls holding neither.
	if !r.catchUp() {
		return r.ctx.Err()
	}
	defer r.caughtUp()
	defer r.unreserve()
	req := node.LogRequest{DB: r.s.db.Name, Partition: r.part, After: r.pos.SCN, MaxBytes: r.s.answerBytes(), AckedOnly: true}
	return node.StreamFrom(r.ctx, src, req, func(res *node.LogResult) error {
		err := r.answer(res)
		r.giveBacklog()
		r.unreserve() // room reserved for this answer and not taken
		if err != nil {
			return err
		}
		n := len(res.Commits)
		if n == 0 || !res.Commits[n-1].SCN.Less(head(res)) {
			r.caughtUp()
			return nil
		}
		if !r.streamSlot() {
			return r.ctx.Err()
		}
		if !r.reserveWithin(min(r.asked, r.s.streamBytes())) {
			return errNoRoom
		}
		return nil
	})
}

// head is the newest commit a log answer's source would send a change
// stream: its newest acknowledged commit, or, from a source of an earlier
// release that sends every commit, its newest.
func head(res *node.LogResult) storage.SCN {
	if res.AckedOnly && res.Acked.Less(res.SourceSCN) {
		return res.Acked
	}
	return res.SourceSCN
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
	r.asked = 0
	for i := range res.Commits {
		if err := r.commit(&res.Commits[i]); err != nil {
			return err
		}
	}
	if r.pos != r.sent && (time.Since(r.said) >= r.s.req.Heartbeat || len(res.Commits) == 0) || time.Since(r.said) >= 10*r.s.req.Heartbeat {
		if !r.offer(item{kind: "resolved", body: r.resolved(), pos: r.pos}) {
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
	for n, i := range picked {
		e := &c.Events[i]
		// Room for the event before it is rendered, from its stored
		// size. Without room soon the reader lets the answer go and asks
		// again from this event when there is (errNoRoom): it does not
		// hold a commit, or slots, while a consumer does not read.
		est := r.s.storedBytes(e) + 512
		if !r.takeRoom(est) {
			if n > 0 {
				r.pos = Position{SCN: prev, Skip: i}
			}
			return errNoRoom
		}
		r.asked += est
		if n == 0 && tx && skip == 0 {
			if !r.sendForced(item{kind: "transaction", body: r.boundary(c, "BEGIN", nil), pos: Position{SCN: prev}}) {
				r.s.held.release(est)
				return r.ctx.Err()
			}
		}
		counts[e.Table]++
		body, err := r.change(c, e, had+n+1, counts[e.Table])
		if err != nil {
			r.s.held.release(est)
			var u *unrenderable
			if errors.As(err, &u) {
				u.at = Position{SCN: prev, Skip: i} // resume at it
			}
			return err
		}
		size := len(body) + itemOverhead
		r.s.held.adjust(size - est)
		pos := Position{SCN: prev, Skip: i + 1}
		if n == len(picked)-1 && !tx {
			pos = done
		}
		if !r.sendTaken(item{kind: "change", body: body, pos: pos, size: size}) {
			return r.ctx.Err()
		}
	}
	if tx {
		if !r.sendForced(item{kind: "transaction", body: r.boundary(c, "END", counts), pos: done}) {
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
	// The snapshot's SCN, from its first chunk (the chunk itself is not
	// kept: a reader holds one chunk at most).
	var scn storage.SCN
	started := false
	// One row is held back, to be marked "last" if it is.
	var pending *storage.Row
	flush := func(flag string, pos Position) error {
		body, err := r.snapshotRow(scn, pending, flag)
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
	// Replicated: a snapshot holds no commit a failover could undo. Its
	// rows are state, all at the snapshot's SCN: a rollback to before
	// it could only be undone by dropping all of them, acknowledged
	// documents with the rest. (Changes after it may still be rolled
	// back; each names its own commit.)
	err = src.Snapshot(r.ctx, node.SnapshotRequest{DB: r.s.db.Name, Partition: r.part, Replicated: true}, func(c *node.SnapshotChunk) error {
		if !started {
			scn, started = c.SCN, true
			if !c.Replicated && r.s.f.Logger != nil {
				r.s.f.Logger.Warn("change stream: the partition's master is of an older release and did not wait for its replicas: a failover may roll back to before this snapshot", "db", r.s.db.Name, "partition", r.part, "scn", c.SCN)
			}
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
	if !started {
		return fmt.Errorf("partition %s/%d: an empty snapshot stream", r.s.db.Name, r.part)
	}
	at := Position{SCN: scn}
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
	b := append(eventBuffer(r.s.storedBytes(e)), `{"type":"change","op":"`...)
	b = append(b, opCodes[e.Op]...)
	b = append(b, `","before":`...)
	if r.s.before(e) {
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
	if b, err = r.source(b, e.Table, e.Key, c.SCN, r.target(t), "false", c.Timestamp); err != nil {
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
	b := append(eventBuffer(len(d.Value)), `{"type":"change","op":"r","before":null,"after":`...)
	if b, err = r.render(b, t, d.Version, d.Value); err != nil {
		return nil, &unrenderable{table: row.Table, key: row.Key, scn: scn, version: d.Version, err: err}
	}
	if b, err = r.source(b, row.Table, row.Key, scn, r.target(t), flag, d.Modified); err != nil {
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
	target := r.target(t)
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

// target is the schema version t's documents are rendered in: the
// stream's version, or t's latest (t as the change found it, so the
// before and after of one change are in one version, the one source
// names).
func (r *reader) target(t *schema.Table) int {
	if r.s.req.Version != 0 {
		return r.s.req.Version
	}
	return t.Latest().Number
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

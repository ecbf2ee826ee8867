package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cortado-db/cortado/internal/storage"
)

// LogRequest asks a partition's master for the commits after an SCN.
type LogRequest struct {
	DB        string
	Partition int
	After     storage.SCN
	// Max bounds the commits returned (default DefaultLogBatch), and MaxBytes their
	// size (storage.Commit.Size; default and at most MaxLogBytes): the
	// answer stops at the first commit that reaches it, so it holds at
	// least one commit whatever that one's size.
	Max, MaxBytes int
	// Wait is how long to wait for a commit when there is none yet.
	Wait time.Duration
	// Ack says the asker is a slave, Replica (its node ID), that durably
	// holds every commit up to After: semi-sync writes waiting for After
	// count it.
	Ack     bool
	Replica string
	// BufferOnly asks a relay to answer from its buffer only, never by
	// asking the master (a failover's drain: the master is gone, and a
	// paused one would hold the request).
	BufferOnly bool
	// AckedOnly asks for commits acknowledged to their writers only, up
	// to the answer's Acked: what a change stream sends, so that no
	// failover undoes what a consumer was told. The answer says whether
	// its source honoured it (LogResult.AckedOnly).
	AckedOnly bool
	// WatchAcked asks for an answer, with no commit when there is none,
	// once the source's Acked differs from AckedSeen: a relay's pull,
	// whose AckedOnly readers wait for the watermark. A source that
	// learns of it from acknowledgements answers at once, or, on a busy
	// stream (its last two answers with commits within ackNewsDelay of
	// each other and of now), within ackNewsDelay of the move unless a
	// commit comes first and carries it.
	WatchAcked bool
	AckedSeen  storage.SCN
	// pace is the stream this request continues (pollLog; not on the
	// wire).
	pace streamPace
}

// streamPace is when a log stream last sent commits, and how long before
// that it sent the ones before: whether the stream is busy.
type streamPace struct {
	sent time.Time
	gap  time.Duration
}

// sentAt records an answer with commits sent at now.
func (s *streamPace) sentAt(now time.Time) {
	s.sent, s.gap = now, now.Sub(s.sent)
}

// busy says whether the stream's last two answers with commits came
// within d of each other and the last within d of now.
func (s streamPace) busy(now time.Time, d time.Duration) bool {
	return s.gap < d && now.Sub(s.sent) < d
}

// LogResult is a batch of commits in SCN order, or word that the asker's
// timeline diverged from this one after Common (it must truncate to Common
// before following).
type LogResult struct {
	Commits []storage.Commit
	// Diverged is only ever said by the partition's master in force
	// (authoritative): a replica that is not, or no longer, master makes
	// the asker wait instead, so no replica truncates on a word from a
	// timeline that may itself be stale.
	Diverged bool
	Common   storage.SCN
	// Holds says the source holds the asker's After (it is on the
	// source's timeline).
	Holds bool
	// SourceRole and SourceSCN are the answering replica's role and last
	// SCN: a replica taking over mastership drains until the old master
	// is no longer MASTER and it holds the old master's last SCN.
	SourceRole Role
	SourceSCN  storage.SCN
	// Acked is the newest SCN of the source's timeline known to have
	// been acknowledged to a client: a slave records it with what it
	// applies, so that truncating it later is refused as an alarm.
	Acked storage.SCN
	// Trimmed says the asker's After is on the source's timeline but the
	// retained log starts after it (at LogStart): the asker is rebuilt
	// from a snapshot. Holds is false with it.
	Trimmed  bool
	LogStart storage.SCN
	// SourceBehind is how long before the answer its source last heard
	// from the partition's master: a relay's answer may lack what the
	// master committed since (0 from the master itself, and from a relay
	// of an earlier release). A slave's staleness counts from then.
	SourceBehind time.Duration
	// AckedOnly says the answer holds only commits up to Acked, as the
	// request asked (false from a source of an earlier release, which
	// sends every commit).
	AckedOnly bool
}

// LogSource is where a slave reads its master's log: a local Node, or a
// Remote one.
type LogSource interface {
	Log(ctx context.Context, req LogRequest) (*LogResult, error)
}

// LogStreamer is a LogSource that streams: it calls fn with what
// successive Log calls would answer, each continuing after the last
// commit of the one before, until ctx ends, fn fails, or (after fn saw
// it) the source says the reader diverged. Only the first answer
// acknowledges req.After; later ones come at least every second.
type LogStreamer interface {
	StreamLog(ctx context.Context, req LogRequest, fn func(*LogResult) error) error
}

// streamLog reads src as a LogStreamer, by long polls if it is not one.
func streamLog(ctx context.Context, src LogSource, req LogRequest, fn func(*LogResult) error) error {
	if s, ok := src.(LogStreamer); ok {
		return s.StreamLog(ctx, req, fn)
	}
	return pollLog(ctx, src, req, fn)
}

// pollLog is StreamLog by successive long polls: a reader on protocol 1
// or of a local source, and the server side of a stream. An answer that
// comes because ctx ended is not passed on.
func pollLog(ctx context.Context, src LogSource, req LogRequest, fn func(*LogResult) error) error {
	for ctx.Err() == nil {
		res, err := src.Log(ctx, req)
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			break
		}
		if err := fn(res); err != nil || res.Diverged || res.Trimmed {
			return err
		}
		if len(res.Commits) > 0 {
			req.After = res.Commits[len(res.Commits)-1].SCN
			req.pace.sentAt(time.Now())
		}
		req.Ack, req.Wait = false, logHeartbeat
		if req.WatchAcked {
			req.AckedSeen = res.Acked
		}
	}
	return ctx.Err()
}

// StreamRetry is the wait between the failed attempts of one log stream
// against one master (a slave's follower, a relay's pull): 100 ms,
// doubling to 1 s while the master keeps failing, and 100 ms again after
// an attempt that read for a second or more. Thousands of partitions
// retrying a master that is gone every 100 ms, until the controller
// moved them, took most of a core (docs/performance.md, "Many
// databases"); a new master gets a new stream, at 100 ms. The zero
// value is ready.
type StreamRetry struct{ wait time.Duration }

const (
	streamRetryMin = 100 * time.Millisecond
	streamRetryMax = time.Second
)

// Wait waits before the next attempt, or until ctx ends. began is when
// the failed attempt began; fresh starts the wait over at its least (an
// attempt that ended on purpose, not on a failure).
func (r *StreamRetry) Wait(ctx context.Context, began time.Time, fresh bool) {
	if r.wait == 0 || fresh || time.Since(began) >= streamRetryMax {
		r.wait = streamRetryMin
	}
	t := time.NewTimer(r.wait)
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	t.Stop()
	r.wait = min(2*r.wait, streamRetryMax)
}

// AckRequest tells a partition's master that Replica durably holds every
// commit up to SCN (a slave that reads the log through a relay).
type AckRequest struct {
	DB        string      `json:"db"`
	Partition int         `json:"partition"`
	Replica   string      `json:"replica"`
	SCN       storage.SCN `json:"scn"`
}

// AckResult says whether the master holds that SCN, and whether it is in
// force and established (slaves hold the marker of its generation).
type AckResult struct {
	Held          bool `json:"held"`
	Authoritative bool `json:"authoritative"`
	// Head is the answering replica's newest commit (zero from a node of
	// an earlier version).
	Head storage.SCN `json:"head"`
	// Acknowledged is, from an authoritative master, the newest commit
	// that as many replicas durably hold as a write needs before it is
	// acknowledged (the master's head when it needs none). A slave
	// answers reads only of commits up to it. Zero otherwise, and from a
	// node of an earlier version.
	Acknowledged storage.SCN `json:"acknowledged"`
}

// Acker takes acknowledgements: a partition's master.
type Acker interface {
	Ack(ctx context.Context, req AckRequest) (*AckResult, error)
}

// acknowledged is the newest commit of p known to be acknowledged in the
// sense writes are: the watermark acknowledged writes move; on the
// master in force, once established, as far as enough of its slaves
// durably hold (a write answered not-replicated whose commit they took
// since, or an earlier master's commit: no failover undoes either); on
// a node that masters every partition alone (serve with one node, where
// nothing else holds the commits), its durable commits.
func (n *Node) acknowledged(p *storage.Partition, db string, id int) storage.SCN {
	if n.roles.mastersAll() {
		return p.DurableSCN()
	}
	acked := p.AcknowledgedSCN()
	if n.authoritative(db, id) {
		if q, established := n.roles.entry(db, id).quorum(n.syncSlaves(db), p.DurableSCN()); established {
			acked = later(acked, q)
		}
	}
	return acked
}

// Ack records that a slave durably holds a commit, if it is on this
// replica's timeline.
func (n *Node) Ack(_ context.Context, req AckRequest) (*AckResult, error) {
	p, err := n.partition(req.DB, req.Partition)
	if err != nil {
		return nil, err
	}
	held := p.OnTimeline(req.SCN)
	e := n.roles.entry(req.DB, req.Partition)
	if held && req.Replica != "" {
		n.acked(p, e, req.Replica, req.SCN)
	}
	// Authoritative here means established too: the asker, a former
	// master, takes it as confirmation that its own commits up to SCN
	// survived the hand-over.
	res := &AckResult{Held: held, Head: p.SCN()}
	acked, established := e.quorum(n.syncSlaves(req.DB), res.Head)
	if n.authoritative(req.DB, req.Partition) && established {
		res.Authoritative, res.Acknowledged = true, acked
	}
	return res, nil
}

// acked records that replica holds everything up to scn and tells
// Options.AckLag, for each commit this acknowledges that this replica
// made as master, how long after it became durable here.
func (n *Node) acked(p *storage.Partition, e *partRole, replica string, scn storage.SCN) {
	prev := e.ack(replica, scn)
	if n.opts.AckLag == nil || prev.Gen != scn.Gen || !prev.Less(scn) {
		return // the first acknowledgement, or of a new generation: no known start
	}
	now := time.Now()
	p.DurableBetween(prev, scn, func(_ storage.SCN, at time.Time) { n.opts.AckLag(now.Sub(at)) })
}

// Log serves a partition's commits after req.After, waiting up to req.Wait
// for one when there is none.
func (n *Node) Log(ctx context.Context, req LogRequest) (*LogResult, error) {
	p, err := n.partition(req.DB, req.Partition)
	if err != nil {
		return nil, err
	}
	// Bounded whatever the asker says: a long poll holds a goroutine.
	if req.Max <= 0 || req.Max > MaxLogBatch {
		req.Max = min(max(req.Max, DefaultLogBatch), MaxLogBatch)
	}
	req.Wait = min(req.Wait, MaxLogWait)
	deadline := time.Now().Add(req.Wait)
	var news <-chan time.Time // the watermark moved: answer at this time unless a commit comes first
	for {
		changed := p.Changed()
		var moved <-chan struct{}
		if req.AckedOnly || req.WatchAcked {
			// Before the watermark is read: no move is missed. A
			// replica with no role here moves none.
			if e, _ := n.roles.lookup(req.DB, req.Partition); e != nil {
				moved = e.ackChanged()
			}
		}
		acked := n.acknowledged(p, req.DB, req.Partition)
		res := &LogResult{SourceRole: n.Role(req.DB, req.Partition), SourceSCN: p.SCN(), Acked: acked, Holds: true, AckedOnly: req.AckedOnly}
		if start := p.LogStart(); req.After.Less(start) && p.OnTimeline(req.After) {
			// The asker's position is on this timeline, but the log no
			// longer holds what follows it.
			res.Holds, res.Trimmed, res.LogStart = false, true, start
			return res, nil
		}
		if !req.After.IsZero() {
			ok := p.OnTimeline(req.After)
			res.Holds = ok
			if ok && req.Ack && req.Replica != "" {
				n.acked(p, n.roles.entry(req.DB, req.Partition), req.Replica, req.After)
			}
			if !ok && !behind(p, req.After) && n.authoritative(req.DB, req.Partition) {
				// The asker has a commit the partition's timeline does
				// not: it diverged after the newest commit both have.
				// (Reading on from its position would hand it later
				// commits of another history.)
				res.Common, res.Diverged = p.LastOnTimelineBefore(req.After), true
				return res, nil
			}
		}
		if res.Holds {
			size := 0
			err := p.ReadLog(req.After, func(c storage.Commit) bool {
				if req.AckedOnly && acked.Less(c.SCN) {
					return false
				}
				res.Commits = append(res.Commits, c)
				size += c.Size()
				return len(res.Commits) < req.Max && size < req.ByteLimit()
			})
			if errors.Is(err, storage.ErrTrimmed) {
				// The log was trimmed past the asker while it read.
				res.Commits, res.Holds, res.Trimmed, res.LogStart = nil, false, true, p.LogStart()
				return res, nil
			}
			if err != nil || len(res.Commits) > 0 {
				return res, err
			}
			if req.WatchAcked && acked != req.AckedSeen && news == nil {
				if !req.pace.busy(time.Now(), ackNewsDelay) {
					return res, nil // a quiet stream: told at once
				}
				// A busy one is told after a short while, in which a
				// commit would carry it: under writes most moves go
				// with the next commit, not in an answer of their own.
				t := time.NewTimer(ackNewsDelay)
				defer t.Stop()
				news = t.C
			}
		}
		// Nothing to serve yet: no new commit (or none acknowledged, if
		// that was asked), or this replica is behind the asker (it may
		// catch up), or it is not the master in force and cannot judge
		// the asker's timeline.
		wait := time.Until(deadline)
		if wait <= 0 {
			return res, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-changed:
		case <-moved:
		case <-news:
			t.Stop()
			return res, nil
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return res, nil
		}
		t.Stop()
	}
}

// ackNewsDelay is how long a busy log stream that watches the
// acknowledged watermark (LogRequest.WatchAcked) waits, after the
// watermark moved, for a commit to carry it before it answers with none.
// A stream is busy when its last two answers with commits came within
// ackNewsDelay of each other and the last within ackNewsDelay of now.
const ackNewsDelay = 5 * time.Millisecond

// ByteLimit is the most bytes of commits an answer to r holds before its
// last commit (MaxBytes within MaxLogBytes).
func (r *LogRequest) ByteLimit() int { return within(r.MaxBytes, MaxLogBytes) }

// Bounds on one log answer, on a node or a relay: commits, bytes (at
// least one commit is sent whatever its size; a wire message holds up to
// wire.MaxMessageBytes), and time waited.
const (
	// DefaultLogBatch is the commits an answer holds at most when the
	// request does not say.
	DefaultLogBatch = 256
	MaxLogBatch     = 10000
	MaxLogBytes     = 16 << 20
	MaxLogWait      = 10 * time.Second
)

// behind reports whether replica p is behind a follower at after in the
// follower's own generation and still in it, so it may yet reach after.
func behind(p *storage.Partition, after storage.SCN) bool {
	own := p.SCN()
	return own.Gen == after.Gen && own.Seq < after.Seq && p.Generation() == own.Gen
}

// FollowOptions says where a slave reads its partition's log.
type FollowOptions struct {
	// Source serves the log: the master, or a relay.
	Source LogSource
	// Master, when Source is a relay, is the master itself: the slave
	// acknowledges what it applied there (the relay's copy is in memory
	// and acknowledges nothing). Nil when Source is the master: the log
	// requests themselves acknowledge.
	Master Acker
	// Replica is this node's ID, as the master counts acknowledgements.
	Replica string
	// Truncated is told how many events each truncation undid.
	Truncated func(int)
	// Alarm is told of a truncation refused because it would remove
	// acknowledged commits.
	Alarm func(error)
}

// Follow keeps this node's replica of a partition on its master's
// timeline until ctx ends: it applies the master's commits in SCN order
// and, when its own timeline diverged (it was master before a failover),
// first truncates what the master's timeline does not contain — never an
// acknowledged commit (storage.ErrTruncateAcknowledged, an alarm).
func (n *Node) Follow(ctx context.Context, db string, id int, o FollowOptions) error {
	p, err := n.partition(db, id)
	if err != nil {
		return err
	}
	e := n.roles.entry(db, id)
	// Acknowledgements go to the master: the source itself, or, when the
	// source is a relay (whose copy is in memory and acknowledges
	// nothing), o.Master.
	acker := o.Master
	if acker == nil {
		acker, _ = o.Source.(Acker)
	}
	// The acknowledgements measure this replica's staleness, on its own
	// clock: an answer to one sent at t says what the master held at t
	// or later (its Head), so once this replica holds that, it holds
	// all the master had at t.
	var marks freshMarks
	var quiet *Quietness
	if o.Master != nil {
		// Through a relay: a relay that goes silent while the master
		// moves on ends the stream, and the slave reads the master.
		quiet = NewQuietness()
		var unwatch func()
		ctx, unwatch = WatchRelay(ctx, o.Master, db, id, p.SCN, quiet)
		defer unwatch()
	}
	for ctx.Err() == nil {
		// Each stream has its acknowledger (ackPipe): commits are applied
		// as they come, and acknowledged once durable, in order, while
		// the next ones apply and share their fsync.
		sctx, cancel := context.WithCancel(ctx)
		var pipe *ackPipe
		if acker != nil {
			pipe = n.startAcks(sctx, cancel, p, e, acker, o, &marks)
		}
		// The first answer does not wait: it tells at once whether the
		// source holds this replica's timeline and acknowledges what it
		// holds (durably: the partition's SCN).
		req := LogRequest{DB: db, Partition: id, After: p.SCN(), Ack: o.Master == nil, Replica: o.Replica}
		err := streamLog(sctx, o.Source, req, func(res *LogResult) error {
			if quiet != nil {
				quiet.Handling()
				defer quiet.Heard()
			}
			if res.Diverged {
				// Nothing of this stream is pending: a source says so
				// only of the position a stream starts from.
				if pipe != nil {
					if err := pipe.flush(); err != nil {
						return err
					}
				}
				return n.truncate(p, res.Common, o) // the stream ends here
			}
			if res.Trimmed {
				return fmt.Errorf("partition %s/%d at %s, the source's log starts after %s: %w", db, id, p.SCN(), res.LogStart, ErrRebuild)
			}
			if !res.Holds {
				return nil // the source waits for its master or its own catch-up
			}
			// Acked is on the source's timeline, which holds this
			// replica's.
			wait, err := p.ApplyAcknowledgedAsync(res.Commits, res.Acked)
			if err != nil {
				return err
			}
			if pipe == nil {
				// Nobody to ask (a source of tests): the answer's word,
				// once durable.
				if err := wait(); err != nil {
					return err
				}
				n.lagged(res.Commits)
				heardFromSource(e, p, res, o.Master != nil)
				return nil
			}
			// After every answer (at least once a second), once what it
			// brought is durable.
			return pipe.add(sctx, wait, res)
		})
		if pipe != nil {
			// What the stream applied is acknowledged before the next
			// stream starts (unless the stream ended for a failed
			// acknowledgement, or Follow's end).
			if perr := pipe.close(); perr != nil && (err == nil || errors.Is(err, context.Canceled)) {
				err = perr
			}
		}
		cancel()
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("partition %s/%d: follow: %w", db, id, err)
		}
	}
	if cause := context.Cause(ctx); errors.Is(cause, ErrRelayBehind) {
		return fmt.Errorf("partition %s/%d: follow: %w", db, id, cause)
	}
	return nil
}

// lagged reports the replication lag of commits this replica now holds
// durably.
func (n *Node) lagged(cs []storage.Commit) {
	if n.opts.ReplicationLag == nil {
		return
	}
	for i := range cs {
		n.opts.ReplicationLag(time.Since(cs[i].Timestamp))
	}
}

// ackPipe acknowledges, for one log stream of a slave, what it applied:
// each answer's commits once they are durable, in order, to the
// partition's master — the answers that became durable together with one
// acknowledgement, as each answer was acknowledged before. Its goroutine
// is the stream's: Follow closes it and waits for it when the stream
// ends.
type ackPipe struct {
	queue   chan ackItem
	cancel  context.CancelFunc // ends the stream when an acknowledgement fails
	done    chan struct{}
	pending sync.WaitGroup // answers queued, not yet durable and acknowledged

	mu  sync.Mutex
	err error // the first failure
}

type ackItem struct {
	wait func() error
	res  *LogResult
}

// ackDepth bounds the answers applied and not yet acknowledged: past it, a
// slave's stream waits for its fsyncs.
const ackDepth = 64

// startAcks starts the acknowledger of a stream read under ctx, which
// cancel ends.
func (n *Node) startAcks(ctx context.Context, cancel context.CancelFunc, p *storage.Partition, e *partRole, acker Acker, o FollowOptions, marks *freshMarks) *ackPipe {
	a := &ackPipe{queue: make(chan ackItem, ackDepth), cancel: cancel, done: make(chan struct{})}
	durable := func(it ackItem) {
		// Always waited for: the batch is released then.
		if err := it.wait(); err != nil {
			a.fail(err)
			return
		}
		n.lagged(it.res.Commits)
	}
	go func() {
		defer close(a.done)
		acked := false // an acknowledgement was sent on this stream
		for {
			var it ackItem
			select {
			case next, ok := <-a.queue:
				if !ok {
					return
				}
				it = next
			case <-e.asks:
				// A read waits for what this replica holds to be
				// confirmed: acknowledge it again now (what is durable,
				// as ever), not at the next answer — unless answers
				// wait here, whose acknowledgement comes next anyway.
				if acked && len(a.queue) == 0 && a.failed() == nil && ctx.Err() == nil {
					if err := n.acknowledge(ctx, p, e, acker, o, nil, marks); err != nil {
						a.fail(err)
					}
				}
				continue
			}
			acked = true
			handled, last := 1, it.res
			durable(it)
			// The answers queued meanwhile share the acknowledgement.
			for more := true; more; {
				select {
				case next, ok := <-a.queue:
					if ok {
						durable(next)
						handled, last = handled+1, next.res
					} else {
						more = false
					}
				default:
					more = false
				}
			}
			if a.failed() == nil && ctx.Err() == nil {
				if err := n.acknowledge(ctx, p, e, acker, o, last, marks); err != nil {
					a.fail(err)
				}
			}
			for range handled {
				a.pending.Done()
			}
		}
	}()
	return a
}

// add queues an answer whose commits are applied; wait awaits their
// fsync.
func (a *ackPipe) add(ctx context.Context, wait func() error, res *LogResult) error {
	if err := a.failed(); err != nil {
		wait()
		return err
	}
	a.pending.Add(1)
	select {
	case a.queue <- ackItem{wait, res}:
		return nil
	case <-ctx.Done():
		a.pending.Done()
		wait()
		return ctx.Err()
	}
}

// flush waits until everything queued is durable and acknowledged.
func (a *ackPipe) flush() error {
	a.pending.Wait()
	return a.failed()
}

// close ends the acknowledger once what is queued is durable (and, unless
// the stream ended, acknowledged), and returns its first failure.
func (a *ackPipe) close() error {
	close(a.queue)
	<-a.done
	return a.failed()
}

func (a *ackPipe) fail(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err == nil {
		a.err = err
		a.cancel()
	}
}

func (a *ackPipe) failed() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

// acknowledge tells the partition's master that this replica durably
// holds what it holds (its SCN), and learns from the answer how stale the
// replica is: a new master counts acknowledgements afresh, and a read
// there waits until replicas hold what it returns. An established master
// that holds everything this replica has confirms writes it took as a
// master before a hand-over: they survived. last is the source's last
// answer the replica applied (nil when a read asked: askConfirm).
func (n *Node) acknowledge(ctx context.Context, p *storage.Partition, e *partRole, acker Acker, o FollowOptions, last *LogResult, marks *freshMarks) error {
	scn := p.SCN()
	if at, ok := marks.reached(scn); ok {
		e.heardFromMaster(at)
	}
	sent := time.Now()
	ack, err := acker.Ack(ctx, AckRequest{DB: p.DB, Partition: p.ID, Replica: o.Replica, SCN: scn})
	if err != nil {
		return fmt.Errorf("acknowledge %s to the master: %w", scn, err)
	}
	switch {
	case ack.Head.IsZero():
		// A master of an earlier release says nothing of its head: the
		// answer's word (none for an acknowledgement a read asked for).
		if last != nil {
			heardFromSource(e, p, last, o.Master != nil)
		}
	case !ack.Authoritative:
		// Not a master in force: it says nothing of the partition's
		// master.
		marks.clear()
	case !ack.Held:
		// Off its master's timeline (commits of a master before a
		// failover, to be truncated): what it holds was never the
		// master's.
		marks.clear()
		e.forgetMaster()
	case !scn.Less(ack.Head):
		e.heardFromMaster(sent)
		marks.clear()
	default:
		marks.add(sent, ack.Head)
	}
	if ack.Held && ack.Authoritative {
		// What this replica holds counts as confirmed only as far as
		// enough replicas hold it for a write to be acknowledged: a read
		// here waits for that (awaitReplicated), as one on the master
		// does, so no reader sees a commit a failover could undo. With
		// the default minInSync of 2 this replica's own acknowledgement
		// completes the quorum; a master of an earlier release names no
		// quorum, and its word is taken for this replica's SCN.
		if !ack.Acknowledged.IsZero() && ack.Acknowledged.Less(scn) {
			scn = ack.Acknowledged
		}
		e.confirm(scn)
	}
	return nil
}

// heardFromSource records, for a replica that cannot ask its master, that
// it holds what the master had when the answer res was made (or when the
// relay that made it last heard from the master) — once it holds all
// its source had: an answer that is one batch of a longer catch-up says
// nothing of how far behind the replica is, and a source that is
// neither the master nor a relay (a master that stepped down, or one a
// relay passed the request to) nothing of the master. It trusts the
// answer to be fresh when it is applied; asking the master (freshMarks)
// does not.
func heardFromSource(e *partRole, p *storage.Partition, res *LogResult, viaRelay bool) {
	caughtUp := !p.SCN().Less(res.SourceSCN)
	if caughtUp && (res.SourceRole == Master || res.SourceRole == Offline && viaRelay) {
		e.heardFromMaster(time.Now().Add(-res.SourceBehind))
	}
}

// freshMarks are a slave's acknowledgements whose answers named a master's
// head it did not hold yet: each says that once the replica holds that
// head, it holds all the master had when the acknowledgement was sent.
// The oldest few are kept (when full, the newest is replaced): a slave
// reaches them in order.
type freshMarks struct {
	n     int
	marks [4]freshMark
}

type freshMark struct {
	sent time.Time
	head storage.SCN
}

func (f *freshMarks) add(sent time.Time, head storage.SCN) {
	if f.n == len(f.marks) {
		f.n--
	}
	f.marks[f.n] = freshMark{sent, head}
	f.n++
}

// reached drops the marks a replica at scn holds and returns the newest
// one's time.
func (f *freshMarks) reached(scn storage.SCN) (time.Time, bool) {
	i := 0
	for i < f.n && !scn.Less(f.marks[i].head) {
		i++
	}
	if i == 0 {
		return time.Time{}, false
	}
	at := f.marks[i-1].sent
	f.n = copy(f.marks[:], f.marks[i:f.n])
	return at, true
}

func (f *freshMarks) clear() { f.n = 0 }

// relayDoubt is how long a slave lets a relay's stream stay silent before
// it asks the master whether it is behind. A working relay answers at
// least every logHeartbeat; a stream is taken for dead only after logIdle,
// which alone would leave a master's semi-sync writes waiting that long
// on a relay cut off from its slaves.
const relayDoubt = logHeartbeat * 3 / 2

// ErrRelayBehind ends a read through a relay (a slave's Follow, a
// router's change stream) whose stream was silent for relayDoubt while
// the master held commits the reader lacked: it reads the master instead.
var ErrRelayBehind = fmt.Errorf("the relay's stream was silent for %v while the master held newer commits", relayDoubt)

// Quietness is how long a relay's stream has been silent: since its last
// answer, not counting the time its reader spends handling one.
type Quietness struct {
	last atomic.Int64 // unix nanoseconds
	busy atomic.Bool
}

// NewQuietness starts counting now.
func NewQuietness() *Quietness {
	q := &Quietness{}
	q.Heard()
	return q
}

// Handling says an answer came and is being handled.
func (q *Quietness) Handling() { q.busy.Store(true) }

// Heard says an answer was handled: the silence starts now.
func (q *Quietness) Heard() {
	q.last.Store(time.Now().UnixNano())
	q.busy.Store(false)
}

// Silent is how long the stream has been silent (0 while an answer is
// being handled).
func (q *Quietness) Silent() time.Duration {
	if q.busy.Load() {
		return 0
	}
	return time.Since(time.Unix(0, q.last.Load()))
}

// WatchRelay watches a relay's stream of a partition for its reader (a
// slave, or a router's change stream), which reads it under watched:
// when the stream has been silent for relayDoubt (asking at most once a
// relayDoubt), it asks the master for its newest commit, and ends watched
// with the cause ErrRelayBehind when the master holds one after at() —
// what the reader has — so that the reader can read the master instead.
// The question acknowledges nothing; it is bounded by ctx and
// logHeartbeat.
//
// It holds no goroutine between checks: a timer fires at most once a
// relayDoubt (a working relay answers every logHeartbeat, so the stream
// is seldom silent that long). stop ends watched and returns once no
// check runs.
func WatchRelay(ctx context.Context, master Acker, db string, id int, at func() storage.SCN, q *Quietness) (watched context.Context, stop func()) {
	watched, cancel := context.WithCancelCause(ctx)
	w := &relayWatch{ctx: watched, cancel: cancel, master: master, db: db, id: id, at: at, q: q}
	w.mu.Lock()
	w.t = time.AfterFunc(relayDoubt, w.check)
	w.mu.Unlock()
	return watched, w.stop
}

type relayWatch struct {
	ctx    context.Context // watched
	cancel context.CancelCauseFunc
	master Acker
	db     string
	id     int
	at     func() storage.SCN
	q      *Quietness
	asked  time.Time // guarded by the timer: one check at a time

	mu      sync.Mutex
	t       *time.Timer
	stopped bool
	running sync.WaitGroup // a check in progress
}

func (w *relayWatch) check() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.running.Add(1)
	w.mu.Unlock()
	defer w.running.Done()
	next := relayDoubt - w.q.Silent()
	if next <= 0 {
		if since := time.Since(w.asked); since < relayDoubt {
			next = relayDoubt - since
		} else {
			w.asked = time.Now()
			actx, cancel := context.WithTimeout(w.ctx, logHeartbeat)
			res, err := w.master.Ack(actx, AckRequest{DB: w.db, Partition: w.id, SCN: w.at()})
			cancel()
			if err == nil && w.at().Less(res.Head) {
				w.cancel(ErrRelayBehind)
				return
			}
			next = relayDoubt
		}
	}
	w.mu.Lock()
	if !w.stopped && w.ctx.Err() == nil {
		w.t.Reset(next)
	}
	w.mu.Unlock()
}

func (w *relayWatch) stop() {
	w.cancel(nil)
	w.mu.Lock()
	w.stopped = true
	w.t.Stop()
	w.mu.Unlock()
	w.running.Wait()
}

// truncate undoes this replica's commits after keep, reporting them, or
// raises the alarm when that would remove acknowledged commits.
func (n *Node) truncate(p *storage.Partition, keep storage.SCN, o FollowOptions) error {
	undone, err := p.TruncateAfter(keep)
	if errors.Is(err, storage.ErrTrimmed) {
		return fmt.Errorf("%w: %w", ErrRebuild, err)
	}
	e := n.roles.entry(p.DB, p.ID)
	e.ackMu.Lock()
	e.alarm = nil
	if errors.Is(err, storage.ErrTruncateAcknowledged) {
		e.alarm = err
	}
	e.ackMu.Unlock()
	if err != nil {
		if errors.Is(err, storage.ErrTruncateAcknowledged) && o.Alarm != nil {
			o.Alarm(err)
		}
		return err
	}
	if undone > 0 {
		n.log.Warn("replica truncated to its master's timeline", "db", p.DB, "partition", p.ID, "kept", keep, "undone", undone)
	}
	if o.Truncated != nil {
		o.Truncated(undone)
	}
	return nil
}

// ErrDrainIncomplete is returned by a planned Drain that could not bring
// the new master up to the old one: the hand-over must not go ahead.
var ErrDrainIncomplete = errors.New("drain incomplete: the old master did not hand over its last commit")

// Drain brings this replica of a partition up to its old master before it
// takes over: it applies the old master's commits until the old master has
// stopped being MASTER and this replica holds its last SCN, truncating
// first what the old master (still in force) says is not on its timeline.
//
// planned is a hand-over from a live master: if it does not complete
// within limit, Drain fails (ErrDrainIncomplete) and the caller must not
// become master. Otherwise (a failover: old is the relay, holding what the
// dead master shipped) Drain applies what it can get within limit and
// returns nil: the controller chose this replica because it holds every
// acknowledged commit already.
func (n *Node) Drain(ctx context.Context, db string, id int, old LogSource, limit time.Duration, planned bool, o FollowOptions) error {
	p, err := n.partition(db, id)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	incomplete := func(why error) error {
		if !planned {
			return nil
		}
		return fmt.Errorf("partition %s/%d at %s: %w: %v", db, id, p.SCN(), ErrDrainIncomplete, why)
	}
	for {
		// No waiting on the source: a relay or a stepped-down master
		// that has nothing newer says so at once.
		res, err := old.Log(ctx, LogRequest{DB: db, Partition: id, After: p.SCN(), BufferOnly: !planned})
		if err != nil {
			if ctx.Err() != nil || !planned {
				return incomplete(err)
			}
		} else if !planned && !res.Holds {
			return nil // the relay holds nothing after this replica
		} else if res.Trimmed {
			// This replica is behind the old master's retained log: it
			// cannot catch up by draining.
			return incomplete(ErrRebuild)
		} else {
			if res.Diverged {
				if !planned {
					return nil // the relay's timeline is not this one's
				}
				if err := n.truncate(p, res.Common, o); err != nil {
					return err
				}
				continue
			}
			if res.Holds {
				if err := p.ApplyAcknowledged(res.Commits, res.Acked); err != nil {
					return err
				}
				if res.SourceRole != Master && p.SCN() == res.SourceSCN {
					return nil
				}
				if len(res.Commits) > 0 {
					continue
				}
			} else if res.SourceRole != Master && res.SourceSCN.Less(p.SCN()) {
				// The source stepped down (or never took over) behind
				// this replica on this replica's own timeline: it holds
				// nothing this replica lacks.
				if p.OnTimeline(res.SourceSCN) {
					return nil
				}
			}
		}
		t := time.NewTimer(10 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return incomplete(ctx.Err())
		case <-t.C:
		}
	}
}

// StreamFrom reads src's log from req.After as LogStreamer.StreamLog
// does: by one stream when src streams, else by successive long polls.
func StreamFrom(ctx context.Context, src LogSource, req LogRequest, fn func(*LogResult) error) error {
	return streamLog(ctx, src, req, fn)
}

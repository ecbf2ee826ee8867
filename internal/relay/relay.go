// Package relay owns the relay role (Databus in the Espresso design): it
// pulls every master partition's commit log, in SCN order, into a
// per-partition buffer bounded in commits and in bytes, and serves it to
// slaves (and change-stream readers) through the same log API as a storage
// node; readers that ask for acknowledged commits only (change streams)
// get those up to the master's acknowledged watermark, whose moves the
// pull asks the master to tell it of. A reader behind the buffer, or on
// another timeline, is served by re-reading from the master. A relay that
// starts (or whose buffer the master's retained log has passed) fills its
// buffer from where the master's retained log starts, not from before it.
// The relay's copy is in memory, so it acknowledges nothing: a semi-sync
// write is acknowledged once slaves durably hold it (slaves that read
// through the relay acknowledge to the master directly). Its answers say
// how long ago it last heard from the master, so that its readers never
// take its own answers for the master's word. A new master chosen in a
// failover drains the relay before it takes over.
package relay

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/coord"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/storage"
	"github.com/cortado-db/cortado/internal/topo"
	"github.com/cortado-db/cortado/internal/wire"
)

// Defaults of the buffers: how many commits a partition's buffer holds,
// and how many bytes of commits (storage.Commit.Size: keys, documents
// and pre-images) the relay holds in all, unless Relay.Buffer and
// Relay.BufferBytes say otherwise. The bytes bound the relay's memory
// whatever the documents' size and the number of partitions: 10,000
// commits of 2 MiB documents and their pre-images would be 40 GB a
// partition. 256 MiB over the 64 partitions of a database is 4 MiB each,
// about 2,000 commits of 1 KB documents.
const (
	DefaultBuffer      = 10000
	DefaultBufferBytes = 256 << 20
	// minShare is the least a partition's buffer may hold whatever the
	// number of partitions (a relay of 4,096 partitions holds up to
	// 256 MiB of them).
	minShare = 64 << 10
)

// Relay pulls and serves commit logs.
type Relay struct {
	Client *clientv3.Client
	Prefix string
	// Buffer is how many commits a partition's buffer holds (default
	// 10,000), and BufferBytes how many bytes of commits the relay holds
	// in all (default 256 MiB), each partition an equal share (at least
	// 64 KiB); older ones are re-read from the master.
	Buffer, BufferBytes int
	Logger              *slog.Logger
	// Pulled and Served, when set, count commits pulled from masters and
	// served to readers from the buffer.
	Pulled, Served func(n int)
	// ProtocolVersion is the newest internal protocol version spoken to
	// masters (default wire.Version).
	ProtocolVersion uint32
	// Local, if set, holds the storage nodes of this process (serve
	// --nodes N): the relay pulls from them without the wire.
	Local *node.LocalPeers

	mu      sync.Mutex
	parts   map[partKey]*partition
	nparts  atomic.Int64   // len(parts)
	added   chan struct{}  // closed (and replaced) when a partition is added
	remotes node.Remotes   // log streams to masters
	pulls   sync.WaitGroup // every puller; Run waits for them
}

type partKey struct {
	db string
	id int
}

// partition is one partition's buffer: commits after base, contiguous, in
// SCN order, pulled from master.
type partition struct {
	mu      sync.Mutex
	master  string // URL pulled from
	base    storage.SCN
	commits []storage.Commit
	bytes   int         // the commits' Size, summed
	acked   storage.SCN // the master's acknowledged SCN, last heard
	// heard is when the pull last had an answer from the partition's
	// master: the buffer holds what the master had then (answers say
	// how long ago, LogResult.SourceBehind).
	heard   time.Time
	changed chan struct{} // closed when commits are added or dropped
	moved   chan struct{} // closed when acked moves
	// ackedAsked is when a reader last asked for acknowledged commits
	// only (a change stream's); while that is within watchLinger the
	// pull's stream watches the master's watermark (watching), and
	// rewatch ends a stream that does not, for the pull to start one
	// that does. Without such readers nobody pays for the watermark's
	// answers.
	ackedAsked time.Time
	watching   bool
	rewatch    context.CancelFunc
	cancel     context.CancelFunc
	pulled     chan struct{} // closed when the current puller has returned
}

// watchLinger is how long after an acknowledged-only reader last asked
// the relay's pull of its partition goes on watching the master's
// acknowledged watermark.
const watchLinger = time.Minute

// last is the newest SCN held; the caller holds mu.
func (p *partition) last() storage.SCN {
	if len(p.commits) == 0 {
		return p.base
	}
	return p.commits[len(p.commits)-1].SCN
}

// Buffered is the bytes of commits the buffers hold.
func (r *Relay) Buffered() int64 {
	r.mu.Lock()
	parts := make([]*partition, 0, len(r.parts))
	for _, p := range r.parts {
		parts = append(parts, p)
	}
	r.mu.Unlock()
	var n int64
	for _, p := range parts {
		p.mu.Lock()
		n += int64(p.bytes)
		p.mu.Unlock()
	}
	return n
}

// share is the bytes one partition's buffer may hold.
func (r *Relay) share() int {
	return max(minShare, r.BufferBytes/int(max(1, r.nparts.Load())))
}

// add appends commits, which follow the buffer's last, then drops the
// oldest until at most maxCommits and maxBytes remain (all of them, when
// the newest alone is larger); base becomes the last dropped. The caller
// holds mu.
func (p *partition) add(commits []storage.Commit, maxCommits, maxBytes int) {
	p.commits = append(p.commits, commits...)
	for i := range commits {
		p.bytes += commits[i].Size()
	}
	drop := max(0, len(p.commits)-maxCommits)
	for i := range drop {
		p.bytes -= p.commits[i].Size()
	}
	for drop < len(p.commits) && p.bytes > maxBytes {
		p.bytes -= p.commits[drop].Size()
		drop++
	}
	if drop > 0 {
		p.base = p.commits[drop-1].SCN
		// Reslice rather than copy: once the buffer is full every pull
		// drops a few, and copying the rest each time was most of the
		// relay's CPU. The dropped entries are cleared so their documents
		// can be collected; append moves the live ones to a new array
		// when this one's capacity runs out.
		clear(p.commits[:drop])
		p.commits = p.commits[drop:]
	}
}

func (p *partition) notify() {
	if p.changed != nil {
		close(p.changed)
		p.changed = nil
	}
}

// ackMoved wakes the readers waiting for acknowledged commits; the
// caller holds mu.
func (p *partition) ackMoved() {
	if p.moved != nil {
		close(p.moved)
		p.moved = nil
	}
}

// Run follows the routing tables and pulls from every partition's master
// until ctx ends.
func (r *Relay) Run(ctx context.Context) error {
	if r.Buffer <= 0 {
		r.Buffer = DefaultBuffer
	}
	if r.BufferBytes <= 0 {
		r.BufferBytes = DefaultBufferBytes
	}
	r.mu.Lock()
	r.parts = map[partKey]*partition{}
	r.remotes.MaxVersion = r.ProtocolVersion
	r.remotes.Local = r.Local
	r.mu.Unlock()
	coord.Watch(ctx, r.Client, r.Prefix+"/routing/").Each(func(c coord.Change) {
		for _, kv := range c.Puts() {
			r.apply(ctx, kv.Value)
		}
	})
	r.mu.Lock()
	for _, p := range r.parts {
		p.mu.Lock()
		if p.cancel != nil {
			p.cancel()
		}
		p.mu.Unlock()
	}
	r.mu.Unlock()
	r.pulls.Wait()
	r.remotes.Close()
	return nil
}

// apply points each partition's puller at the master a routing table
// names.
func (r *Relay) apply(ctx context.Context, b []byte) {
	var t topo.RoutingTable
	if json.Unmarshal(b, &t) != nil {
		return
	}
	for id := range t.Partitions {
		_, url := t.Master(id)
		p := r.part(t.DB, id)
		p.mu.Lock()
		if p.master == url {
			p.mu.Unlock()
			continue
		}
		if p.cancel != nil {
			p.cancel()
		}
		p.master = url
		pctx, cancel := context.WithCancel(ctx)
		p.cancel = cancel
		prev, done := p.pulled, make(chan struct{})
		p.pulled = done
		p.mu.Unlock()
		if url == "" {
			close(done)
			continue
		}
		master := r.remotes.Source(url)
		r.pulls.Go(func() {
			defer close(done)
			// One puller at a time fills the buffer: the one it
			// replaces has returned first.
			if prev != nil {
				<-prev
			}
			r.pull(pctx, t.DB, id, p, master)
		})
	}
}

func (r *Relay) part(db string, id int) *partition {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := partKey{db, id}
	p := r.parts[k]
	if p == nil {
		p = &partition{}
		r.parts[k] = p
		r.nparts.Store(int64(len(r.parts)))
		if r.added != nil {
			close(r.added)
			r.added = nil
		}
	}
	return p
}

// unknownGrace is how long a log request for a partition the relay has not
// yet seen in a routing table waits for it: a slave may start following
// before the relay's own watch delivers the table.
const unknownGrace = 2 * time.Second

// awaitPart returns the partition once a routing table names it, or nil
// after unknownGrace or when ctx ends.
func (r *Relay) awaitPart(ctx context.Context, db string, id int) *partition {
	t := time.NewTimer(unknownGrace)
	defer t.Stop()
	for {
		r.mu.Lock()
		p := r.parts[partKey{db, id}]
		if p != nil || r.parts == nil {
			r.mu.Unlock()
			return p
		}
		if r.added == nil {
			r.added = make(chan struct{})
		}
		added := r.added
		r.mu.Unlock()
		select {
		case <-added:
		case <-t.C:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

// pull keeps p's buffer up to date from master until ctx ends: one log
// stream at a time, restarted after the buffer's last commit when it
// breaks or the master says the buffer diverged.
func (r *Relay) pull(ctx context.Context, db string, id int, p *partition, master node.LogSource) {
	var retry node.StreamRetry
	for ctx.Err() == nil {
		began := time.Now()
		sctx, rewatch := context.WithCancel(ctx)
		p.mu.Lock()
		after := p.last()
		// Readers that take only acknowledged commits (change streams)
		// wait for the watermark's moves: while there are any, the
		// master tells of each.
		p.watching, p.rewatch = p.wantWatch(), rewatch
		req := node.LogRequest{DB: db, Partition: id, After: after, Wait: time.Second, WatchAcked: p.watching, AckedSeen: p.acked}
		p.mu.Unlock()
		err := node.StreamFrom(sctx, master, req, func(res *node.LogResult) error {
			p.mu.Lock()
			defer p.mu.Unlock()
			if !res.Diverged && p.acked != res.Acked {
				p.acked = res.Acked
				p.ackMoved()
			}
			switch {
			case res.Trimmed:
				// The master's retained log starts after the buffer:
				// start the buffer over there (readers behind it are
				// passed to the master, which sends them a snapshot).
				p.commits, p.base, p.bytes = nil, res.LogStart, 0
				return errRestart
			case res.Diverged:
				// The new master's timeline ends our buffer's at Common.
				keep := 0
				for keep < len(p.commits) && !res.Common.Less(p.commits[keep].SCN) {
					keep++
				}
				for _, c := range p.commits[keep:] {
					p.bytes -= c.Size()
				}
				clear(p.commits[keep:])
				p.commits = p.commits[:keep]
				if keep == 0 && res.Common.Less(p.base) {
					p.base = res.Common
				}
			case len(res.Commits) > 0 && p.last() == after:
				p.add(res.Commits, r.Buffer, r.share())
				after = p.last()
				if r.Pulled != nil {
					r.Pulled(len(res.Commits))
				}
			case len(res.Commits) > 0:
				return errRestart // the buffer moved under the stream
			}
			if res.SourceRole == node.Master && !res.Diverged && !p.last().Less(res.SourceSCN) {
				// The buffer holds all the master had when it answered.
				// (An answer that is one batch of a longer catch-up says
				// nothing of how far behind the buffer is.)
				p.heard = time.Now()
			}
			if len(res.Commits) > 0 || res.Diverged {
				p.notify()
			}
			if p.watching && !p.wantWatch() {
				return errRestart // no acknowledged-only reader for a while
			}
			return nil
		})
		rewatched := sctx.Err() != nil && ctx.Err() == nil
		rewatch()
		if err != nil && ctx.Err() == nil && !rewatched {
			retry.Wait(ctx, began, errors.Is(err, errRestart))
		}
	}
}

var errRestart = errors.New("relay: restart the log stream")

// wantWatch says whether an acknowledged-only reader asked within
// watchLinger; the caller holds mu.
func (p *partition) wantWatch() bool {
	return !p.ackedAsked.IsZero() && time.Since(p.ackedAsked) < watchLinger
}

// neverHeard is the SourceBehind of a buffer whose pull has had no
// answer from the master: a reader's staleness is then unbounded.
const neverHeard = 100 * 365 * 24 * time.Hour

// Log serves a partition's commits after req.After from the buffer,
// waiting up to req.Wait for one; a request the buffer cannot answer (the
// asker is behind it, or on another timeline) is passed to the master.
func (r *Relay) Log(ctx context.Context, req node.LogRequest) (*node.LogResult, error) {
	if req.Max <= 0 || req.Max > node.MaxLogBatch {
		req.Max = min(max(req.Max, node.DefaultLogBatch), node.MaxLogBatch)
	}
	req.Wait = min(req.Wait, node.MaxLogWait)
	p := r.awaitPart(ctx, req.DB, req.Partition)
	if p == nil {
		return nil, node.ErrUnavailable
	}
	deadline := time.Now().Add(req.Wait)
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		// Its last answer is made after the wait, so that it says how
		// long ago the master was heard as of when it is sent.
		last := ctx.Err() != nil || !time.Now().Before(deadline)
		p.mu.Lock()
		start, ok := p.find(req.After)
		if !ok {
			master := p.master
			p.mu.Unlock()
			if req.BufferOnly {
				return &node.LogResult{SourceRole: node.Offline}, nil // Holds false
			}
			if master == "" {
				return nil, node.ErrUnavailable
			}
			return r.remotes.Source(master).Log(ctx, req)
		}
		res := &node.LogResult{SourceRole: node.Offline, SourceSCN: p.last(), Holds: true, Acked: p.acked, SourceBehind: neverHeard, AckedOnly: req.AckedOnly}
		if !p.heard.IsZero() {
			res.SourceBehind = time.Since(p.heard)
		}
		stop := len(p.commits)
		if req.AckedOnly {
			stop = p.upTo(p.acked)
			p.ackedAsked = time.Now()
			if !p.watching && p.rewatch != nil {
				p.rewatch() // the pull starts a stream that watches the watermark
				p.rewatch = nil
			}
		}
		if start < stop {
			end, size := start, 0
			for end < stop && end-start < req.Max && size < req.ByteLimit() {
				size += p.commits[end].Size()
				end++
			}
			res.Commits = append([]storage.Commit(nil), p.commits[start:end]...)
			p.mu.Unlock()
			if r.Served != nil {
				r.Served(len(res.Commits))
			}
			return res, nil
		}
		if last {
			p.mu.Unlock()
			return res, nil
		}
		if p.changed == nil {
			p.changed = make(chan struct{})
		}
		changed := p.changed
		var moved chan struct{}
		if req.AckedOnly {
			if p.moved == nil {
				p.moved = make(chan struct{})
			}
			moved = p.moved
		}
		p.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
		}
		select {
		case <-changed:
		case <-moved:
		case <-timer.C:
		case <-ctx.Done():
		}
	}
}

// upTo is how many buffered commits are at or before scn; the caller
// holds mu.
func (p *partition) upTo(scn storage.SCN) int {
	return sort.Search(len(p.commits), func(i int) bool { return scn.Less(p.commits[i].SCN) })
}

// find returns the index of the first buffered commit after scn, if scn is
// the buffer's base or one of its commits; the caller holds mu.
func (p *partition) find(scn storage.SCN) (int, bool) {
	if scn == p.base {
		return 0, true
	}
	lo, hi := 0, len(p.commits)
	for lo < hi {
		m := (lo + hi) / 2
		if p.commits[m].SCN.Less(scn) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(p.commits) && p.commits[lo].SCN == scn {
		return lo + 1, true
	}
	return 0, false
}

// Register serves the relay's log API on s (the storage node's Log and
// StreamLog), so slaves read from it with node.Remote.
func (r *Relay) Register(s *wire.Server, o node.ServeOptions) {
	node.RegisterLog(s, r.Log, o)
}

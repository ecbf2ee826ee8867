// Package relay owns the relay role (Databus in the Espresso design): it
// pulls every master partition's commit log, in SCN order, into a bounded
// per-partition buffer, and serves it to slaves (and change-stream
// readers) through the same log API as a storage node. A reader behind
// the buffer, or on another timeline, is served by re-reading from the
// master. The relay's copy is in memory, so it acknowledges nothing: a
// semi-sync write is acknowledged once slaves durably hold it (slaves that
// read through the relay acknowledge to the master directly). A new
// master chosen in a failover drains the relay before it takes over.
package relay

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/cluster"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/storage"
)

// Relay pulls and serves commit logs.
type Relay struct {
	Client *clientv3.Client
	Prefix string
	// Buffer is how many commits a partition's buffer holds (default
	// 10,000); older ones are re-read from the master.
	Buffer int
	Logger *slog.Logger
	// Pulled and Served, when set, count commits pulled from masters and
	// served to readers from the buffer.
	Pulled, Served func(n int)

	mu      sync.Mutex
	parts   map[partKey]*partition
	remotes node.Remotes // log streams to masters
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
	acked   storage.SCN // the master's acknowledged SCN, last heard
	changed chan struct{}
	cancel  context.CancelFunc
}

// last is the newest SCN held; the caller holds mu.
func (p *partition) last() storage.SCN {
	if len(p.commits) == 0 {
		return p.base
	}
	return p.commits[len(p.commits)-1].SCN
}

func (p *partition) notify() {
	if p.changed != nil {
		close(p.changed)
		p.changed = nil
	}
}

// Run follows the routing tables and pulls from every partition's master
// until ctx ends.
func (r *Relay) Run(ctx context.Context) error {
	if r.Buffer <= 0 {
		r.Buffer = 10000
	}
	r.mu.Lock()
	r.parts = map[partKey]*partition{}
	r.remotes.New = node.NewLogRemote
	r.mu.Unlock()
	for ctx.Err() == nil {
		resp, err := r.Client.Get(ctx, r.Prefix+"/routing/", clientv3.WithPrefix())
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for _, kv := range resp.Kvs {
			r.apply(ctx, kv.Value)
		}
		for wr := range r.Client.Watch(ctx, r.Prefix+"/routing/", clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut {
					r.apply(ctx, ev.Kv.Value)
				}
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.parts {
		if p.cancel != nil {
			p.cancel()
		}
	}
	return nil
}

// apply points each partition's puller at the master a routing table
// names.
func (r *Relay) apply(ctx context.Context, b []byte) {
	var t cluster.RoutingTable
	if json.Unmarshal(b, &t) != nil {
		return
	}
	for id := range t.Partitions {
		_, url := t.Master(id)
		p := r.part(t.DB, id, true)
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
		p.mu.Unlock()
		if url != "" {
			go r.pull(pctx, t.DB, id, p, r.remotes.Get(url))
		}
	}
}

func (r *Relay) part(db string, id int, create bool) *partition {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := partKey{db, id}
	p := r.parts[k]
	if p == nil && create {
		p = &partition{}
		r.parts[k] = p
	}
	return p
}

// pull keeps p's buffer up to date from master until ctx ends.
func (r *Relay) pull(ctx context.Context, db string, id int, p *partition, master *node.Remote) {
	for ctx.Err() == nil {
		p.mu.Lock()
		after := p.last()
		p.mu.Unlock()
		res, err := master.Log(ctx, node.LogRequest{DB: db, Partition: id, After: after, Wait: time.Second})
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		p.mu.Lock()
		if !res.Diverged {
			p.acked = res.Acked
		}
		switch {
		case res.Diverged:
			// The new master's timeline ends our buffer's at Common.
			keep := 0
			for keep < len(p.commits) && !res.Common.Less(p.commits[keep].SCN) {
				keep++
			}
			p.commits = p.commits[:keep]
			if keep == 0 && res.Common.Less(p.base) {
				p.base = res.Common
			}
		case len(res.Commits) > 0 && p.last() == after:
			p.commits = append(p.commits, res.Commits...)
			if r.Pulled != nil {
				r.Pulled(len(res.Commits))
			}
			if over := len(p.commits) - r.Buffer; over > 0 {
				p.base = p.commits[over-1].SCN
				p.commits = append([]storage.Commit(nil), p.commits[over:]...)
			}
		}
		p.notify()
		p.mu.Unlock()
	}
}

// Log serves a partition's commits after req.After from the buffer,
// waiting up to req.Wait for one; a request the buffer cannot answer (the
// asker is behind it, or on another timeline) is passed to the master.
func (r *Relay) Log(ctx context.Context, req node.LogRequest) (*node.LogResult, error) {
	if req.Max <= 0 || req.Max > node.MaxLogBatch {
		req.Max = min(max(req.Max, 256), node.MaxLogBatch)
	}
	req.Wait = min(req.Wait, node.MaxLogWait)
	p := r.part(req.DB, req.Partition, false)
	if p == nil {
		return nil, node.ErrUnavailable
	}
	deadline := time.Now().Add(req.Wait)
	for {
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
			return r.remotes.Get(master).Log(ctx, req)
		}
		res := &node.LogResult{SourceRole: node.Offline, SourceSCN: p.last(), Holds: true, Acked: p.acked}
		if start < len(p.commits) {
			end := min(len(p.commits), start+req.Max)
			res.Commits = append([]storage.Commit(nil), p.commits[start:end]...)
			p.mu.Unlock()
			if r.Served != nil {
				r.Served(len(res.Commits))
			}
			return res, nil
		}
		if p.changed == nil {
			p.changed = make(chan struct{})
		}
		changed := p.changed
		p.mu.Unlock()
		select {
		case <-changed:
		case <-time.After(time.Until(deadline)):
			return res, nil
		case <-ctx.Done():
			return res, nil
		}
	}
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

// Handler serves the relay's log API (POST /_node/log, the storage node's
// shape), so slaves read from it with node.Remote.
func (r *Relay) Handler() http.Handler {
	return node.LogHandler(r.Log)
}

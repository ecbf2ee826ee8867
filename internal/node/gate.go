package node

import (
	"context"
	"sync"

	"github.com/cortado-db/cortado/internal/storage"
)

// DefaultWriteBytes is how many bytes of documents a node's writes may
// carry at once (Options.WriteBytes).
const DefaultWriteBytes = 16 << 20

// byteGate bounds the bytes of documents the writes in progress carry:
// what a write costs in memory grows with them (a text-indexed document
// of 1.9 MB held some 45 MB while it was indexed and committed), and a
// count of requests does not see that. Writes wait their turn in order;
// one larger than the bound goes alone.
type byteGate struct {
	mu      sync.Mutex
	max     int64 // 0: no bound
	free    int64
	waiting []*gateWaiter
}

type gateWaiter struct {
	n     int64
	ready chan struct{}
}

func newByteGate(max int64) *byteGate { return &byteGate{max: max, free: max} }

// acquire takes n bytes (at most the bound), waiting until they are free
// or ctx ends; it returns what to give back.
func (g *byteGate) acquire(ctx context.Context, n int64) (int64, error) {
	if g.max <= 0 || n <= 0 {
		return 0, nil
	}
	n = min(n, g.max)
	g.mu.Lock()
	if len(g.waiting) == 0 && g.free >= n {
		g.free -= n
		g.mu.Unlock()
		return n, nil
	}
	w := &gateWaiter{n: n, ready: make(chan struct{})}
	g.waiting = append(g.waiting, w)
	g.mu.Unlock()
	select {
	case <-w.ready:
		return n, nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-w.ready: // granted meanwhile: give it back
		g.free += n
	default:
		for i, o := range g.waiting {
			if o == w {
				g.waiting = append(g.waiting[:i], g.waiting[i+1:]...)
				break
			}
		}
	}
	g.grant() // the next ones may fit now
	return 0, ctx.Err()
}

// share takes up to want bytes without waiting: what is free, but at
// least floor, beyond the bound if it must be (a log stream always moves
// on, if in small answers). Without a bound it grants want. Give it back
// with release.
func (g *byteGate) share(want, floor int64) int64 {
	if g.max <= 0 || want <= 0 {
		return max(want, 0)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	n := min(want, max(g.free, floor))
	g.free -= n
	return n
}

// release gives back what acquire or share took.
func (g *byteGate) release(n int64) {
	if n == 0 || g.max <= 0 {
		return
	}
	g.mu.Lock()
	g.free += n
	g.grant()
	g.mu.Unlock()
}

// grant lets waiting writes in, in order, while they fit.
func (g *byteGate) grant() {
	for len(g.waiting) > 0 && g.free >= g.waiting[0].n {
		w := g.waiting[0]
		g.waiting = g.waiting[1:]
		g.free -= w.n
		close(w.ready)
	}
}

// weight is the bytes of documents a write handles: the documents it
// carries, and those it patches or deletes, read for their size (a patch
// of one field of a large text-indexed document re-indexes all of it). A
// put counts twice, for what it may replace. A collection's delete counts
// nothing: its index entries go by range, and the commit's bound
// (storage.MaxCommitBytes) bounds the rest.
func weight(p *storage.Partition, r *WriteRequest) int64 {
	var n int64
	for i := range r.Ops {
		op := &r.Ops[i]
		switch op.Kind {
		case OpInsert:
			n += int64(len(op.Value))
		case OpPut:
			n += 2 * int64(len(op.Value))
		case OpPatch, OpDelete:
			if d, ok, err := p.Get(op.Table, op.Key); err == nil && ok {
				n += int64(len(d.Value))
			}
		}
	}
	return n
}

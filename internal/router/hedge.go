package router

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cortado-db/cortado/internal/node"
)

// Hedged reads: a read that accepts a slave's answer (Cache-Control:
// max-stale) goes to the master; if the master has not answered within
// its usual time (its recent p95, within bounds), the same read goes to a
// slave too, and the first answer wins (the other is cancelled). A read
// of many documents (a collection page, a multi-get, a query) hedges
// each partition's call to a node of another process the same way. Hedges are paid from a budget per destination host — a
// tenth of that host's recent successful traffic plus a small floor —
// never from a global one, so retries cannot pile onto a replica set
// that is already slow. Writes are never hedged.

// HedgeOptions configure hedged reads; zero values take the defaults.
type HedgeOptions struct {
	// Off disables hedging.
	Off bool
	// MinDelay and MaxDelay bound the wait before a hedge (defaults 2 ms
	// and 50 ms); within them it is the master's recent p95.
	MinDelay, MaxDelay time.Duration
	// Ratio is the part of a host's successful requests it may receive
	// as hedges (default 0.1); Floor is the hedges per second a host
	// may receive whatever its traffic (default 1). Up to Burst are
	// banked (default 2,000): hedges are rare while every node is well,
	// and the bank is what a stall of a node spends — a node serving
	// 1,500 reads a second banks 2,000 in 13 s, enough to take half of
	// a stopped peer's reads at 5,000 a second for over two seconds
	// (`scripts/bench-stall`), where a bank of 10 let 95 % of them wait
	// for the stopped node and fill the router's slots.
	Ratio, Floor, Burst float64
}

func (o *HedgeOptions) defaults() {
	if o.MinDelay == 0 {
		o.MinDelay = 2 * time.Millisecond
	}
	if o.MaxDelay == 0 {
		o.MaxDelay = 50 * time.Millisecond
	}
	if o.Ratio == 0 {
		o.Ratio = 0.1
	}
	if o.Floor == 0 {
		o.Floor = 1
	}
	if o.Burst == 0 {
		o.Burst = 2000
	}
}

// hosts tracks each destination host's latency and hedge budget.
type hosts struct {
	opts HedgeOptions
	mu   sync.Mutex
	m    map[string]*host

	sent, won, denied atomic.Uint64
}

type host struct {
	lat    [128]time.Duration // recent successful latencies, a ring
	n      int
	p95    time.Duration
	stale  int // samples since p95 was computed
	tokens float64
	last   time.Time // of the floor's last refill
}

func newHosts(o HedgeOptions) *hosts {
	o.defaults()
	return &hosts{opts: o, m: map[string]*host{}}
}

func (hs *hosts) get(addr string) *host {
	h := hs.m[addr]
	if h == nil {
		h = &host{tokens: hs.opts.Burst, last: time.Now()}
		hs.m[addr] = h
	}
	return h
}

// observe records a successful request to addr: its latency, and a
// tenth of a token of hedge budget.
func (hs *hosts) observe(addr string, d time.Duration) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	h := hs.get(addr)
	h.lat[h.n%len(h.lat)] = d
	h.n++
	if h.stale++; h.stale >= 16 || h.p95 == 0 {
		h.stale = 0
		n := min(h.n, len(h.lat))
		s := slices.Clone(h.lat[:n])
		slices.Sort(s)
		h.p95 = s[n*95/100]
	}
	h.tokens = min(hs.opts.Burst, h.tokens+hs.opts.Ratio)
}

// delay is how long to wait for master (at addr) before hedging: at once
// if it has answered none of the calls waiting on it for longer than the
// longest delay (stopped, cut off), else its recent p95, within bounds.
func (hs *hosts) delay(master node.Service, addr string) time.Duration {
	if q, ok := master.(interface{ Quiet() time.Duration }); ok && q.Quiet() > hs.opts.MaxDelay {
		return hs.opts.MinDelay
	}
	hs.mu.Lock()
	defer hs.mu.Unlock()
	h := hs.get(addr)
	if h.n < 16 {
		return hs.opts.MaxDelay
	}
	return min(max(h.p95, hs.opts.MinDelay), hs.opts.MaxDelay)
}

// spend takes one hedge from addr's budget, if it has one.
func (hs *hosts) spend(addr string) bool {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	h := hs.get(addr)
	now := time.Now()
	h.tokens = min(hs.opts.Burst, h.tokens+now.Sub(h.last).Seconds()*hs.opts.Floor)
	h.last = now
	if h.tokens < 1 {
		hs.denied.Add(1)
		return false
	}
	h.tokens--
	hs.sent.Add(1)
	return true
}

// addrOf names a service's host, if it says.
func addrOf(s node.Service) string {
	if a, ok := s.(interface{ Addr() string }); ok {
		return a.Addr()
	}
	return ""
}

// hedgeable says whether reads of master can be hedged: hedging is on,
// the router knows slaves, and master names its host (whose budget and
// latency are counted).
func (r *Router) hedgeable(master node.Service) (replicaBackend, string, bool) {
	rb, ok := r.backend.(replicaBackend)
	addr := addrOf(master)
	return rb, addr, ok && !r.hedges.opts.Off && addr != ""
}

// hedge makes a read of partition part's master (call with slave false)
// and, if the master has not answered within its delay (hosts.delay),
// the same read of the first of the partition's slaves whose host has
// budget (call with slave true). The first answer that stands — stands
// says which errors are answers, as a not-found is — wins, and the other
// call is cancelled; a slave's failure leaves the read to the master.
// hedged says whether a slave was asked: when the master failed before
// that, its error is returned and the caller decides where the read goes
// next. The caller checks hedgeable first.
func hedge[T any](ctx context.Context, r *Router, rb replicaBackend, maddr, db string, part int, master node.Service,
	stands func(error) bool, call func(ctx context.Context, n node.Service, slave bool) (T, error)) (v T, slave, hedged bool, err error) {
	type result struct {
		v     T
		err   error
		slave bool
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make(chan result, 2)
	start := time.Now()
	timer := time.NewTimer(r.hedges.delay(master, maddr))
	defer timer.Stop()
	go func() {
		v, err := call(ctx, master, false)
		if err == nil {
			r.hedges.observe(maddr, time.Since(start))
		}
		results <- result{v, err, false}
	}()
	pending := 1
	var masterRes *result
	for pending > 0 {
		select {
		case res := <-results:
			pending--
			if !res.slave {
				masterRes = &res
			}
			if res.err == nil || stands(res.err) {
				if res.slave {
					r.hedges.won.Add(1)
				}
				return res.v, res.slave, hedged, res.err
			}
			if !hedged && !res.slave {
				return res.v, false, false, res.err // the caller decides
			}
			// Wait for the other call: the master may still answer, or
			// the slave.
		case <-timer.C:
			if hedged {
				continue
			}
			for _, s := range rb.Slaves(db, part) {
				if a := addrOf(s); a != "" && r.hedges.spend(a) {
					hedged, pending = true, pending+1
					go func() {
						t0 := time.Now()
						v, err := call(ctx, s, true)
						if err == nil {
							r.hedges.observe(a, time.Since(t0))
						}
						results <- result{v, err, true}
					}()
					break
				}
			}
		}
	}
	if masterRes != nil {
		return masterRes.v, false, hedged, masterRes.err
	}
	return v, false, hedged, ctx.Err()
}

// getStands says which errors of a document read are answers.
func getStands(err error) bool {
	return errors.Is(err, node.ErrNotFound) || errors.Is(err, node.ErrNotModified)
}

// hedgedGet reads from master, hedging to a slave as above. When the
// master fails before a hedge, it returns what slaveGet would.
func (r *Router) hedgedGet(ctx context.Context, master node.Service, req node.GetRequest, maxStale time.Duration) (*node.Item, bool, error) {
	rb, maddr, ok := r.hedgeable(master)
	if !ok {
		return r.plainGet(ctx, master, req, maxStale)
	}
	it, slave, hedged, err := hedge(ctx, r, rb, maddr, req.DB, req.Partition, master, getStands,
		func(ctx context.Context, n node.Service, slave bool) (*node.Item, error) {
			q := req
			if slave {
				q.MaxStale = maxStale
			}
			return n.Get(ctx, q)
		})
	if err == nil || hedged || getStands(err) {
		return it, slave, err
	}
	overloaded := errors.Is(err, node.ErrOverloaded)
	if !overloaded && !errors.Is(err, node.ErrUnavailable) && !errors.Is(err, node.ErrNotMaster) {
		return it, false, err // the master's answer stands
	}
	// The master failed before the hedge: the slaves, in turn, as
	// without hedging — but a master that refused the read as
	// overloaded (it did nothing) is retried only within the slaves'
	// budgets: a cluster-wide overload must not double its reads.
	return r.slaveGet(ctx, req, maxStale, err, overloaded)
}

// hedging is a partition's master whose reads of many documents
// (MultiGet, Scan: their requests carry MaxStale, which a master in
// force ignores) are hedged to its slaves, as hedgedGet hedges a
// document's; slave is set when a slave answered one. A read its master
// fails before a hedge fails as without hedging (the fan-out then asks
// the slaves of a master that is gone: router.onSlaves).
type hedging struct {
	node.Service
	r     *Router
	rb    replicaBackend
	addr  string
	db    string
	part  int
	slave *bool
}

// hedged returns master as a hedging service for a read that accepts
// maxStale, when its reads can be hedged, else master. A master in this
// process is not hedged: a router of `serve` calls its own nodes in the
// request's goroutine, and they stall with it.
func (r *Router) hedged(db string, part int, master node.Service, maxStale time.Duration, slave *bool) node.Service {
	if maxStale <= 0 || node.IsInProcess(master) {
		return master
	}
	rb, addr, ok := r.hedgeable(master)
	if !ok {
		return master
	}
	return hedging{master, r, rb, addr, db, part, slave}
}

func (h hedging) MultiGet(ctx context.Context, req node.MultiGetRequest) (*node.MultiGetResult, error) {
	res, slave, _, err := hedge(ctx, h.r, h.rb, h.addr, h.db, h.part, h.Service, noneStand,
		func(ctx context.Context, n node.Service, _ bool) (*node.MultiGetResult, error) {
			return n.MultiGet(ctx, req)
		})
	*h.slave = *h.slave || slave
	return res, err
}

func (h hedging) Scan(ctx context.Context, req node.ScanRequest) (*node.ScanResult, error) {
	res, slave, _, err := hedge(ctx, h.r, h.rb, h.addr, h.db, h.part, h.Service, noneStand,
		func(ctx context.Context, n node.Service, _ bool) (*node.ScanResult, error) { return n.Scan(ctx, req) })
	*h.slave = *h.slave || slave
	return res, err
}

// noneStand: every error of a read of many documents is a failure.
func noneStand(error) bool { return false }

// plainGet is a read without hedging: the master, then the slaves if it
// is unavailable and staleness is allowed.
func (r *Router) plainGet(ctx context.Context, master node.Service, req node.GetRequest, maxStale time.Duration) (*node.Item, bool, error) {
	it, err := master.Get(ctx, req)
	if err != nil && maxStale > 0 && (errors.Is(err, node.ErrUnavailable) || errors.Is(err, node.ErrNotMaster)) {
		return r.slaveGet(ctx, req, maxStale, err, false)
	}
	return it, false, err
}

// HedgeStats counts hedged reads: hedges sent, hedges whose answer came
// first, and hedges the destination's budget refused.
func (r *Router) HedgeStats() (sent, won, denied uint64) {
	return r.hedges.sent.Load(), r.hedges.won.Load(), r.hedges.denied.Load()
}

package routing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/topo"
)

// SickAfter is how many calls in a row must fail to reach a node (or be
// slower than SlowCall), over at least SickFor, before a router reports
// it sick: a burst of failures in an instant (calls failing fast while
// the connection to a node that just restarted is being redialled) is
// no evidence.
const (
	SickAfter = 3
	SickFor   = time.Second
)

// SlowCall is how long a read from a node may take before it counts as a
// failure toward a report: a node stuck on its disk is no better than a
// dead one.
const SlowCall = 2 * time.Second

// reporter is a router's side of failure reporting: it registers the
// router under a lease and, for each node that keeps failing to answer,
// puts a report that stands for ReportTTL seconds (deleted sooner if the
// node answers again). The controller treats a node reported by a
// majority of live routers as failed, though it still holds its lease: a
// node that etcd sees but clients cannot reach is no use as a master.
type reporter struct {
	cli    *clientv3.Client
	prefix string
	id     string
	log    *slog.Logger
	// ctx ends with the view; every etcd call of the reporter runs in
	// calls, which the view waits for before it is done.
	ctx          context.Context
	calls        sync.WaitGroup
	registration *topo.Registration // the router's own, ended with ctx

	mu       sync.Mutex
	failures map[string]failing
	reported map[string]bool
	stopped  bool // no more calls: the view is stopping
	slow     slowness
	slowOn   bool // report slow outliers too
}

// failing is a node's run of failed calls: how many, since when.
type failing struct {
	n     int
	since time.Time
}

// stop waits for the reporter's calls to etcd; it makes no more.
func (r *reporter) stop() {
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
	r.calls.Wait()
	<-r.registration.Done()
}

// ReportSickNodes makes the view's router register as self (its ID, and
// its process record) and report the nodes it cannot reach — and, with
// slowNodes, those whose reads are slow outliers — until ctx ends.
func (v *RoutingView) ReportSickNodes(ctx context.Context, cli *clientv3.Client, prefix string, self topo.Process, ttlSeconds int, slowNodes bool, log *slog.Logger) error {
	self.Role = topo.RoleRouter
	id := self.ID
	reg, err := topo.PutLeased(ctx, cli, topo.RoutersPrefix(prefix)+id, id, ttlSeconds, self.KV(prefix))
	if err != nil {
		return err
	}
	v.mu.Lock()
	v.reporter = &reporter{cli: cli, prefix: prefix, id: id, log: log, ctx: ctx, registration: reg, failures: map[string]failing{}, reported: map[string]bool{}, slowOn: slowNodes}
	v.mu.Unlock()
	return nil
}

// RegistrationLapsed says since when this router's registration in etcd
// has lapsed (ReportSickNodes): it has not reached etcd for a lease's
// TTL, so the routing tables it routes by may be out of date.
func (v *RoutingView) RegistrationLapsed() (since time.Time, lapsed bool) {
	v.mu.RLock()
	r := v.reporter
	v.mu.RUnlock()
	if r == nil {
		return time.Time{}, false
	}
	return r.registration.Lapsed()
}

// observe records the outcome of a call to node id (of the given
// incarnation: a report is about one run of a node, and a restarted node
// starts with a clean slate).
func (r *reporter) observe(nodeID string, inc int64, took time.Duration, err error) {
	if r == nil {
		return
	}
	id := fmt.Sprintf("%s/%d", nodeID, inc)
	failed := errors.Is(err, node.ErrUnavailable) || took > SlowCall && !errors.Is(err, node.ErrNotReplicated)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil && took > 0 && r.slowOn && r.slow.observe(nodeID, took, time.Now()) && !r.reported[id] && !r.stopped {
		// Answering, but far slower than its peers for a while: as good
		// as failed for the clients of its partitions.
		r.reported[id] = true
		r.log.Warn("router: reporting a storage node far slower than the others", "node", nodeID, "router", r.id)
		r.calls.Go(func() { r.report(id) })
		return
	}
	if !failed {
		if r.failures[id].n == 0 {
			return
		}
		delete(r.failures, id)
		if r.reported[id] && !r.stopped {
			delete(r.reported, id)
			r.calls.Go(func() { r.cli.Delete(r.ctx, r.key(id)) })
		}
		return
	}
	f := r.failures[id]
	if f.n == 0 {
		f.since = time.Now()
	}
	f.n++
	r.failures[id] = f
	if f.n >= SickAfter && time.Since(f.since) >= SickFor && !r.reported[id] && !r.stopped {
		r.reported[id] = true
		r.log.Warn("router: reporting a storage node it cannot reach", "node", nodeID, "router", r.id)
		r.calls.Go(func() { r.report(id) })
	}
}

// ReportTTL is how long a report stands: then the node is given another
// chance (and reported again if it still fails).
const ReportTTL = 30

// report keeps a report of node id for ReportTTL seconds.
func (r *reporter) report(id string) {
	ctx := r.ctx
	g, err := r.cli.Grant(ctx, ReportTTL)
	if err == nil {
		_, err = r.cli.Put(ctx, r.key(id), r.id, clientv3.WithLease(g.ID))
	}
	if err != nil {
		r.log.Warn("router: report", "node", id, "err", err)
	}
	time.AfterFunc(ReportTTL*time.Second, func() {
		r.mu.Lock()
		delete(r.reported, id)
		delete(r.failures, id)
		r.mu.Unlock()
	})
}

func (r *reporter) key(id string) string { return topo.ReportsPrefix(r.prefix) + id + "/" + r.id }

// reporting is a node's Service that tells the reporter how each call
// went.
type reporting struct {
	node.Service
	id  string
	inc int64
	r   *reporter
}

// Addr names the node's host (for per-host budgets): its ID.
func (s reporting) Addr() string { return s.id }

// InProcess is the node's (node.InProcess).
func (s reporting) InProcess() bool { return node.IsInProcess(s.Service) }

// Quiet is the node's (node.Remote.Quiet).
func (s reporting) Quiet() time.Duration { return quietOf(s.Service) }

// quietOf is how long s has been silent, if it says (node.Remote.Quiet).
func quietOf(s node.Service) time.Duration {
	if q, ok := s.(interface{ Quiet() time.Duration }); ok {
		return q.Quiet()
	}
	return 0
}

func (s reporting) Get(ctx context.Context, req node.GetRequest) (*node.Item, error) {
	start := time.Now()
	it, err := s.Service.Get(ctx, req)
	s.r.observe(s.id, s.inc, time.Since(start), err)
	return it, err
}

func (s reporting) MultiGet(ctx context.Context, req node.MultiGetRequest) (*node.MultiGetResult, error) {
	start := time.Now()
	res, err := s.Service.MultiGet(ctx, req)
	s.r.observe(s.id, s.inc, time.Since(start), err)
	return res, err
}

func (s reporting) Scan(ctx context.Context, req node.ScanRequest) (*node.ScanResult, error) {
	start := time.Now()
	res, err := s.Service.Scan(ctx, req)
	s.r.observe(s.id, s.inc, time.Since(start), err)
	return res, err
}

func (s reporting) Write(ctx context.Context, req node.WriteRequest) (*node.WriteResult, error) {
	res, err := s.Service.Write(ctx, req)
	// A write's time is mostly its replication's (semi-sync), not the
	// node's: only failures to reach it count.
	s.r.observe(s.id, s.inc, 0, err)
	return res, err
}

// Slow-node detection: a node whose reads' median latency stays, for
// SlowOutlierFor, at least SlowOutlierMin and SlowOutlierRatio times the
// median of the other nodes' is reported like one that fails: it answers,
// but its partitions' clients wait as if it did not. Both bounds guard
// against false alarms: a loaded machine slows every node alike.
const (
	SlowOutlierMin   = 250 * time.Millisecond
	SlowOutlierRatio = 10
	SlowOutlierFor   = 10 * time.Second
	slowSamples      = 32 // recent reads per node
)

type slowness struct {
	nodes map[string]*readLatency
}

type readLatency struct {
	ring  [slowSamples]time.Duration
	n     int
	since time.Time // when it became an outlier; zero: it is not
}

func (l *readLatency) median() time.Duration {
	n := min(l.n, slowSamples)
	s := make([]time.Duration, n)
	copy(s, l.ring[:n])
	slices.Sort(s)
	return s[n/2]
}

// observe records a read of node and reports whether the node has been
// an outlier for SlowOutlierFor.
func (s *slowness) observe(nodeID string, took time.Duration, now time.Time) bool {
	if s.nodes == nil {
		s.nodes = map[string]*readLatency{}
	}
	l := s.nodes[nodeID]
	if l == nil {
		l = &readLatency{}
		s.nodes[nodeID] = l
	}
	l.ring[l.n%slowSamples] = took
	l.n++
	if l.n < slowSamples/2 {
		return false
	}
	var others []time.Duration
	for id, o := range s.nodes {
		if id != nodeID && o.n >= slowSamples/2 {
			others = append(others, o.median())
		}
	}
	if len(others) == 0 {
		return false
	}
	slices.Sort(others)
	m, peers := l.median(), others[len(others)/2]
	if m < SlowOutlierMin || m < SlowOutlierRatio*peers {
		l.since = time.Time{}
		return false
	}
	if l.since.IsZero() {
		l.since = now
	}
	return now.Sub(l.since) >= SlowOutlierFor
}

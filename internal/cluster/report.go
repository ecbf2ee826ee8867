package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/node"
)

// SickAfter is how many calls in a row must fail to reach a node (or be
// slower than SlowCall) before a router reports it sick.
const SickAfter = 3

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

	mu       sync.Mutex
	failures map[string]int
	reported map[string]bool
}

// ReportSickNodes makes the view's router register as id and report the
// nodes it cannot reach, until ctx ends.
func (v *RoutingView) ReportSickNodes(ctx context.Context, cli *clientv3.Client, prefix, id string, ttlSeconds int, log *slog.Logger) error {
	if err := putLeased(ctx, cli, routersPrefix(prefix)+id, id, ttlSeconds); err != nil {
		return err
	}
	v.mu.Lock()
	v.reporter = &reporter{cli: cli, prefix: prefix, id: id, log: log, failures: map[string]int{}, reported: map[string]bool{}}
	v.mu.Unlock()
	return nil
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
	if !failed {
		if r.failures[id] == 0 {
			return
		}
		r.failures[id] = 0
		if r.reported[id] {
			delete(r.reported, id)
			go r.cli.Delete(context.Background(), r.key(id))
		}
		return
	}
	r.failures[id]++
	if r.failures[id] >= SickAfter && !r.reported[id] {
		r.reported[id] = true
		r.log.Warn("router: reporting a storage node it cannot reach", "node", nodeID, "router", r.id)
		go r.report(id)
	}
}

// ReportTTL is how long a report stands: then the node is given another
// chance (and reported again if it still fails).
const ReportTTL = 30

// report keeps a report of node id for ReportTTL seconds.
func (r *reporter) report(id string) {
	ctx := context.Background()
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
		r.failures[id] = 0
		r.mu.Unlock()
	})
}

func (r *reporter) key(id string) string { return reportsPrefix(r.prefix) + id + "/" + r.id }

// sickNodes lists the nodes ("id/incarnation") a majority of live routers
// report.
func sickNodes(ctx context.Context, cli *clientv3.Client, prefix string) (map[string]bool, error) {
	routers, err := cli.Get(ctx, routersPrefix(prefix), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || routers.Count == 0 {
		return nil, err
	}
	reports, err := cli.Get(ctx, reportsPrefix(prefix), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	by := map[string]int{}
	for _, kv := range reports.Kvs {
		rest := strings.TrimPrefix(string(kv.Key), reportsPrefix(prefix))
		if i := strings.LastIndexByte(rest, '/'); i > 0 {
			by[rest[:i]]++ // id/incarnation
		}
	}
	sick := map[string]bool{}
	for id, n := range by {
		if int64(n) > routers.Count/2 {
			sick[id] = true
		}
	}
	return sick, nil
}

// reporting is a node's Service that tells the reporter how each call
// went.
type reporting struct {
	node.Service
	id  string
	inc int64
	r   *reporter
}

func (s reporting) Get(ctx context.Context, req node.GetRequest) (*node.Item, error) {
	start := time.Now()
	it, err := s.Service.Get(ctx, req)
	s.r.observe(s.id, s.inc, time.Since(start), err)
	return it, err
}

func (s reporting) MultiGet(ctx context.Context, req node.MultiGetRequest) ([]*node.Item, error) {
	start := time.Now()
	items, err := s.Service.MultiGet(ctx, req)
	s.r.observe(s.id, s.inc, time.Since(start), err)
	return items, err
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

package routing

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/coord"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/topo"
)

// RoutingView is a router's copy of the routing tables, kept by a watch. It
// sends each partition's work to its master.
type RoutingView struct {
	mu      sync.RWMutex
	tables  map[string]*topo.RoutingTable
	remotes node.Remotes
	done    chan struct{}
	// reporter, when set, reports nodes this router cannot reach.
	reporter *reporter
	// local holds storage nodes of this process by URL, called without
	// the wire (CallLocally).
	local  map[string]node.Service
	cli    *clientv3.Client
	prefix string
	// Requests sent elsewhere than the table's master (redirecting): to
	// the master a slave named, to the table's slaves.
	toNamed, toSlaves atomic.Uint64
}

// RedirectStats counts requests sent elsewhere than the table's master:
// to the master a slave named, and to the table's slaves after the
// master could not be reached while cut off from etcd.
func (v *RoutingView) RedirectStats() (named, slaves uint64) {
	return v.toNamed.Load(), v.toSlaves.Load()
}

// WatchRouting loads the routing tables and follows them until ctx ends.
// stall, if given, is how the view's connections to storage nodes guard
// against a stalled node.
func WatchRouting(ctx context.Context, cli *clientv3.Client, prefix string, stall ...node.StallOptions) (*RoutingView, error) {
	v := &RoutingView{tables: map[string]*topo.RoutingTable{}, done: make(chan struct{}), cli: cli, prefix: prefix}
	for _, s := range stall {
		v.remotes.Stall = s
	}
	w := coord.Watch(ctx, cli, topo.RoutingPrefix(prefix))
	select {
	case c := <-w.Changes(): // the first lists every table
		for _, kv := range c.KVs {
			v.set(kv.Value)
		}
	case <-ctx.Done():
		<-w.Done()
		return nil, ctx.Err()
	}
	go func() {
		defer close(v.done)
		defer func() {
			v.mu.RLock()
			rep := v.reporter
			v.mu.RUnlock()
			if rep != nil {
				rep.stop()
			}
		}()
		// Tables only move to newer versions (set keeps the newest), so
		// a Reset is applied like changes.
		w.Each(func(c coord.Change) {
			for _, kv := range c.Puts() {
				v.set(kv.Value)
			}
		})
	}()
	return v, nil
}

// StorageNodes counts the registered storage nodes: how many replicas a
// new database can have.
func (v *RoutingView) StorageNodes(ctx context.Context) (int, error) {
	nodes, err := topo.LiveNodes(ctx, v.cli, v.prefix)
	return len(nodes), err
}

// OldestProtocol is the oldest internal protocol version a live storage
// node or a registered controller says it speaks, and which process that
// is (0 and "" when there is none; 0 for a process that does not say).
func (v *RoutingView) OldestProtocol(ctx context.Context) (uint32, string, error) {
	nodes, err := topo.LiveNodes(ctx, v.cli, v.prefix)
	if err != nil {
		return 0, "", err
	}
	procs, err := topo.Processes(ctx, v.cli, v.prefix)
	if err != nil {
		return 0, "", err
	}
	oldest, who := uint32(0), ""
	see := func(p uint32, name string) {
		if who == "" || p < oldest {
			oldest, who = p, name
		}
	}
	for _, n := range nodes {
		see(n.Protocol, "storage node "+n.ID)
	}
	for _, p := range procs {
		if p.Role == topo.RoleController {
			see(p.Protocol, "controller "+p.ID)
		}
	}
	return oldest, who, nil
}

// Done is closed when the watch has ended.
func (v *RoutingView) Done() <-chan struct{} { return v.done }

func (v *RoutingView) set(b []byte) {
	var t topo.RoutingTable
	if json.Unmarshal(b, &t) != nil {
		return
	}
	v.mu.Lock()
	old := v.tables[t.DB]
	if old != nil && old.Version >= t.Version {
		v.mu.Unlock()
		return
	}
	v.tables[t.DB] = &t
	v.mu.Unlock()
	if old == nil {
		return
	}
	// A node the new table no longer lists left the cluster (its
	// registration is gone: it failed, was cut off from etcd, or its
	// disk failed): it can acknowledge nothing now, so the calls
	// waiting on it end at once as unavailable rather than at their
	// deadlines. A failed disk's writes hang in their fsync while the
	// node still answers pings, which the stall guard (node/stall.go)
	// rightly takes for alive.
	for id, url := range old.Nodes {
		if t.Nodes[id] != url {
			v.remotes.Left(url)
		}
	}
}

// Table returns a database's current routing table.
func (v *RoutingView) Table(db string) *topo.RoutingTable {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.tables[db]
}

// Slaves returns a partition's slaves, in the routing table's order (for
// reads that accept staleness when the master cannot answer).
func (v *RoutingView) Slaves(db string, part int) []node.Service {
	return v.slavesOf(v.Table(db), part)
}

// slavesOf is a partition's slaves in table t that t knows an address of.
func (v *RoutingView) slavesOf(t *topo.RoutingTable, part int) []node.Service {
	if t == nil || part < 0 || part >= len(t.Partitions) {
		return nil
	}
	var out []node.Service
	for _, id := range t.Partitions[part].Replicas[min(1, len(t.Partitions[part].Replicas)):] {
		if url, ok := t.Nodes[id]; ok {
			out = append(out, v.service(t, id, url))
		}
	}
	return out
}

// CallLocally makes the view hand out, for a node whose URL is in local,
// local's service instead of a connection to it: storage nodes of the
// router's own process.
func (v *RoutingView) CallLocally(local map[string]node.Service) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.local = local
}

// service is node id at url, reporting to the reporter if there is one.
func (v *RoutingView) service(t *topo.RoutingTable, id, url string) node.Service {
	v.mu.RLock()
	rep, r := v.reporter, v.local[url]
	v.mu.RUnlock()
	if r == nil {
		r = v.remotes.Get(url)
	}
	if rep == nil {
		return r
	}
	return reporting{Service: r, id: id, inc: t.Incarnations[id], r: rep}
}

// Node returns the master of a partition (router.Backend). With no master
// known it fails with node.ErrNotMaster, which clients see as 503. A
// request the node refuses as a slave of a newer master goes there
// (redirecting).
func (v *RoutingView) Node(db string, part int) (node.Service, error) {
	t := v.Table(db)
	id, url := t.Master(part)
	if url == "" {
		return nil, fmt.Errorf("partition %s/%d has no master: %w", db, part, node.ErrNotMaster)
	}
	return redirecting{Service: v.service(t, id, url), v: v, t: t, part: part}, nil
}

// AwaitDatabase waits until db has a routing table and every partition's
// master has taken up its role in that table's generation.
func (v *RoutingView) AwaitDatabase(ctx context.Context, db string) error {
	for {
		if t := v.Table(db); t != nil && v.mastersReady(ctx, t) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (v *RoutingView) mastersReady(ctx context.Context, t *topo.RoutingTable) bool {
	byNode := map[string][]int{}
	for p := range t.Partitions {
		id, _ := t.Master(p)
		if id == "" {
			return false
		}
		byNode[id] = append(byNode[id], p)
	}
	for id, parts := range byNode {
		st, err := v.remotes.Get(t.Nodes[id]).Status(ctx, node.StatusRequest{DB: t.DB})
		if err != nil {
			return false
		}
		ready := map[int]bool{}
		for _, s := range st {
			ready[s.Partition] = s.Role == node.Master && s.Generation == t.Partitions[s.Partition].Generation
		}
		for _, p := range parts {
			if !ready[p] {
				return false
			}
		}
	}
	return true
}

package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/cortado-db/cortado/internal/coord"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/placement"
	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/topo"
)

// Controller is the cluster manager. Several may run; one is elected
// (etcd's election recipe) and the others stand by. The leader keeps every
// database's routing table at the ideal state of the live nodes: when a
// node's lease lapses, each partition it mastered gets a master among its
// live replicas, in the next generation.
type Controller struct {
	Client   *clientv3.Client
	Prefix   string // etcd prefix, e.g. /cortado
	Registry *registry.Registry
	ID       string // this controller, for logs and the election value
	// LeaseTTL is the election session's TTL in seconds (default 5): how
	// long a standby waits after the leader dies.
	LeaseTTL int
	// Interval is how often the leader re-checks even without a change
	// (default 500ms).
	Interval time.Duration
	Log      *slog.Logger
	// OneByOne publishes one routing table version per changed partition
	// instead of one for all (see publishOneByOne); for benchmarks.
	OneByOne bool
	// CheckInterval, when set, runs the consistency check (Check) this
	// often while leading and hands the results to OnCheck.
	CheckInterval time.Duration
	OnCheck       func([]PartitionCheck)
	// StuckAfter is how long a partition's master may report a role other
	// than MASTER (its hand-over drain failed) before the controller
	// chooses again, in a new generation (default 8s: a failed drain ends
	// at the agent's 5 s drain limit).
	StuckAfter time.Duration

	remotes node.Remotes
	// stuckSince is when each partition's master (db/partition/generation)
	// was first seen not mastering it; fenced holds nodes failed by router
	// reports whose revoked lease may still look valid to them, until when.
	// Both belong to the leading loop only.
	stuckSince map[string]time.Time
	fenced     map[string]fencedNode
	// raising follows the raises of minInSync under way, by database
	// (settleRaise); it belongs to the leading loop only.
	raising map[string]*raise
}

// fencedNode is a node the controller expelled (revoked its lease) and
// still treats as master of its partitions until its own view of its
// lease has certainly lapsed.
type fencedNode struct {
	info  topo.NodeInfo
	until time.Time
}

// Run campaigns and, while leader, reconciles, until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	if c.LeaseTTL == 0 {
		c.LeaseTTL = topo.DefaultLeaseTTL
	}
	if c.Interval == 0 {
		c.Interval = 500 * time.Millisecond
	}
	if c.StuckAfter == 0 {
		c.StuckAfter = 8 * time.Second
	}
	for ctx.Err() == nil {
		s, err := concurrency.NewSession(c.Client, concurrency.WithTTL(c.LeaseTTL), concurrency.WithContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			c.Log.Warn("controller session", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(c.Interval):
			}
			continue
		}
		e := concurrency.NewElection(s, topo.ElectionPrefix(c.Prefix))
		if err := e.Campaign(ctx, c.ID); err == nil {
			c.Log.Info("controller elected", "id", c.ID)
			c.lead(ctx, s, e)
		}
		coord.EndSession(c.Client, s)
	}
	return nil
}

func (c *Controller) lead(ctx context.Context, s *concurrency.Session, e *concurrency.Election) {
	// Changes of nodes and reports only wake the loop: each round reads
	// what it needs afresh.
	wctx, cancel := context.WithCancel(ctx)
	changes := coord.Watch(wctx, c.Client, topo.NodesPrefix(c.Prefix))
	reports := coord.Watch(wctx, c.Client, topo.ReportsPrefix(c.Prefix))
	var checks sync.WaitGroup
	if c.CheckInterval > 0 {
		checks.Go(func() { c.checkEvery(wctx) })
	}
	defer func() {
		cancel()
		<-changes.Done()
		<-reports.Done()
		checks.Wait()
	}()
	tick := time.NewTicker(c.Interval)
	defer tick.Stop()
	for {
		c.reconcileAll(ctx, e)
		select {
		case <-ctx.Done():
			return
		case <-s.Done(): // lost the lease: someone else leads now
			return
		case <-changes.Changes():
		case <-reports.Changes():
		case <-tick.C:
		}
	}
}

func (c *Controller) reconcileAll(ctx context.Context, e *concurrency.Election) {
	nodes, err := topo.LiveNodes(ctx, c.Client, c.Prefix)
	if err != nil {
		c.Log.Warn("controller: list nodes", "err", err)
		return
	}
	nodes = c.fenceSick(ctx, nodes)
	if len(nodes) == 0 {
		return
	}
	// One read of the routing tables and one status call a node for the
	// whole round, whatever the number of databases: a round that asked
	// each node once a database took time and CPU that grew with
	// databases × partitions (docs/performance.md, "Many databases").
	tables, err := c.routingTables(ctx)
	if err != nil {
		c.Log.Warn("controller: read the routing tables", "err", err)
		return
	}
	urls := map[string]string{}
	for _, n := range nodes {
		urls[n.ID] = n.URL
	}
	dbs := c.Registry.Databases()
	var statuses map[string]map[string]map[int]node.PartitionStatus
	if len(tables) > 0 {
		statuses = c.statuses(ctx, urls, dbs)
	}
	for _, db := range dbs {
		t, ok := tables[db.Name]
		if ok && t.err != nil {
			c.Log.Warn("controller: reconcile", "db", db.Name, "err", t.err)
			continue
		}
		var st map[string]map[int]node.PartitionStatus
		if t.table != nil {
			st = statuses[db.Name]
		}
		published, err := c.reconcile(ctx, e, db, nodes, t.table, st)
		if err != nil {
			c.Log.Warn("controller: reconcile", "db", db.Name, "err", err)
			continue
		}
		if db.FailoverInSync > 0 && published == t.table {
			c.settleRaise(ctx, db, t.table, st)
		}
	}
}

// routingTable is a database's routing table as read, or why it could
// not be.
type routingTable struct {
	table *topo.RoutingTable
	err   error
}

// routingTables reads every database's routing table in one request.
func (c *Controller) routingTables(ctx context.Context) (map[string]routingTable, error) {
	resp, err := c.Client.Get(ctx, topo.RoutingPrefix(c.Prefix), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := make(map[string]routingTable, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var t topo.RoutingTable
		if err := json.Unmarshal(kv.Value, &t); err != nil {
			out[topo.DBFromRoutingKey(c.Prefix, string(kv.Key))] = routingTable{err: fmt.Errorf("routing table: %w", err)}
			continue
		}
		out[topo.DBFromRoutingKey(c.Prefix, string(kv.Key))] = routingTable{table: &t}
	}
	return out, nil
}

// reconcile publishes a database's next routing table if the ideal state
// differs from the current one, cur (nil before the first). A partition
// whose master changes, or whose master came back as a new incarnation,
// gets the next generation. The write is fenced on this controller still
// leading. statuses are the database's replicas and copies by node, as
// the live nodes that answered reported them this round (nil before the
// first table). It returns the table in force after it: cur, or the one
// it published.
func (c *Controller) reconcile(ctx context.Context, e *concurrency.Election, def *schema.Database, live []topo.NodeInfo,
	cur *topo.RoutingTable, statuses map[string]map[int]node.PartitionStatus) (*topo.RoutingTable, error) {
	db, partitions, replicas := def.Name, def.Partitions, def.Replicas
	// A failover counts answers by the minInSync of before a raise until
	// the raise is settled; masters count acknowledgements by the new one.
	minInSync := def.FailoverQuorum()
	in := placement.Input{Partitions: partitions, Replicas: replicas, Current: placement.Assignment{}}
	urls, incs := map[string]string{}, map[string]int64{}
	for _, n := range live {
		in.Nodes = append(in.Nodes, placement.Node{ID: n.ID, Rack: n.Rack, Draining: n.Draining})
		urls[n.ID], incs[n.ID] = n.URL, n.Incarnation
	}
	if len(in.Nodes) == 0 {
		return cur, nil
	}
	next := &topo.RoutingTable{DB: db, Version: 1, Partitions: make([]topo.PartitionRoute, partitions), Nodes: urls, Incarnations: incs, MinInSync: def.InSync()}
	changed := cur == nil
	if cur != nil {
		next.Version = cur.Version + 1
		for p, r := range cur.Partitions {
			in.Current[p] = r.Replicas
		}
		changed = len(cur.Partitions) != partitions || !maps.Equal(cur.Nodes, urls) || !maps.Equal(cur.Incarnations, incs) || cur.MinInSync != next.MinInSync
	}
	ideal := placement.IdealState(in)
	status := func(p int) func(id string) (node.PartitionStatus, bool) {
		return func(id string) (node.PartitionStatus, bool) {
			st, ok := statuses[id][p]
			return st, ok
		}
	}
	isLive := func(id string) bool { _, ok := urls[id]; return ok }
	answered := func(id string) bool { _, ok := statuses[id]; return ok }
	holders := map[int][]string{}
	for id, m := range statuses {
		for p := range m {
			holders[p] = append(holders[p], id)
		}
	}
	for p := range partitions {
		route := topo.PartitionRoute{Replicas: ideal[p], Generation: 1}
		if cur == nil || p >= len(cur.Partitions) {
			if len(route.Replicas) > 0 {
				route.Incarnation = incs[route.Replicas[0]]
			}
			next.Partitions[p] = route
			continue
		}
		old := cur.Partitions[p]
		oldInc := cur.MasterIncarnation(p)
		rejoined := len(old.Replicas) > 0 && isLive(old.Replicas[0]) && incs[old.Replicas[0]] != oldInc
		d := placement.DecideMaster(placement.MasterInput{
			Current: old.Replicas, Target: route.Replicas, Live: isLive, Status: status(p),
			MinInSync: minInSync, Stuck: c.stuck(db, p, old, status(p)), From: old.From, Rejoined: rejoined,
		})
		route.Replicas = d.Replicas
		route.Generation, route.From, route.Incarnation, route.At = old.Generation, old.From, oldInc, old.At
		if len(old.Replicas) == 0 || old.Replicas[0] != route.Replicas[0] || d.Bump {
			// A new mastership: a new generation, granted to the
			// master's current incarnation, for what it was seen to
			// hold.
			route.Generation++
			route.From = d.From
			route.Incarnation = incs[route.Replicas[0]]
			route.At = topo.Position{}
			if st, ok := status(p)(route.Replicas[0]); ok {
				route.At = topo.Position{Gen: st.SCN.Gen, Seq: st.SCN.Seq}
			}
		}
		if len(old.Replicas) > 0 && old.Replicas[0] != route.Replicas[0] {
			c.Log.Info("controller: partition changes master", "db", db, "partition", p,
				"from", old.Replicas[0], "to", route.Replicas[0], "generation", route.Generation, "planned", route.From != "")
		} else if rejoined && route.Generation == old.Generation {
			c.Log.Warn("controller: partition's master rejoined and too few replicas answered to choose again; waiting",
				"db", db, "partition", p, "master", old.Replicas[0], "minInSync", minInSync)
		} else if len(old.Replicas) > 0 && !isLive(old.Replicas[0]) {
			c.Log.Warn("controller: partition's master is gone and too few replicas answered to choose another; waiting",
				"db", db, "partition", p, "master", old.Replicas[0], "minInSync", minInSync)
		}
		// Copies left on nodes that are no replica go once the replicas
		// hold all they hold.
		route.Replicas, route.Drop = placement.DecideCopies(placement.CopiesInput{
			Published: old.Replicas, Told: old.Drop, Replicas: route.Replicas, SameGeneration: route.Generation == old.Generation,
			Want: replicas, Live: isLive, Answered: answered, Status: status(p), Holders: holders[p],
		})
		if !slices.Equal(old.Replicas, route.Replicas) || route.Generation != old.Generation || route.From != old.From || route.Incarnation != old.Incarnation ||
			!slices.Equal(old.Drop, route.Drop) {
			changed = true
		}
		next.Partitions[p] = route
	}
	if !changed {
		return cur, nil
	}
	var err error
	if c.OneByOne && cur != nil {
		err = c.publishOneByOne(ctx, e, cur, next)
	} else {
		err = c.publish(ctx, e, next)
	}
	if err != nil {
		return nil, err
	}
	return next, nil
}

// publish writes a routing table, if this controller still leads: every
// transition it carries, on every node, in one etcd transaction.
func (c *Controller) publish(ctx context.Context, e *concurrency.Election, t *topo.RoutingTable) error {
	val, _ := json.Marshal(t)
	resp, err := c.Client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.Key()), "=", e.Rev())).
		Then(clientv3.OpPut(topo.RoutingKey(c.Prefix, t.DB), string(val))).Commit()
	if err != nil {
		return err
	}
	if resp.Succeeded {
		c.Log.Info("routing table published", "db", t.DB, "version", t.Version, "nodes", len(t.Nodes))
	}
	return nil
}

// publishOneByOne goes from cur to next one partition at a time, one
// routing table version (one etcd transaction, one round of watches) per
// changed partition: how a cluster manager without group commit issues
// transitions. It exists to measure what grouping saves.
func (c *Controller) publishOneByOne(ctx context.Context, e *concurrency.Election, cur, next *topo.RoutingTable) error {
	step := *cur
	step.Partitions = slices.Clone(cur.Partitions)
	step.Nodes, step.Incarnations = next.Nodes, next.Incarnations
	for p, r := range next.Partitions {
		if p < len(step.Partitions) && slices.Equal(step.Partitions[p].Replicas, r.Replicas) && step.Partitions[p].Generation == r.Generation {
			continue
		}
		if p >= len(step.Partitions) {
			step.Partitions = append(step.Partitions, r)
		} else {
			step.Partitions[p] = r
		}
		step.Version++
		if err := c.publish(ctx, e, &step); err != nil {
			return err
		}
	}
	return nil
}

// statuses asks every live node for its replicas of the databases, and
// the copies it keeps of partitions it is no replica of: their roles and
// SCNs (where timelines end, whether a replica has caught up for a
// hand-over, whether a master is mastering, whether a copy is
// redundant), by database, node and partition. A node that answered has
// a map under every database, empty where it holds nothing of it; nodes
// that do not answer within a second count as having answered nothing.
func (c *Controller) statuses(ctx context.Context, live map[string]string, dbs []*schema.Database) map[string]map[string]map[int]node.PartitionStatus {
	byNode := map[string][]node.PartitionStatus{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for id := range live {
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			st, err := c.remotes.Get(live[id]).Status(sctx, node.StatusRequest{})
			if err != nil {
				c.Log.Warn("controller: replica status", "node", id, "err", err)
				return
			}
			mu.Lock()
			byNode[id] = st
			mu.Unlock()
		})
	}
	wg.Wait()
	out := map[string]map[string]map[int]node.PartitionStatus{}
	for _, d := range dbs {
		out[d.Name] = map[string]map[int]node.PartitionStatus{}
		for id := range byNode {
			out[d.Name][id] = map[int]node.PartitionStatus{}
		}
	}
	for id, st := range byNode {
		for _, s := range st {
			if out[s.DB] != nil {
				out[s.DB][id][s.Partition] = s
			}
		}
	}
	return out
}

// stuck reports whether a partition's master has reported a role other
// than MASTER, in its current generation, for longer than StuckAfter: a
// hand-over whose drain failed, to be chosen again.
func (c *Controller) stuck(db string, p int, r topo.PartitionRoute, status func(string) (node.PartitionStatus, bool)) bool {
	if len(r.Replicas) == 0 {
		return false
	}
	if c.stuckSince == nil {
		c.stuckSince = map[string]time.Time{}
	}
	k := fmt.Sprintf("%s/%d/%d", db, p, r.Generation)
	st, ok := status(r.Replicas[0])
	if !ok || st.Role == node.Master {
		delete(c.stuckSince, k)
		return false
	}
	since, seen := c.stuckSince[k]
	if !seen {
		c.stuckSince[k] = time.Now()
		return false
	}
	if time.Since(since) < c.StuckAfter {
		return false
	}
	delete(c.stuckSince, k)
	c.Log.Warn("controller: partition's master has not taken over; choosing again", "db", db, "partition", p, "master", r.Replicas[0], "generation", r.Generation)
	return true
}

// fenceSick drops from nodes those most routers cannot reach. Such a node
// may still hold its lease and believe it masters its partitions, so the
// controller first revokes the lease (the node fences itself when it
// hears, or when its own view of the lease lapses) and keeps treating it
// as live for the lease's TTL, so that no other replica is made master
// while it might still write.
func (c *Controller) fenceSick(ctx context.Context, nodes []topo.NodeInfo) []topo.NodeInfo {
	if c.fenced == nil {
		c.fenced = map[string]fencedNode{}
	}
	sick, err := sickNodes(ctx, c.Client, c.Prefix)
	if err != nil {
		sick = nil
	}
	var out []topo.NodeInfo
	for _, n := range nodes {
		if !sick[fmt.Sprintf("%s/%d", n.ID, n.Incarnation)] {
			out = append(out, n)
			continue
		}
		if _, done := c.fenced[n.ID]; done {
			continue
		}
		// The node's own view of its lease ends before etcd would have
		// expired it (topo.Member.Valid): waiting out the remaining TTL is
		// enough.
		ttl := time.Duration(c.LeaseTTL) * time.Second
		if l, err := c.Client.TimeToLive(ctx, clientv3.LeaseID(n.Incarnation)); err == nil {
			ttl = time.Duration(max(l.TTL, 0)+1) * time.Second
		}
		if _, err := c.Client.Revoke(ctx, clientv3.LeaseID(n.Incarnation)); err != nil {
			c.Log.Warn("controller: revoke the lease of a node routers cannot reach", "node", n.ID, "err", err)
			out = append(out, n)
			continue
		}
		c.Log.Warn("controller: expelled a node routers cannot reach; failing it over once its lease has lapsed", "node", n.ID, "after", ttl)
		c.fenced[n.ID] = fencedNode{info: n, until: time.Now().Add(ttl)}
	}
	for id, f := range c.fenced {
		if time.Now().After(f.until) {
			delete(c.fenced, id)
			continue
		}
		if !slices.ContainsFunc(out, func(n topo.NodeInfo) bool { return n.ID == id }) {
			out = append(out, f.info)
		}
	}
	return out
}

// checkEvery runs the consistency check periodically until ctx ends.
func (c *Controller) checkEvery(ctx context.Context) {
	t := time.NewTicker(c.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		res, err := Check(ctx, c.Client, c.Prefix, "")
		if err != nil {
			c.Log.Warn("consistency check", "err", err)
			continue
		}
		for _, pc := range res {
			for _, r := range pc.Replicas {
				if r.Result == CheckAlarm {
					c.Log.Error("consistency check: replica holds acknowledged commits its master lacks", "db", pc.DB, "partition", pc.Partition, "master", pc.Master, "replica", r.Node, "err", r.Error)
				}
				if r.Result == CheckDiffers {
					c.Log.Error("consistency check: replica differs from its master", "db", pc.DB, "partition", pc.Partition, "scn", pc.SCN, "master", pc.Master, "replica", r.Node)
				}
			}
		}
		if c.OnCheck != nil {
			c.OnCheck(res)
		}
	}
}

// sickNodes lists the nodes ("id/incarnation") a majority of live routers
// report.
func sickNodes(ctx context.Context, cli *clientv3.Client, prefix string) (map[string]bool, error) {
	routers, err := cli.Get(ctx, topo.RoutersPrefix(prefix), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || routers.Count == 0 {
		return nil, err
	}
	reports, err := cli.Get(ctx, topo.ReportsPrefix(prefix), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	by := map[string]int{}
	for _, kv := range reports.Kvs {
		rest := strings.TrimPrefix(string(kv.Key), topo.ReportsPrefix(prefix))
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

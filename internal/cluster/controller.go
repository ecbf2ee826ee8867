package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/storage"
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

	remotes node.Remotes
}

// Run campaigns and, while leader, reconciles, until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 5
	}
	if c.Interval == 0 {
		c.Interval = 500 * time.Millisecond
	}
	for ctx.Err() == nil {
		s, err := concurrency.NewSession(c.Client, concurrency.WithTTL(c.LeaseTTL), concurrency.WithContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			c.Log.Warn("controller session", "err", err)
			time.Sleep(c.Interval)
			continue
		}
		e := concurrency.NewElection(s, electionPrefix(c.Prefix))
		if err := e.Campaign(ctx, c.ID); err == nil {
			c.Log.Info("controller elected", "id", c.ID)
			c.lead(ctx, s, e)
		}
		s.Close()
	}
	return nil
}

func (c *Controller) lead(ctx context.Context, s *concurrency.Session, e *concurrency.Election) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	changes := c.Client.Watch(wctx, nodesPrefix(c.Prefix), clientv3.WithPrefix())
	reports := c.Client.Watch(wctx, reportsPrefix(c.Prefix), clientv3.WithPrefix())
	if c.CheckInterval > 0 {
		go c.checkEvery(wctx)
	}
	tick := time.NewTicker(c.Interval)
	defer tick.Stop()
	for {
		c.reconcileAll(ctx, e)
		select {
		case <-ctx.Done():
			return
		case <-s.Done(): // lost the lease: someone else leads now
			return
		case <-changes:
		case <-reports:
		case <-tick.C:
		}
	}
}

func (c *Controller) reconcileAll(ctx context.Context, e *concurrency.Election) {
	nodes, err := LiveNodes(ctx, c.Client, c.Prefix)
	if err != nil {
		c.Log.Warn("controller: list nodes", "err", err)
		return
	}
	// Nodes most routers cannot reach count as failed, lease or not.
	if sick, err := sickNodes(ctx, c.Client, c.Prefix); err == nil && len(sick) > 0 {
		nodes = slices.DeleteFunc(nodes, func(n NodeInfo) bool {
			reported := sick[fmt.Sprintf("%s/%d", n.ID, n.Incarnation)]
			if reported {
				c.Log.Warn("controller: treating a node routers cannot reach as failed", "node", n.ID)
			}
			return reported
		})
	}
	for _, db := range c.Registry.Databases() {
		if err := c.reconcile(ctx, e, db.Name, db.Partitions, db.Replicas, nodes); err != nil {
			c.Log.Warn("controller: reconcile", "db", db.Name, "err", err)
		}
	}
}

// reconcile publishes a database's next routing table if the ideal state
// differs from the current one. A partition whose master changes, or whose
// master came back as a new incarnation, gets the next generation. The
// write is fenced on this controller still leading.
func (c *Controller) reconcile(ctx context.Context, e *concurrency.Election, db string, partitions, replicas int, live []NodeInfo) error {
	cur, err := LoadRoutingTable(ctx, c.Client, c.Prefix, db)
	if err != nil {
		return err
	}
	in := Input{Partitions: partitions, Replicas: replicas, Current: Assignment{}}
	urls, incs := map[string]string{}, map[string]int64{}
	for _, n := range live {
		in.Nodes = append(in.Nodes, Node{ID: n.ID, Rack: n.Rack})
		urls[n.ID], incs[n.ID] = n.URL, n.Incarnation
	}
	if len(in.Nodes) == 0 {
		return nil
	}
	next := &RoutingTable{DB: db, Version: 1, Partitions: make([]PartitionRoute, partitions), Nodes: urls, Incarnations: incs}
	changed := cur == nil
	if cur != nil {
		next.Version = cur.Version + 1
		for p, r := range cur.Partitions {
			in.Current[p] = r.Replicas
		}
		changed = len(cur.Partitions) != partitions || !maps.Equal(cur.Nodes, urls) || !maps.Equal(cur.Incarnations, incs)
	}
	ideal := IdealState(in)
	scns := c.timelines(ctx, db, cur, urls)
	for p := range partitions {
		route := PartitionRoute{Replicas: ideal[p], Generation: 1}
		if cur == nil || p >= len(cur.Partitions) {
			next.Partitions[p] = route
			continue
		}
		old := cur.Partitions[p]
		route.Replicas = keepMasterUntilCaughtUp(old.Replicas, route.Replicas, urls, func(id string) storage.SCN { return scns[id][p] })
		route.Generation = old.Generation
		if len(old.Replicas) == 0 || old.Replicas[0] != route.Replicas[0] ||
			cur.Incarnations[route.Replicas[0]] != incs[route.Replicas[0]] {
			route.Generation++
		}
		if !slices.Equal(old.Replicas, route.Replicas) || route.Generation != old.Generation {
			changed = true
		}
		next.Partitions[p] = route
	}
	if !changed {
		return nil
	}
	if c.OneByOne && cur != nil {
		return c.publishOneByOne(ctx, e, cur, next)
	}
	return c.publish(ctx, e, next)
}

// publish writes a routing table, if this controller still leads: every
// transition it carries, on every node, in one etcd transaction.
func (c *Controller) publish(ctx context.Context, e *concurrency.Election, t *RoutingTable) error {
	val, _ := json.Marshal(t)
	resp, err := c.Client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.Key()), "=", e.Rev())).
		Then(clientv3.OpPut(routingKey(c.Prefix, t.DB), string(val))).Commit()
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
func (c *Controller) publishOneByOne(ctx context.Context, e *concurrency.Election, cur, next *RoutingTable) error {
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

// timelines asks the live replicas of each partition whose master is gone
// where their timelines end, so the most advanced one is promoted. Nodes
// that do not answer within a second count as having nothing.
func (c *Controller) timelines(ctx context.Context, db string, cur *RoutingTable, live map[string]string) map[string]map[int]storage.SCN {
	if cur == nil {
		return nil
	}
	ask := map[string]bool{}
	for _, r := range cur.Partitions {
		if len(r.Replicas) == 0 {
			continue
		}
		if _, alive := live[r.Replicas[0]]; alive {
			continue
		}
		for _, id := range r.Replicas[1:] {
			if _, alive := live[id]; alive {
				ask[id] = true
			}
		}
	}
	out := map[string]map[int]storage.SCN{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for id := range ask {
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			st, err := c.remotes.Get(live[id]).Status(sctx, node.StatusRequest{DB: db})
			if err != nil {
				c.Log.Warn("controller: replica status", "node", id, "err", err)
				return
			}
			m := map[int]storage.SCN{}
			for _, s := range st {
				m[s.Partition] = s.SCN
			}
			mu.Lock()
			out[id] = m
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// keepMasterUntilCaughtUp refuses to make a node master of a partition it
// does not hold yet: a new replica first joins as slave and catches up;
// only a later table, once it is an existing replica, moves mastership to
// it (and the new master drains the old one before taking over). While the
// current master is alive it stays master of the target replica set. When
// it is gone, the target replica with the most advanced timeline (scn)
// among those that already hold the partition becomes master.
func keepMasterUntilCaughtUp(current, target []string, live map[string]string, scn func(id string) storage.SCN) []string {
	if len(current) == 0 || len(target) == 0 {
		return target
	}
	_, alive := live[current[0]]
	if alive && slices.Contains(current, target[0]) {
		return target // no move, or a planned one the new master drains
	}
	if !alive || !slices.Contains(target, current[0]) {
		best := -1
		for i, id := range target {
			if slices.Contains(current, id) && (best < 0 || scn(target[best]).Less(scn(id))) {
				best = i
			}
		}
		if best < 0 {
			return target
		}
		out := append([]string{target[best]}, target[:best]...)
		return append(out, target[best+1:]...)
	}
	out := []string{current[0]}
	for _, id := range target {
		if id != current[0] {
			out = append(out, id)
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

package cluster

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/cortado-db/cortado/internal/registry"
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
	for _, db := range c.Registry.Databases() {
		if err := c.reconcile(ctx, e, db.Name, db.Partitions, db.Replicas, nodes); err != nil {
			c.Log.Warn("controller: reconcile", "db", db.Name, "err", err)
		}
	}
}

// reconcile publishes a database's next routing table if the ideal state
// differs from the current one. A partition whose master changes gets the
// next generation. The write is fenced on this controller still leading.
func (c *Controller) reconcile(ctx context.Context, e *concurrency.Election, db string, partitions, replicas int, live []NodeInfo) error {
	cur, err := LoadRoutingTable(ctx, c.Client, c.Prefix, db)
	if err != nil {
		return err
	}
	in := Input{Partitions: partitions, Replicas: replicas, Current: Assignment{}}
	urls := map[string]string{}
	for _, n := range live {
		in.Nodes = append(in.Nodes, Node{ID: n.ID, Rack: n.Rack})
		urls[n.ID] = n.URL
	}
	if len(in.Nodes) == 0 {
		return nil
	}
	next := &RoutingTable{DB: db, Version: 1, Partitions: make([]PartitionRoute, partitions), Nodes: urls}
	changed := cur == nil
	if cur != nil {
		next.Version = cur.Version + 1
		for p, r := range cur.Partitions {
			in.Current[p] = r.Replicas
		}
		changed = len(cur.Partitions) != partitions || !mapsEqual(cur.Nodes, urls)
	}
	ideal := IdealState(in)
	for p := range partitions {
		route := PartitionRoute{Replicas: ideal[p], Generation: 1}
		if cur != nil && p < len(cur.Partitions) {
			route.Replicas = keepMasterUntilCaughtUp(cur.Partitions[p].Replicas, route.Replicas, urls)
		}
		if cur != nil && p < len(cur.Partitions) {
			old := cur.Partitions[p]
			route.Generation = old.Generation
			if len(old.Replicas) == 0 || old.Replicas[0] != route.Replicas[0] {
				route.Generation++
			}
			if !slices.Equal(old.Replicas, route.Replicas) || route.Generation != old.Generation {
				changed = true
			}
		}
		next.Partitions[p] = route
	}
	if !changed {
		return nil
	}
	val, _ := json.Marshal(next)
	resp, err := c.Client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.Key()), "=", e.Rev())).
		Then(clientv3.OpPut(routingKey(c.Prefix, db), string(val))).Commit()
	if err != nil {
		return err
	}
	if resp.Succeeded {
		c.Log.Info("routing table published", "db", db, "version", next.Version, "nodes", len(urls))
	}
	return nil
}

// keepMasterUntilCaughtUp refuses to make a node master of a partition it
// does not hold yet: a new replica first joins as slave and catches up;
// only a later table, once it is an existing replica, moves mastership to
// it (and the new master drains the old one before taking over). While the
// current master is alive it stays master of the target replica set.
func keepMasterUntilCaughtUp(current, target []string, live map[string]string) []string {
	if len(current) == 0 || len(target) == 0 || slices.Contains(current, target[0]) {
		return target
	}
	if _, alive := live[current[0]]; !alive || !slices.Contains(target, current[0]) {
		// The old master is gone or leaves this partition: among the
		// target replicas, prefer one that already holds the data.
		for i, id := range target {
			if slices.Contains(current, id) {
				out := append([]string{id}, target[:i]...)
				return append(out, target[i+1:]...)
			}
		}
		return target
	}
	out := []string{current[0]}
	for _, id := range target {
		if id != current[0] {
			out = append(out, id)
		}
	}
	return out
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

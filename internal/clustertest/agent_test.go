package clustertest

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/agent"
	"github.com/cortado-db/cortado/internal/coord"
	"github.com/cortado-db/cortado/internal/coord/coordtest"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/topo"
)

// TestAgentStepsDownWhileItDrains: a node taking a partition over from
// an old master that never answers (its drain lasts the whole drain
// limit) still carries out the tables that come meanwhile. It steps down
// from a partition handed to another node at once — before, its agent
// finished the drain first, and the other node's drain of it failed —
// and a table that gives it the draining partition again in a new
// generation ends that drain and takes effect at once. The routing
// tables are written by hand; no controller runs.
func TestAgentStepsDownWhileItDrains(t *testing.T) {
	ctx := context.Background()
	etcd := coordtest.Embedded(t)
	cli, err := coord.Connect(ctx, []string{etcd.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	const prefix = "/agents"
	reg, err := registry.Open(ctx, cli, registry.Options{Prefix: prefix, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	if _, _, err := reg.CreateDatabase(ctx, schema.Database{Name: "d", Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	// A node that is gone: nothing listens at its address.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + ln.Addr().String()
	ln.Close()

	const drainLimit = time.Minute
	nodes := map[string]*storageNode{}
	urls := map[string]string{"gone": gone}
	actx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, id := range []string{"a", "b"} {
		n := newStorageNodeWith(t, reg, node.Options{})
		nodes[id], urls[id] = n, n.url
		a := &agent.Agent{Client: cli, Prefix: prefix, ID: id, Node: n.Node, Log: slog.New(slog.DiscardHandler), DrainLimit: drainLimit}
		wg.Go(func() { a.Run(actx) })
	}
	// Before the engines close (cleanups run last first).
	t.Cleanup(func() { stop(); wg.Wait() })

	publish := func(version int64, routes ...topo.PartitionRoute) {
		t.Helper()
		b, err := json.Marshal(topo.RoutingTable{DB: "d", Version: version, Partitions: routes, Nodes: urls})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, topo.RoutingKey(prefix, "d"), string(b)); err != nil {
			t.Fatal(err)
		}
	}
	role := func(id string, p int) (node.Role, uint32) {
		st, err := nodes[id].Status(ctx, node.StatusRequest{DB: "d"})
		if err != nil {
			t.Fatal(err)
		}
		for _, ps := range st {
			if ps.Partition == p {
				return ps.Role, ps.Generation
			}
		}
		return node.Offline, 0
	}
	// Well within the drain limit: what happens only once a drain of
	// the gone node gives up comes too late.
	await := func(what, id string, p int, want node.Role, gen uint32) {
		t.Helper()
		deadline := time.Now().Add(drainLimit / 4)
		for {
			r, g := role(id, p)
			if r == want && g == gen {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s is %v of partition %d in generation %d, want %v in %d", what, id, r, p, g, want, gen)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	publish(1, topo.PartitionRoute{Replicas: []string{"a", "b"}, Generation: 1}, topo.PartitionRoute{Replicas: []string{"b", "a"}, Generation: 1})
	await("first table", "a", 0, node.Master, 1)
	await("first table", "b", 1, node.Master, 1)

	// a is to take partition 1 over from the gone node: its drain waits.
	publish(2, topo.PartitionRoute{Replicas: []string{"a", "b"}, Generation: 1}, topo.PartitionRoute{Replicas: []string{"a", "b"}, Generation: 2, From: "gone"})
	await("b steps down", "b", 1, node.Slave, 1)
	// Partition 0 is handed from a to b: b drains a, which must step
	// down while its own drain goes on.
	publish(3, topo.PartitionRoute{Replicas: []string{"b", "a"}, Generation: 2, From: "a"}, topo.PartitionRoute{Replicas: []string{"a", "b"}, Generation: 2, From: "gone"})
	await("hand-over of partition 0 while a drains partition 1", "b", 0, node.Master, 2)
	if r, _ := role("a", 1); r == node.Master {
		t.Fatal("a became master of partition 1 without draining the old master")
	}
	// A failover gives partition 1 to a in generation 3: the drain of the
	// gone node ends, and a takes over at once.
	publish(4, topo.PartitionRoute{Replicas: []string{"b", "a"}, Generation: 2, From: "a"}, topo.PartitionRoute{Replicas: []string{"a", "b"}, Generation: 3})
	await("failover of partition 1 while a drains it", "a", 1, node.Master, 3)
	await("slave of the new master", "a", 0, node.Slave, 2)
}

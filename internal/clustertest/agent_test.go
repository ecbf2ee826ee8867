package clustertest

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/agent"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
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
	const drainLimit = time.Minute
	c := startAgents(t, 2, drainLimit)
	publish, role, await := c.publish, c.role, c.await
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

// agents is two storage nodes, a and b, each run by an agent, and a
// database d of parts partitions whose routing tables a test writes by
// hand (no controller runs). A third node, "gone", is listed in every
// table but nothing listens at its address.
type agents struct {
	t     *testing.T
	cli   *clientv3.Client
	nodes map[string]*storageNode
	urls  map[string]string
	logs  map[string]*lockedLog // what each agent logged
	limit time.Duration
}

// lockedLog is a log written by one agent's goroutines and read by the
// test's.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

const agentsPrefix = "/agents"

func startAgents(t *testing.T, parts int, drainLimit time.Duration) *agents {
	ctx := context.Background()
	cli, reg := newTestEtcd(t, agentsPrefix)
	if _, _, err := reg.CreateDatabase(ctx, schema.Database{Name: "d", Partitions: parts}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &agents{t: t, cli: cli, nodes: map[string]*storageNode{}, urls: map[string]string{"gone": "http://" + ln.Addr().String()},
		logs: map[string]*lockedLog{}, limit: drainLimit}
	ln.Close()
	actx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, id := range []string{"a", "b"} {
		n := newStorageNodeWith(t, reg, node.Options{})
		c.nodes[id], c.urls[id], c.logs[id] = n, n.url, &lockedLog{}
		log := slog.New(slog.NewTextHandler(c.logs[id], &slog.HandlerOptions{Level: slog.LevelWarn}))
		a := &agent.Agent{Client: cli, Prefix: agentsPrefix, ID: id, Node: n.Node, Log: log, DrainLimit: drainLimit}
		wg.Go(func() { a.Run(actx) })
	}
	// Before the engines close (cleanups run last first).
	t.Cleanup(func() { stop(); wg.Wait() })
	return c
}

// publish writes table version of d with routes.
func (c *agents) publish(version int64, routes ...topo.PartitionRoute) {
	c.t.Helper()
	b, err := json.Marshal(topo.RoutingTable{DB: "d", Version: version, Partitions: routes, Nodes: c.urls})
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.cli.Put(context.Background(), topo.RoutingKey(agentsPrefix, "d"), string(b)); err != nil {
		c.t.Fatal(err)
	}
}

// status returns node id's status of partition p.
func (c *agents) status(id string, p int) node.PartitionStatus {
	c.t.Helper()
	st, err := c.nodes[id].Status(context.Background(), node.StatusRequest{DB: "d"})
	if err != nil {
		c.t.Fatal(err)
	}
	for _, ps := range st {
		if ps.Partition == p {
			return ps
		}
	}
	return node.PartitionStatus{Role: node.Offline}
}

func (c *agents) role(id string, p int) (node.Role, uint32) {
	c.t.Helper()
	st := c.status(id, p)
	return st.Role, st.Generation
}

// await waits, well within the drain limit (what happens only once a
// drain of the gone node gives up comes too late), until node id is
// want of partition p in generation gen.
func (c *agents) await(what, id string, p int, want node.Role, gen uint32) {
	c.t.Helper()
	deadline := time.Now().Add(c.limit / 4)
	for {
		r, g := c.role(id, p)
		if r == want && g == gen {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: %s is %v of partition %d in generation %d, want %v in %d", what, id, r, p, g, want, gen)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAgentRefusesToMasterLessThanSeen: a replica chosen as master for
// what the controller saw it hold (topo.PartitionRoute.At) does not take
// over if it holds less (emptied meanwhile): the partition stays without
// a master, to be chosen again, rather than get an empty one whose
// slaves would be told to undo acknowledged commits.
func TestAgentRefusesToMasterLessThanSeen(t *testing.T) {
	c := startAgents(t, 1, time.Minute)
	c.publish(1, topo.PartitionRoute{Replicas: []string{"a", "b"}, Generation: 1})
	c.await("first table", "a", 0, node.Master, 1)
	deadline := time.Now().Add(15 * time.Second)
	for c.status("b", 0).SCN != (storage.SCN{Gen: 1, Seq: 1}) {
		if time.Now().After(deadline) {
			t.Fatalf("b at %s, want 1:1", c.status("b", 0).SCN)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Chosen for more than it holds: b refuses, and says why.
	c.publish(2, topo.PartitionRoute{Replicas: []string{"b", "a"}, Generation: 2, At: topo.Position{Gen: 1, Seq: 99}})
	c.await("a steps down", "a", 0, node.Slave, 1)
	for !strings.Contains(c.logs["b"].String(), agent.ErrLessThanSeen.Error()) {
		if time.Now().After(deadline) {
			t.Fatalf("b did not refuse: %s", c.logs["b"])
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r, g := c.role("b", 0); r == node.Master {
		t.Fatalf("b became master of generation %d holding 1:1, chosen at 1:99", g)
	}
	// Chosen again, for what it holds: it takes over.
	c.publish(3, topo.PartitionRoute{Replicas: []string{"b", "a"}, Generation: 3, At: topo.Position{Gen: 1, Seq: 1}})
	c.await("chosen for what it holds", "b", 0, node.Master, 3)
}

package clustertest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/cortado-db/cortado/internal/agent"
	"github.com/cortado-db/cortado/internal/controller"
	"github.com/cortado-db/cortado/internal/coord"
	"github.com/cortado-db/cortado/internal/coord/coordtest"
	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/relay"
	"github.com/cortado-db/cortado/internal/router"
	"github.com/cortado-db/cortado/internal/routing"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
	"github.com/cortado-db/cortado/internal/topo"
	"github.com/cortado-db/cortado/internal/wire"
)

type clusterNode struct {
	*storageNode
	id     string
	member *topo.Member
	stop   context.CancelFunc
}

func startClusterNode(t testing.TB, ctx context.Context, cli *clientv3.Client, reg *registry.Registry, id string, opts node.Options) *clusterNode {
	return startClusterNodeAt(t, ctx, cli, reg, id, opts, nil)
}

// startClusterNodeAt is startClusterNode for a node the others and the
// router reach at advertise(its URL) (a proxy in front of it).
func startClusterNodeAt(t testing.TB, ctx context.Context, cli *clientv3.Client, reg *registry.Registry, id string, opts node.Options, advertise func(url string) string, extra ...grpc.ServerOption) *clusterNode {
	t.Helper()
	n, run := joinClusterNode(t, ctx, cli, reg, id, opts, advertise, extra...)
	run()
	return n
}

// joinClusterNode starts a storage node and registers it as a member,
// and returns run, which starts its agent: until then it takes no role
// the routing tables give it, as a process that joined and stalled.
func joinClusterNode(t testing.TB, ctx context.Context, cli *clientv3.Client, reg *registry.Registry, id string, opts node.Options, advertise func(url string) string, extra ...grpc.ServerOption) (n *clusterNode, run func()) {
	t.Helper()
	sn := newStorageNodeWith(t, reg, opts, extra...)
	url := sn.url
	if advertise != nil {
		url = advertise(url)
	}
	m, err := topo.Join(ctx, cli, "/c", topo.NodeInfo{ID: id, URL: url, Protocol: wire.Version}, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	sn.RequireLease(m.Held)
	actx, cancel := context.WithCancel(ctx)
	a := &agent.Agent{Client: cli, Prefix: "/c", ID: id, Node: sn.Node, Member: m, Log: slog.New(slog.DiscardHandler)}
	done := make(chan struct{})
	var once sync.Once
	run = func() {
		once.Do(func() {
			go func() {
				defer close(done)
				a.Run(actx)
			}()
		})
	}
	// Before the engine closes (cleanups run last first).
	stop := func() { cancel(); run(); <-done }
	t.Cleanup(stop)
	return &clusterNode{storageNode: sn, id: id, member: m, stop: stop}, run
}

// kill makes the node vanish as a crashed process would: its API stops
// answering and its lease is left to lapse.
func (n *clusterNode) kill() {
	n.stop()
	n.api.Abort()
	n.member.Abandon()
}

// cutOff makes the node unreachable to routers and other nodes while it
// keeps its lease (it still talks to etcd): a network fault between
// clients and the node that etcd does not see.
func (n *clusterNode) cutOff() {
	n.api.Abort()
}

// testCluster is storage nodes, an elected controller and a router, in
// this process, on a real etcd.
type testCluster struct {
	t      testing.TB
	ctx    context.Context
	cli    *clientv3.Client
	reg    *registry.Registry
	nodes  map[string]*clusterNode
	view   *routing.RoutingView
	url    string // the router
	router *router.Router

	nodeOpts node.Options
	relay    *relay.Relay
	relayURL string // the relay's internal API
}

func startCluster(t testing.TB, nodes, partitions, replicas int) *testCluster {
	return startClusterWith(t, clusterOptions{nodes: nodes, partitions: partitions, replicas: replicas})
}

// clusterOptions configures startClusterWith.
type clusterOptions struct {
	nodes, partitions, replicas int
	minInSync                   int  // 0: the database's default
	oneByOne                    bool // the controller publishes one partition's transition at a time
	replication                 string
	node                        node.Options
	relayBuffer                 int // > 0 runs a relay keeping this many commits per partition
	relayPulled, relayServed    func(int)
	// advertiseLast, when set, is how the last node is reached (a proxy
	// in front of it).
	advertiseLast func(url string) string
	// lastServer are the last node's extra gRPC server options (an
	// admission interceptor).
	lastServer []grpc.ServerOption
	router     router.Options
	stall      node.StallOptions
}

func startClusterWith(t testing.TB, o clusterOptions) *testCluster {
	nodes, partitions, replicas := o.nodes, o.partitions, o.replicas
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	etcd := coordtest.Embedded(t)
	cli, err := coord.Connect(ctx, []string{etcd.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	log := slog.New(slog.DiscardHandler)
	reg, err := registry.Open(ctx, cli, registry.Options{Prefix: "/c", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	reg.CreateDatabase(ctx, schema.Database{Name: "d", Partitions: partitions, Replicas: replicas, MinInSync: o.minInSync, Replication: o.replication})
	if _, _, err := reg.RegisterVersion(ctx, "d", "T", []schema.KeyPart{{Name: "k"}}, `{"type":"record","name":"T","fields":[{"name":"v","type":"string"}]}`); err != nil {
		t.Fatal(err)
	}
	c := &testCluster{t: t, ctx: ctx, cli: cli, reg: reg, nodes: map[string]*clusterNode{}, nodeOpts: o.node}
	if o.relayBuffer > 0 {
		c.relay = &relay.Relay{Client: cli, Prefix: "/c", Buffer: o.relayBuffer, Logger: log, Pulled: o.relayPulled, Served: o.relayServed}
		rctx, rcancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); c.relay.Run(rctx) }()
		_, c.relayURL = serveInternal(t, func(s *wire.Server) { c.relay.Register(s, node.ServeOptions{}) })
		t.Cleanup(func() { rcancel(); <-done })
		if _, err := topo.RegisterRelay(rctx, cli, "/c", topo.Process{ID: "relay", URL: c.relayURL}, 2); err != nil {
			t.Fatal(err)
		}
	}
	for i := range nodes {
		if i == nodes-1 && (o.advertiseLast != nil || o.lastServer != nil) {
			id := fmt.Sprintf("n%d", i)
			c.nodes[id] = startClusterNodeAt(t, c.ctx, c.cli, c.reg, id, c.nodeOpts, o.advertiseLast, o.lastServer...)
			continue
		}
		c.addNode()
	}
	ctl := &controller.Controller{Client: cli, Prefix: "/c", Registry: reg, ID: "ctl", LeaseTTL: 2, Interval: 100 * time.Millisecond, Log: log, OneByOne: o.oneByOne}
	cctx, stopController := context.WithCancel(ctx)
	controllerDone := make(chan struct{})
	go func() { defer close(controllerDone); ctl.Run(cctx) }()
	t.Cleanup(func() { stopController(); <-controllerDone })
	if c.view, err = routing.WatchRouting(ctx, cli, "/c", o.stall); err != nil {
		t.Fatal(err)
	}
	if err := c.view.ReportSickNodes(ctx, cli, "/c", topo.Process{ID: "router"}, 2, true, log); err != nil {
		t.Fatal(err)
	}
	c.router = router.New(reg, schema.NewPlans(64), c.view, o.router, log)
	rt := httptest.NewServer(c.router)
	t.Cleanup(rt.Close)
	c.url = rt.URL
	return c
}

func (c *testCluster) addNode() string {
	id := c.nextNodeID()
	c.nodes[id] = startClusterNode(c.t, c.ctx, c.cli, c.reg, id, c.nodeOpts)
	return id
}

// nextNodeID returns an ID no node of the cluster has.
func (c *testCluster) nextNodeID() string {
	id := fmt.Sprintf("n%d", len(c.nodes))
	for c.nodes[id] != nil {
		id += "x"
	}
	return id
}

// put writes {"v":v} at key k of table T (putPath).
func (c *testCluster) put(k, v string) {
	c.t.Helper()
	c.putPath("T/"+k, `{"v":"`+v+`"}`)
}

// putPath writes body at /d/ + path through the router, retrying until
// the router accepts it (503 while a partition has no master yet). It may
// be called from other goroutines than the test's: a failure is an Error.
func (c *testCluster) putPath(path, body string) {
	c.t.Helper()
	c.putPathUnless(path, body, "")
}

// putPathUnless is putPath that fails at once on a 503 whose body holds
// refused (a problem type, "" for none), and reports whether the write
// was acknowledged.
func (c *testCluster) putPathUnless(path, body, refused string) bool {
	c.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		req, _ := http.NewRequest("PUT", c.url+"/d/"+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode < 300 {
				return true
			}
			if resp.StatusCode != 503 || (refused != "" && strings.Contains(string(b), refused)) {
				c.t.Errorf("put %s: %d %s", path, resp.StatusCode, b)
				return false
			}
		}
		if time.Now().After(deadline) {
			c.t.Errorf("put %s: no master within 20s", path)
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkAcked reads every acknowledged write back through the router.
func (c *testCluster) checkAcked(acked map[string]string) {
	c.t.Helper()
	for k, v := range acked {
		// A 503 (a partition between masters, a hand-over draining) says
		// nothing about the write: ask again for a while.
		deadline := time.Now().Add(30 * time.Second)
		for {
			resp, err := http.Get(c.url + "/d/T/" + k)
			if err != nil {
				c.t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 503 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			if resp.StatusCode != 200 || string(body) != `{"v":"`+v+`"}` {
				c.t.Fatalf("acknowledged %s=%s: %d %s", k, v, resp.StatusCode, body)
			}
			break
		}
	}
}

// TestControllerFailover kills the node that masters the most partitions
// and checks that every partition becomes writable again through the
// router, no acknowledged write is lost, masters moved to the next
// generation, and replicas hold identical contents.
func TestControllerFailover(t *testing.T) {
	const partitions = 8
	c := startCluster(t, 3, partitions, 2)
	acked := map[string]string{}
	for i := range 40 {
		k, v := fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i)
		c.put(k, v)
		acked[k] = v
	}
	// No waiting for the slaves: semi-sync acknowledged each write only
	// once a slave held it.

	before := c.view.Table("d")
	victim := busiestMaster(before)
	// A key the victim masters, for reads during the failover.
	d, _ := c.reg.Database("d")
	onVictim := ""
	for k := range acked {
		if before.Partitions[d.PartitionOf(keys.Part{Str: k})].Replicas[0] == victim {
			onVictim = k
			break
		}
	}
	start := time.Now()
	c.nodes[victim].kill()
	delete(c.nodes, victim)
	if onVictim != "" {
		// While the partition has no master, a read that accepts
		// staleness is answered by a slave; one that does not is 503.
		resp := c.get(onVictim, "max-stale=30")
		if resp.StatusCode == 200 && resp.Header.Get("X-Cortado-Replica") != "slave" {
			t.Logf("the failover completed before the first read")
		} else if resp.StatusCode != 200 || resp.Header.Get("Age") == "" || resp.body != `{"v":"`+acked[onVictim]+`"}` {
			t.Fatalf("read with max-stale during the failover: %d %v %s", resp.StatusCode, resp.Header, resp.body)
		}
		soon := time.Since(start) < time.Second // well before the lease lapses
		if resp := c.get(onVictim, ""); soon && resp.StatusCode != 503 {
			t.Fatalf("fresh read of a partition without a master: %d %s", resp.StatusCode, resp.body)
		}
	}
	for i := range partitions * 4 { // spread over every partition
		c.put(fmt.Sprintf("after%d", i), "x")
	}
	t.Logf("all partitions writable %v after killing %s (lease TTL 2s)", time.Since(start).Round(10*time.Millisecond), victim)
	c.checkAcked(acked)
	after := c.view.Table("d")
	for p, r := range after.Partitions {
		for _, id := range r.Replicas {
			if id == victim {
				t.Fatalf("partition %d still on the dead node: %v", p, r.Replicas)
			}
		}
		if before.Partitions[p].Replicas[0] == victim && r.Generation <= before.Partitions[p].Generation {
			t.Fatalf("partition %d changed master without a new generation: %d → %d", p, before.Partitions[p].Generation, r.Generation)
		}
		// The new master was chosen for what it was seen to hold: a
		// position of the victim's generation or a later one before its
		// own.
		if g := r.At.Gen; before.Partitions[p].Replicas[0] == victim && (g < before.Partitions[p].Generation || g >= r.Generation) {
			t.Fatalf("partition %d: the master of generation %d was chosen at %+v, want a position from generation %d on", p, r.Generation, r.At, before.Partitions[p].Generation)
		}
	}
	awaitReplicasEqual(t, c.view, c.nodes, partitions)
}

// TestControllerJoinUnderLoad adds a node while a writer keeps writing:
// replicas and masters move to it (masters hand over after draining the
// old master), and no acknowledged write is lost. The copies the old
// nodes kept of the partitions that moved away are then deleted, and the
// writes are all still there.
func TestControllerJoinUnderLoad(t *testing.T) {
	const partitions = 16
	c := startCluster(t, 3, partitions, 2)
	acked := map[string]string{}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k, v := fmt.Sprintf("w%d", i), fmt.Sprint(i)
			c.put(k, v)
			acked[k] = v
		}
	}()
	// Let the writer get going on the three-node layout, then join.
	awaitTable(t, c, func(tb *topo.RoutingTable) bool { return tb != nil })
	for len(c.nodes) < 4 {
		c.addNode()
	}
	awaitTable(t, c, func(tb *topo.RoutingTable) bool {
		masters := 0
		for _, r := range tb.Partitions {
			if r.Replicas[0] == "n3" {
				masters++
			}
		}
		return masters >= partitions/4
	})
	awaitReplicasEqual(t, c.view, c.nodes, partitions)

	// Each copy left behind on the first three nodes is deleted, while
	// the writer goes on.
	left := func() (copies []string, moved int) {
		tb := c.view.Table("d")
		for id, n := range c.nodes {
			for p, r := range tb.Partitions {
				if slices.Contains(r.Replicas, id) {
					continue
				}
				if id != "n3" {
					moved++
				}
				if held, err := n.eng.Holds("d", p); err != nil || held {
					copies = append(copies, fmt.Sprintf("%s/%d", id, p))
				}
			}
		}
		return copies, moved
	}
	deadline := time.Now().Add(20 * time.Second)
	for copies, moved := left(); len(copies) > 0; copies, moved = left() {
		if time.Now().After(deadline) {
			t.Fatalf("copies left on nodes that are no replica of them: %v (%d replicas moved)", copies, moved)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, moved := left(); moved < partitions/2 {
		t.Fatalf("only %d replicas moved off the first three nodes", moved)
	}
	close(stop)
	<-done
	t.Logf("%d writes acknowledged while a node joined and the copies left behind were deleted", len(acked))
	c.checkAcked(acked)
	awaitReplicasEqual(t, c.view, c.nodes, partitions)
}

// TestJoinKeepsWritesAcknowledged: with minInSync as large as replicas
// (a write waits for every slave), a node that joins and is given
// replicas holds no write up before it has caught up: each slave it is
// to replace stays a slave, acknowledging writes, until it has (make
// before break), then goes. Nothing acknowledged is lost.
func TestJoinKeepsWritesAcknowledged(t *testing.T) {
	const partitions = 4
	c := startClusterWith(t, clusterOptions{nodes: 3, partitions: partitions, replicas: 3, minInSync: 3,
		node: node.Options{SemiSyncTimeout: time.Second}})
	acked := map[string]string{}
	// A partition without a master yet is asked again; a write that its
	// slaves did not acknowledge is the failure.
	write := func(i int) {
		k, v := fmt.Sprintf("w%d", i), fmt.Sprint(i)
		if !c.putPathUnless("T/"+k, `{"v":"`+v+`"}`, "not-replicated") {
			t.FailNow()
		}
		acked[k] = v
	}
	for i := range 40 {
		write(i)
	}
	// A fourth node registers but applies no routing table yet.
	id := c.nextNodeID()
	n, run := joinClusterNode(t, c.ctx, c.cli, c.reg, id, c.nodeOpts, nil)
	c.nodes[id] = n
	awaitTable(t, c, func(tb *topo.RoutingTable) bool {
		for _, r := range tb.Partitions {
			if slices.Contains(r.Replicas, id) {
				return true
			}
		}
		return false
	})
	for i := 40; i < 240; i++ {
		write(i)
	}
	for p, r := range c.view.Table("d").Partitions {
		if slices.Contains(r.Replicas, id) && len(r.Replicas) != 4 {
			t.Fatalf("partition %d: replicas %v while %s has not caught up: the slave it replaces left first", p, r.Replicas, id)
		}
	}
	// It starts: once it has caught up, the slaves it replaces go.
	run()
	awaitTable(t, c, func(tb *topo.RoutingTable) bool {
		holds := 0
		for _, r := range tb.Partitions {
			if len(r.Replicas) != 3 {
				return false
			}
			if slices.Contains(r.Replicas, id) {
				holds++
			}
		}
		return holds == 3 // its share: 12 replicas on 4 nodes
	})
	for i := 240; i < 280; i++ {
		write(i)
	}
	c.checkAcked(acked)
	awaitReplicasEqual(t, c.view, c.nodes, partitions)
}

func awaitTable(t *testing.T, c *testCluster, ok func(*topo.RoutingTable) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok(c.view.Table("d")) {
		if time.Now().After(deadline) {
			t.Fatalf("routing table never reached the expected state: %+v", c.view.Table("d"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// awaitReplicasEqual waits until every partition's live replicas have the
// same SCN and checksum as its master.
func awaitReplicasEqual(t *testing.T, view *routing.RoutingView, nodes map[string]*clusterNode, partitions int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for p := 0; p < partitions; {
		table := view.Table("d")
		route := table.Partitions[p]
		ok := true
		ms, mc := sum(t, nodes[route.Replicas[0]].storageNode, p)
		for _, id := range route.Replicas[1:] {
			n, live := nodes[id]
			if !live {
				continue
			}
			s, c := sum(t, n.storageNode, p)
			if s != ms || c != mc {
				ok = false
			}
		}
		if ok {
			p++
			continue
		}
		if time.Now().After(deadline) {
			var state []string
			for _, id := range route.Replicas {
				if n, live := nodes[id]; live {
					s, c := sum(t, n.storageNode, p)
					state = append(state, fmt.Sprintf("%s(%s) at %s/%x", id, n.Role("d", p), s, c))
				}
			}
			t.Fatalf("partition %d: replicas did not converge: %v", p, state)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type response struct {
	*http.Response
	body string
}

// get reads a document through the router with an optional Cache-Control.
func (c *testCluster) get(k, cacheControl string) response {
	c.t.Helper()
	h := http.Header{}
	if cacheControl != "" {
		h.Set("Cache-Control", cacheControl)
	}
	return c.getWith(k, h)
}

// getWith reads /d/T/ + path through the router with headers h.
func (c *testCluster) getWith(path string, h http.Header) response {
	c.t.Helper()
	return c.read("T/"+path, h)
}

// read GETs /d/ + path through the router with headers h.
func (c *testCluster) read(path string, h http.Header) response {
	c.t.Helper()
	req, _ := http.NewRequest("GET", c.url+"/d/"+path, nil)
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return response{resp, string(b)}
}

// TestRouterReportsUnreachableNode cuts the busiest master off from the
// router while it keeps its etcd lease: the router's reports make the
// controller treat it as failed, its partitions get new masters, the node
// steps down (its agent applies the new table), and no acknowledged write
// is lost.
func TestRouterReportsUnreachableNode(t *testing.T) {
	const partitions = 8
	c := startCluster(t, 3, partitions, 2)
	acked := map[string]string{}
	for i := range 24 {
		k, v := fmt.Sprintf("k%d", i), fmt.Sprint(i)
		c.put(k, v)
		acked[k] = v
	}
	before := c.view.Table("d")
	victim := busiestMaster(before)
	c.nodes[victim].cutOff()
	for i := range partitions * 4 {
		c.put(fmt.Sprintf("after%d", i), "x")
	}
	for p, r := range c.view.Table("d").Partitions {
		if r.Replicas[0] == victim {
			t.Fatalf("partition %d still mastered by the unreachable node", p)
		}
		if c.nodes[victim].Role("d", p) == node.Master {
			t.Fatalf("the unreachable node still acts as master of partition %d", p)
		}
	}
	if !c.nodes[victim].member.Valid() {
		t.Fatal("the victim lost its lease; the test meant to keep it")
	}
	c.checkAcked(acked)
}

// TestRelayBuffer runs slaves through a relay whose buffer holds only 5
// commits per partition: a node joining later must start from the
// beginning, which the relay no longer holds, so it re-reads from the
// master; every replica still ends identical.
func TestRelayBuffer(t *testing.T) {
	const partitions = 4
	var served, pulled atomic.Int64
	c := startClusterWith(t, clusterOptions{nodes: 2, partitions: partitions, replicas: 2, relayBuffer: 5,
		relayPulled: func(n int) { pulled.Add(int64(n)) }, relayServed: func(n int) { served.Add(int64(n)) }})
	acked := map[string]string{}
	i := 0
	// Slaves that started following before the relay knew their partition
	// read from the master for a while, then come back to the relay.
	await(t, 30*time.Second, "the relay to serve slaves from its buffer", func() bool {
		for range 20 {
			k, v := fmt.Sprintf("k%d", i), fmt.Sprint(i)
			c.put(k, v)
			acked[k] = v
			i++
		}
		return served.Load() > 0 && pulled.Load() > 0
	})
	awaitReplicasEqual(t, c.view, c.nodes, partitions)
	// Before the relay's buffer: answered from the master.
	res, err := c.relay.Log(context.Background(), node.LogRequest{DB: "d", Partition: 0})
	if err != nil || len(res.Commits) == 0 || res.Commits[0].SCN.Seq != 1 {
		t.Fatalf("reading partition 0 from its start through the relay: %v %+v", err, res)
	}
	c.addNode()
	awaitTable(t, c, func(tb *topo.RoutingTable) bool {
		for _, r := range tb.Partitions {
			if slices.Contains(r.Replicas, "n2") {
				return true
			}
		}
		return false
	})
	awaitReplicasEqual(t, c.view, c.nodes, partitions)
	c.checkAcked(acked)
}

// busiestMaster is the node mastering the most partitions in t (of those
// tied, the first by name).
func busiestMaster(t *topo.RoutingTable) string {
	count := t.Masters()
	best := ""
	for _, id := range slices.Sorted(maps.Keys(count)) {
		if best == "" || count[id] > count[best] {
			best = id
		}
	}
	return best
}

// TestLogAnswerBytes: a log answer holds commits up to the first that
// reaches the asked bytes (at least one, whatever its size), from a
// relay, from a node in the process and from a node over the wire, so a
// change stream's readers bound what they hold.
func TestLogAnswerBytes(t *testing.T) {
	c := startClusterWith(t, clusterOptions{nodes: 1, partitions: 1, replicas: 1, relayBuffer: 1000})
	value := strings.Repeat("x", 10_000)
	for i := range 20 {
		c.put(fmt.Sprintf("k%d", i), value)
	}
	var n *clusterNode
	for _, cn := range c.nodes {
		n = cn
	}
	sources := map[string]node.LogSource{"relay": c.relay, "node": n.Node, "node over the wire": remote(t, n.url)}
	for name, src := range sources {
		// From the commit before the first write (a new generation
		// opens with a commit of its own).
		var after storage.SCN
		await(t, 10*time.Second, name+" to hold the writes", func() bool {
			res, err := src.Log(context.Background(), node.LogRequest{DB: "d", Partition: 0})
			if err != nil {
				return false
			}
			big := 0
			for i, cm := range res.Commits {
				if cm.Size() > 10_000 {
					if big == 0 && i > 0 {
						after = res.Commits[i-1].SCN
					}
					big++
				}
			}
			return big == 20
		})
		got, err := src.Log(context.Background(), node.LogRequest{DB: "d", Partition: 0, After: after, MaxBytes: 25_000})
		if err != nil {
			t.Fatal(err)
		}
		size, last := 0, 0
		for i := range got.Commits {
			last = got.Commits[i].Size()
			size += last
		}
		if len(got.Commits) < 2 || size-last >= 25_000 || size < 25_000 {
			t.Fatalf("%s: %d commits of %d bytes for 25,000 asked", name, len(got.Commits), size)
		}
		one, err := src.Log(context.Background(), node.LogRequest{DB: "d", Partition: 0, After: after, MaxBytes: 100})
		if err != nil || len(one.Commits) != 1 {
			t.Fatalf("%s: asking 100 bytes: %v %d commits, want the first commit alone", name, err, len(one.Commits))
		}
	}
}

// TestSnapshotOnlyFromTheMaster: a slave asked for a snapshot refuses
// (ErrNotMaster, naming its master) rather than stream its own state,
// which a stale routing table may take for the partition's — a backup
// through a router cut off from etcd got an empty one from a replica
// being rebuilt; the master streams one holding every acknowledged
// write.
func TestSnapshotOnlyFromTheMaster(t *testing.T) {
	c := startCluster(t, 2, 1, 2)
	acked := map[string]string{}
	for i := range 20 {
		k := fmt.Sprintf("k%d", i)
		c.put(k, "v")
		acked[k] = "v"
	}
	rt := c.view.Table("d")
	master, slave := rt.Partitions[0].Replicas[0], rt.Partitions[0].Replicas[1]
	err := c.nodes[slave].Snapshot(c.ctx, node.SnapshotRequest{DB: "d", Partition: 0}, func(*node.SnapshotChunk) error {
		t.Fatal("a slave streamed a snapshot")
		return nil
	})
	if !errors.Is(err, node.ErrNotMaster) || !strings.Contains(err.Error(), master) {
		t.Fatalf("a slave asked for a snapshot: %v, want ErrNotMaster naming %s", err, master)
	}
	rows := 0
	err = c.nodes[master].Snapshot(c.ctx, node.SnapshotRequest{DB: "d", Partition: 0}, func(ch *node.SnapshotChunk) error {
		rows += len(ch.Rows)
		return nil
	})
	if err != nil || rows != len(acked) {
		t.Fatalf("the master's snapshot: %d rows, %v; want %d", rows, err, len(acked))
	}
}

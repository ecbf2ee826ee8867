package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/controller"
	"github.com/cortado-db/cortado/internal/coord"
	"github.com/cortado-db/cortado/internal/coord/coordtest"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/topo"
)

// procCluster is Cortado as separate processes on loopback ports: storage
// nodes, two controllers (one leads) and a router, on one etcd.
type procCluster struct {
	t           *testing.T
	etcd        string // its endpoint
	cli         *clientv3.Client
	storage     map[string]*Serve
	controllers map[string]*Serve
	router      *Serve
	relay       *Serve
	// relayProxy is toxiproxy in front of the relay: slaves reach the
	// relay only through it, so a test can cut them off.
	relayProxy *toxiproxy.Proxy
	partitions int
	// history is every routing table version of database d published,
	// in order.
	mu      sync.Mutex
	history []*topo.RoutingTable
}

const procPrefix = "/cortado"

func startProcCluster(t *testing.T, nodes, partitions int) *procCluster {
	return startProcClusterWith(t, nodes, partitions, nil)
}

// startProcClusterWith is startProcCluster with extra flags for some
// processes, by name ("relay", "s0", "s1", …, "router"), and under "db" the
// database's definition.
func startProcClusterWith(t *testing.T, nodes, partitions int, extra map[string][]string) *procCluster {
	return startProcClusterOf(t, "", nodes, partitions, extra)
}

// startProcClusterOf is startProcClusterWith with every process running
// the binary bin ("" is this checkout's).
func startProcClusterOf(t *testing.T, bin string, nodes, partitions int, extra map[string][]string) *procCluster {
	etcd := coordtest.Embedded(t)
	cli, err := coord.Connect(context.Background(), []string{etcd.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	c := &procCluster{t: t, etcd: etcd.Endpoint, cli: cli, storage: map[string]*Serve{}, controllers: map[string]*Serve{}, partitions: partitions}
	wctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		for wr := range cli.Watch(wctx, procPrefix+"/routing/", clientv3.WithPrefix()) {
			for _, ev := range wr.Events {
				var rt topo.RoutingTable
				if json.Unmarshal(ev.Kv.Value, &rt) == nil && rt.DB == "d" {
					c.mu.Lock()
					c.history = append(c.history, &rt)
					c.mu.Unlock()
				}
			}
		}
	}()
	// The relay listens on a port of its own but advertises the proxy.
	relayPort, err := coord.FreeLoopbackURL()
	if err != nil {
		t.Fatal(err)
	}
	relayAddr := strings.TrimPrefix(relayPort, "http://")
	c.relayProxy = NewLink(t, "relay", relayAddr)
	c.relay = StartRoleOf(t, bin, "relay", append([]string{"--etcd-endpoints", etcd.Endpoint, "--listen", relayAddr, "--advertise-url", "http://" + c.relayProxy.Listen, "--lease-ttl", "2"}, extra["relay"]...)...)
	for i := range nodes {
		id := fmt.Sprintf("s%d", i)
		c.storage[id] = StartRoleOf(t, bin, "storage", append([]string{"--etcd-endpoints", etcd.Endpoint, "--node-id", id, "--lease-ttl", "2"}, extra[id]...)...)
	}
	for _, id := range []string{"c1", "c2"} {
		c.controllers[id] = StartRoleOf(t, bin, "controller", "--etcd-endpoints", etcd.Endpoint, "--controller-id", id, "--lease-ttl", "2", "--check-interval", "0")
	}
	c.router = StartRoleOf(t, bin, "router", append([]string{"--etcd-endpoints", etcd.Endpoint}, extra["router"]...)...)
	db := fmt.Sprintf(`{"partitions":%d,"replicas":3}`, partitions)
	if d := extra["db"]; len(d) > 0 {
		db = d[0] // the database's definition
	}
	c.do("PUT", "/_schemata/d", db, 201)
	c.do("PUT", "/_schemata/d/T", `{"key":[{"name":"k"}],"schema":{"type":"record","name":"T","fields":[{"name":"v","type":"string"}]}}`, 201)
	return c
}

func (c *procCluster) do(method, path, body string, want int) {
	c.t.Helper()
	req, _ := http.NewRequest(method, c.router.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != want {
		c.t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
}

// put writes {"v":v} to key k of table T through the cluster's router
// with a Request-Timeout (putVia).
func (c *procCluster) put(k, v, timeout string) (int, string) {
	return putVia(c.router.URL, k, v, timeout)
}

// putVia writes {"v":v} to key k of table T of database d through the
// router at base, with a Request-Timeout unless timeout is empty, and
// returns the status and body (status 0 and the error when there was no
// answer).
func putVia(base, k, v, timeout string) (int, string) {
	req, _ := http.NewRequest("PUT", base+"/d/T/"+k, strings.NewReader(`{"v":"`+v+`"}`))
	req.Header.Set("Content-Type", "application/json")
	if timeout != "" {
		req.Header.Set("Request-Timeout", timeout)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}

// awaitSlavesOnRelay waits until both slaves of a one-partition database
// read the log through the relay, not from the master (a slave reads the
// master directly until it first hears of the relay). It writes probes,
// adding those acknowledged to acked: one the relay serves twice was read
// through it by both. The first probe does not count, as the writes
// before it may still be being served; nothing else may read the relay
// meanwhile (no change stream).
func (c *procCluster) awaitSlavesOnRelay(acked map[string]string) {
	c.t.Helper()
	served := func() float64 { return metric(c.t, c.relay.URL, "cortado_relay_served_commits_total") }
	probe, before, sent := 0, 0.0, time.Time{}
	await(c.t, 30*time.Second, "both slaves to read through the relay", func() bool {
		if probe > 1 && served()-before >= 2 {
			return true
		}
		if probe == 0 || time.Since(sent) > time.Second {
			// Another probe; the last may have been read directly.
			probe++
			before, sent = served(), time.Now()
			k := fmt.Sprintf("probe%d", probe)
			if st, _ := c.put(k, "1", "5s"); st == 201 || st == 200 {
				acked[k] = "1"
			}
		}
		return false
	})
}

func (c *procCluster) table() *topo.RoutingTable {
	c.t.Helper()
	rt, err := topo.LoadRoutingTable(context.Background(), c.cli, procPrefix, "d")
	if err != nil || rt == nil {
		c.t.Fatalf("routing table: %v %v", rt, err)
	}
	return rt
}

// busiestMaster is the node mastering the most partitions.
func (c *procCluster) busiestMaster() string { return busiestMaster(c.table()) }

// awaitMastersOff waits until no partition is mastered by victim.
func (c *procCluster) awaitMastersOff(victim string) {
	c.t.Helper()
	await(c.t, 30*time.Second, "masters off "+victim, func() bool { return c.table().Masters()[victim] == 0 })
}

// awaitHosting waits until some partition has a replica on id again.
func (c *procCluster) awaitHosting(id string) {
	c.t.Helper()
	await(c.t, 30*time.Second, id+" to host partitions again", func() bool {
		for _, r := range c.table().Partitions {
			if slices.Contains(r.Replicas, id) {
				return true
			}
		}
		return false
	})
}

// writers runs n writers through the router until stop is closed; each
// retries a write answered 503 (no master yet, or not confirmed by a
// replica) and logs every acknowledged one.
type writers struct {
	mu    sync.Mutex
	acked map[string]string
	stop  chan struct{}
	wg    sync.WaitGroup
	errs  []string
	// refused counts the 503s (retried) and failed calls by their
	// cause, from when counting began (countRefusals).
	refused  map[string]int
	counting bool
}

// countRefusals starts counting the writes refused from now on.
func (w *writers) countRefusals() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.refused, w.counting = map[string]int{}, true
}

// refusals is what countRefusals counted.
func (w *writers) refusals() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.refused)
}

func (w *writers) refusedFor(cause string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.counting {
		w.refused[cause]++
	}
}

func (c *procCluster) startWriters(n int) *writers {
	w := &writers{acked: map[string]string{}, stop: make(chan struct{})}
	hc := &http.Client{Timeout: 10 * time.Second}
	for g := range n {
		w.wg.Go(func() {
			for i := 0; ; i++ {
				k, v := fmt.Sprintf("w%d-%d", g, i), fmt.Sprint(i)
				for {
					select {
					case <-w.stop:
						return
					default:
					}
					req, _ := http.NewRequest("PUT", c.router.URL+"/d/T/"+k, strings.NewReader(`{"v":"`+v+`"}`))
					req.Header.Set("Content-Type", "application/json")
					resp, err := hc.Do(req)
					if err != nil {
						w.refusedFor(err.Error())
						continue
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode < 300 {
						w.mu.Lock()
						w.acked[k] = v
						w.mu.Unlock()
						time.Sleep(5 * time.Millisecond) // a steady load, not a flood
						break
					}
					if resp.StatusCode != 503 {
						w.mu.Lock()
						w.errs = append(w.errs, fmt.Sprintf("put %s: %d %s", k, resp.StatusCode, b))
						w.mu.Unlock()
						return
					}
					var p struct{ Title, Detail string }
					json.Unmarshal(b, &p)
					w.refusedFor("503 " + p.Title)
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
	return w
}

func (w *writers) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

func (w *writers) finish(t *testing.T) map[string]string {
	close(w.stop)
	w.wg.Wait()
	if len(w.errs) > 0 {
		t.Fatalf("writers failed: %v", w.errs)
	}
	return w.acked
}

// await polls cond until it holds, for up to d.
func await(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// awaitWrites waits until the writers have had n more writes acknowledged.
func awaitWrites(t *testing.T, w *writers, n int) {
	t.Helper()
	target := w.count() + n
	await(t, 30*time.Second, fmt.Sprintf("%d acknowledged writes", target), func() bool { return w.count() >= target })
}

// verify checks, once the cluster has settled: every acknowledged write
// reads back; every routing table version gave a partition whose master
// changed a later generation; every replica of every partition holds the
// same rows (consistency check) and the same sequence of SCNs.
func (c *procCluster) verify(acked map[string]string) {
	t := c.t
	t.Helper()
	work := make(chan string)
	var wg sync.WaitGroup
	var lost sync.Map
	for range 8 {
		wg.Go(func() {
			for k := range work {
				// A 503 (a partition between masters, a hand-back
				// draining) says nothing about the write: ask again for
				// a while.
				deadline := time.Now().Add(30 * time.Second)
				for {
					resp, err := http.Get(c.router.URL + "/d/T/" + k)
					if err != nil {
						lost.Store(k, err.Error())
						break
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode == 503 && time.Now().Before(deadline) {
						time.Sleep(50 * time.Millisecond)
						continue
					}
					if resp.StatusCode != 200 || string(b) != `{"v":"`+acked[k]+`"}` {
						lost.Store(k, fmt.Sprintf("%d %s", resp.StatusCode, b))
					}
					break
				}
			}
		})
	}
	for k := range acked {
		work <- k
	}
	close(work)
	wg.Wait()
	lost.Range(func(k, v any) bool {
		t.Errorf("acknowledged %s=%s lost: %s", k, acked[k.(string)], v)
		return true
	})
	if t.Failed() {
		t.FailNow()
	}
	c.mu.Lock()
	history := slices.Clone(c.history)
	c.mu.Unlock()
	for i := 1; i < len(history); i++ {
		prev, cur := history[i-1], history[i]
		if cur.Version <= prev.Version {
			t.Fatalf("routing table versions out of order: %d after %d", cur.Version, prev.Version)
		}
		for p, r := range cur.Partitions {
			old := prev.Partitions[p]
			if r.Generation < old.Generation || r.Replicas[0] != old.Replicas[0] && r.Generation == old.Generation {
				t.Fatalf("partition %d: master %s gen %d → master %s gen %d (v%d → v%d)", p, old.Replicas[0], old.Generation, r.Replicas[0], r.Generation, prev.Version, cur.Version)
			}
		}
	}
	await(t, 30*time.Second, "every replica to match its master", func() bool {
		res, err := controller.Check(context.Background(), c.cli, procPrefix, "d")
		if err != nil {
			return false
		}
		for _, pc := range res {
			if len(pc.Replicas) != 2 {
				return false
			}
			for _, r := range pc.Replicas {
				if r.Result == controller.CheckDiffers {
					t.Fatalf("partition %d: replica %s differs from master %s at %s", pc.Partition, r.Node, pc.Master, pc.SCN)
				}
				if r.Result != controller.CheckEqual {
					return false
				}
			}
		}
		return true
	})
	// Replicas are read one after the other: a commit made in between
	// (a generation's marker when the rejoined node takes its masters
	// back) shows as a difference until every replica has it. A real
	// divergence stays.
	deadline := time.Now().Add(15 * time.Second)
	for p := range c.table().Partitions {
		for {
			rt := c.table()
			r := rt.Partitions[p]
			var want Log
			diff := ""
			for i, id := range r.Replicas {
				got := timeline(t, rt.Nodes[id], p)
				if i == 0 {
					want = got
				} else if !got.Agrees(want) {
					diff = fmt.Sprintf("partition %d: %s's timeline (%s) differs from master %s's (%s)", p, id, got, r.Replicas[0], want)
					break
				}
			}
			if diff == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal(diff)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// timeline is Timeline of database d, failing the test on an error.
func timeline(t *testing.T, url string, p int) Log {
	t.Helper()
	out, err := Timeline(url, "d", p)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestFailoverKillMasterAndController kills -9 the storage node mastering
// the most partitions under a steady write load, and right after it the
// leading controller: the standby controller completes the failover. The
// killed node restarts and rejoins as a slave. Nothing acknowledged is
// lost and every replica ends on the same timeline.
func TestFailoverKillMasterAndController(t *testing.T) {
	c := startProcCluster(t, 3, 8)
	w := c.startWriters(4)
	awaitWrites(t, w, 50)

	victim := c.busiestMaster()
	st, err := controller.ClusterStatus(context.Background(), c.cli, procPrefix)
	if err != nil || c.controllers[st.Controller] == nil {
		t.Fatalf("leading controller: %q %v", st.Controller, err)
	}
	killed := time.Now()
	c.storage[victim].Kill()
	c.controllers[st.Controller].Kill()
	c.awaitMastersOff(victim)
	t.Logf("masters moved %v after kill -9 of %s and of controller %s (lease TTL 2s)", time.Since(killed).Round(10*time.Millisecond), victim, st.Controller)
	awaitWrites(t, w, 100)

	c.storage[victim].Restart()
	c.awaitHosting(victim)
	awaitWrites(t, w, 50)
	acked := w.finish(t)
	t.Logf("%d writes acknowledged", len(acked))
	c.verify(acked)
}

// TestRollingRestart stops the busiest master cleanly (SIGTERM, a
// rolling restart's step) under writes: before it leaves, it hands every
// partition it masters to another replica by a planned hand-over, so no
// write fails or is left with an unknown outcome — none is answered 503,
// as when the partitions fail over — and nothing acknowledged is lost.
// Started again, it takes masterships back the same way, again without a
// 503: a write that reaches a partition in a planned hand-over waits for
// it (routing.HandOverWait).
func TestRollingRestart(t *testing.T) {
	info := []string{"--log-level", "info"}
	c := startProcClusterWith(t, 3, 8, map[string][]string{"s0": info, "s1": info, "s2": info})
	w := c.startWriters(4)
	awaitWrites(t, w, 50)
	victim := c.busiestMaster()
	w.countRefusals()
	began := time.Now()
	c.storage[victim].Stop()
	t.Logf("%s stopped in %s", victim, time.Since(began).Round(time.Millisecond))
	if log := c.storage[victim].Log(); !strings.Contains(log, "drained: every partition another replica can master has a new master") {
		t.Fatalf("%s left without handing its partitions over:\n%s", victim, log)
	}
	c.awaitMastersOff(victim)
	awaitWrites(t, w, 100)
	if r := w.refusals(); len(r) > 0 {
		t.Fatalf("writes refused while %s stopped cleanly: %v", victim, r)
	}
	w.countRefusals()
	c.storage[victim].Restart()
	c.awaitHosting(victim)
	await(t, 30*time.Second, victim+" to master partitions again", func() bool { return c.table().Masters()[victim] > 0 })
	awaitWrites(t, w, 50)
	acked := w.finish(t)
	if r := w.refusals(); len(r) > 0 {
		t.Fatalf("writes refused while %s took its partitions back: %v", victim, r)
	}
	t.Logf("%d writes acknowledged", len(acked))
	c.verify(acked)
}

// TestFailoverPausedMaster pauses (SIGSTOP) the busiest master past its
// lease: its partitions fail over; when it resumes it must not accept a
// write (its lease is gone: fencing), and it rejoins as a slave.
func TestFailoverPausedMaster(t *testing.T) {
	c := startProcCluster(t, 3, 8)
	w := c.startWriters(4)
	awaitWrites(t, w, 50)

	victim := c.busiestMaster()
	var mastered []int
	for p, r := range c.table().Partitions {
		if r.Replicas[0] == victim {
			mastered = append(mastered, p)
		}
	}
	url := c.table().Nodes[victim]
	c.storage[victim].Pause()
	c.awaitMastersOff(victim)
	awaitWrites(t, w, 100)
	c.storage[victim].Resume()
	// The old master is asked directly, as a router with a stale table
	// would: it must refuse.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := remote(t, url).Write(ctx, node.WriteRequest{DB: "d", Partition: mastered[0], Ops: []node.Op{{Kind: node.OpDelete, Table: "T", Key: nil}}})
	if err == nil || !strings.Contains(err.Error(), "not the partition's master") {
		t.Fatalf("the resumed old master answered a write: %v", err)
	}
	await(t, 30*time.Second, "the resumed node to host partitions again", func() bool {
		st, err := controller.ClusterStatus(context.Background(), c.cli, procPrefix)
		if err != nil {
			return false
		}
		for _, n := range st.Nodes {
			if n.ID == victim {
				return n.Live && n.Slaves+n.Masters > 0
			}
		}
		return false
	})
	awaitWrites(t, w, 50)
	acked := w.finish(t)
	t.Logf("%d writes acknowledged", len(acked))
	c.verify(acked)
}

// TestFailoverRelayCut runs with slaves reading through the relay, then
// cuts them off from it (toxiproxy): they fall back to their masters, and
// semi-sync writes keep being acknowledged. Then the busiest master is
// killed -9 while the relay is still cut: nothing acknowledged is lost and
// the replicas end on one timeline. Healing the cut, slaves return to the
// relay.
func TestFailoverRelayCut(t *testing.T) {
	c := startProcCluster(t, 3, 8)
	w := c.startWriters(4)
	awaitWrites(t, w, 50)
	await(t, 10*time.Second, "slaves reading through the relay", func() bool {
		return metric(t, c.relay.URL, "cortado_relay_served_commits_total") > 0
	})
	c.relayProxy.Stop()
	awaitWrites(t, w, 100)
	victim := c.busiestMaster()
	c.storage[victim].Kill()
	c.awaitMastersOff(victim)
	awaitWrites(t, w, 100)
	if err := c.relayProxy.Start(); err != nil {
		t.Fatal(err)
	}
	c.storage[victim].Restart()
	c.awaitHosting(victim)
	awaitWrites(t, w, 50)
	acked := w.finish(t)
	t.Logf("%d writes acknowledged", len(acked))
	c.verify(acked)
}

// TestSlaveLeavesSilentRelay blackholes the relay's link: its streams to
// the slaves go silent, with no reset or refusal, as in a network
// partition. A semi-sync write must then be acknowledged through a slave
// that asked the master, after a second and a half of silence, whether
// it had moved on, and read its log directly — not after the five seconds
// that take a silent stream for dead (the write's own deadline is longer,
// so without the question it would still succeed, later, and the count of
// slaves that left a relay "behind" would stay 0).
func TestSlaveLeavesSilentRelay(t *testing.T) {
	c := startProcCluster(t, 3, 1)
	acked := map[string]string{}
	c.awaitSlavesOnRelay(acked)
	slaves := c.table().Partitions[0].Replicas[1:]
	left := func(reason string) float64 {
		n := 0.0
		for _, id := range slaves {
			n += metric(t, c.storage[id].URL, `cortado_replica_relay_left_total{reason="`+reason+`"}`)
		}
		return n
	}
	if err := Cut(c.relayProxy); err != nil {
		t.Fatal(err)
	}
	if st, body := c.put("cut", "1", "30s"); st != 201 && st != 200 {
		t.Fatalf("a write with the relay cut off: %d %s", st, body)
	}
	acked["cut"] = "1"
	if behind, failed := left("behind"), left("failed"); behind == 0 {
		t.Fatalf("the slaves left the silent relay %v times as behind, %v as failed: want behind", behind, failed)
	}
	if err := Mend(c.relayProxy); err != nil {
		t.Fatal(err)
	}
	c.verify(acked)
}

// Semi-sync writes waiting on a silent relay neither hold their storage
// node's slots nor make the router take the node for stalled: the node
// serves other work meanwhile, and the writes succeed once the slaves
// leave the relay. Before, they held every slot (the node's limit
// shrinking as they waited), the node refused all else as overloaded,
// and writes to its other partitions could not commit — so their slaves
// saw no master ahead of them and stayed on the silent relay for 5 s (the
// pause-relay fault's worst partitions); and a router whose calls to the
// node all waited past --stall-after ended them as unavailable.
func TestWaitingOnReplicasHoldsNoSlots(t *testing.T) {
	limit := []string{"--node-max-in-flight", "4", "--node-adaptive=false"}
	c := startProcClusterWith(t, 3, 1, map[string][]string{"s0": limit, "s1": limit, "s2": limit,
		"router": {"--stall-after", "300ms"}})
	acked := map[string]string{}
	c.awaitSlavesOnRelay(acked)
	master := c.storage[c.table().Partitions[0].Replicas[0]]
	if err := Cut(c.relayProxy); err != nil {
		t.Fatal(err)
	}
	// Ten writes wait for a slave to leave the relay (about 1.5 s): more
	// than the master's four slots, and, once past --stall-after, more
	// than the eight unanswered calls (--stall-calls) that make the
	// router suspect the node.
	const writes = 10
	type result struct {
		k    string
		st   int
		body string
	}
	results := make(chan result, writes)
	write := func(i int) {
		k := fmt.Sprintf("waiting%d", i)
		go func() {
			st, body := c.put(k, "1", "30s")
			results <- result{k, st, body}
		}()
	}
	for i := range 8 {
		write(i)
	}
	busy := func() float64 {
		return metric(t, master.URL, "cortado_admission_in_flight") + metric(t, master.URL, "cortado_admission_parked")
	}
	await(t, 10*time.Second, "eight writes in progress or parked at the master", func() bool { return busy() >= 8 })
	// No condition to await: what is tested is the router's view of a
	// node that has answered nothing for longer than --stall-after.
	time.Sleep(400 * time.Millisecond)
	write(8)
	write(9)
	resp, err := http.Get(c.router.URL + "/d/T/probe1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("a read while writes wait on replicas: %d %s", resp.StatusCode, b)
	}
	if parked := metric(t, master.URL, "cortado_admission_parked"); parked == 0 {
		t.Errorf("no write parked")
	}
	for range writes {
		r := <-results
		if r.st != 200 && r.st != 201 {
			t.Fatalf("write %s while the relay was cut: %d %s", r.k, r.st, r.body)
		}
		acked[r.k] = "1"
	}
	if err := Mend(c.relayProxy); err != nil {
		t.Fatal(err)
	}
	c.verify(acked)
}

// metric reads a counter or gauge from a process's /metrics: the sum of
// its series, whatever their labels.
func metric(t *testing.T, base, name string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	sum := 0.0
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "{")) {
			// Every series of the metric, whatever its labels.
			var f float64
			fmt.Sscan(rest[strings.LastIndexByte(rest, ' ')+1:], &f)
			sum += f
		}
	}
	return sum
}

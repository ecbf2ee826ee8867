package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/cortado-db/cortado/internal/admission"
	"github.com/cortado-db/cortado/internal/keycache"
	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/router"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
)

// proxyLast returns a toxiproxy proxy and the advertiseLast option that
// puts it in front of a test cluster's last node (the proxy is set once
// the cluster starts).
func proxyLast(t *testing.T) (*toxiproxy.Proxy, func(url string) string) {
	tp := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	proxy := toxiproxy.NewProxy(tp, "last", "127.0.0.1:0", "")
	return proxy, func(url string) string {
		proxy.Upstream = strings.TrimPrefix(url, "http://")
		if err := proxy.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(proxy.Stop)
		return "http://" + proxy.Listen
	}
}

// TestHedgedReads puts 300 ms of latency in front of one storage node
// (toxiproxy) of a three-replica cluster. Reads of its partitions that
// accept a slave's answer are hedged to a slave and answered quickly, as
// long as the slaves' per-host budget lasts; the budget then bounds the
// hedges (a tenth of each host's successes plus a floor), and writes are
// never hedged.
func TestHedgedReads(t *testing.T) {
	proxy, advertise := proxyLast(t)
	c := startClusterWith(t, clusterOptions{nodes: 3, partitions: 4, replicas: 3, advertiseLast: advertise,
		// A small bank, to see it spent; no hot-key cache, which would
		// answer the reads of the same keys without a node.
		router: router.Options{Hedge: router.HedgeOptions{Burst: 10}, Cache: keycache.Options{MaxBytes: -1}}})
	slow := "n2"
	d, _ := c.reg.Database("d")
	var onSlow []string
	for i := 0; len(onSlow) < 4 && i < 1000; i++ {
		k := "k" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + string(rune('a'+i/26%26))
		c.put(k, "v")
		if c.view.Table("d").Partitions[d.PartitionOf(keys.S(k))].Replicas[0] == slow {
			onSlow = append(onSlow, k)
		}
	}
	if len(onSlow) == 0 {
		t.Fatalf("%s masters no partition", slow)
	}
	// Slaves hold the writes (semi-sync), and have heard from the master
	// that it holds them.
	awaitReplicasEqual(t, c.view, c.nodes, 4)
	awaitSlavesConfirmed(t, c, 4)
	if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(`{"name":"lag","type":"latency","stream":"downstream","attributes":{"latency":300}}`)); err != nil {
		t.Fatal(err)
	}

	read := func(k string) time.Duration {
		req, _ := http.NewRequest("GET", c.url+"/d/T/"+k, nil)
		req.Header.Set("Cache-Control", "max-stale=60")
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("read %s: %d", k, resp.StatusCode)
		}
		return time.Since(start)
	}
	start := time.Now()
	fast := 0
	const reads = 60
	for i := range reads {
		if read(onSlow[i%len(onSlow)]) < 150*time.Millisecond {
			fast++
		}
	}
	elapsed := time.Since(start)
	sent, won, denied := c.router.HedgeStats()
	t.Logf("%d reads in %v: %d fast; hedges sent %d, won %d, denied %d", reads, elapsed.Round(time.Millisecond), fast, sent, won, denied)
	if won < 5 || fast < 5 {
		t.Fatalf("reads of a slow master were not hedged: %d fast, %d hedges won", fast, won)
	}
	// The budget: a burst of 10 per slave host, 1/s per host, and a
	// tenth of each host's successes (each won hedge is one).
	hostsBudget := 2 * (10 + elapsed.Seconds()*1)
	if float64(sent) > hostsBudget+0.1*float64(sent)+2 || denied == 0 {
		t.Fatalf("hedges %d over the per-host budget (%.0f), or none denied (%d)", sent, hostsBudget, denied)
	}
	// Writes are never hedged.
	for i := range 5 {
		c.put(onSlow[i%len(onSlow)], "w")
	}
	if s, _, _ := c.router.HedgeStats(); s != sent {
		t.Fatalf("writes were hedged: %d hedges after, %d before", s, sent)
	}
}

// TestHedgedReadsOfManyDocuments puts 300 ms of latency in front of one
// storage node (toxiproxy), as TestHedgedReads does, and reads many
// documents at once: a collection page of a partition it masters, a
// multi-get of keys on its partitions and others', a query in the
// collection and one over every partition. With Cache-Control: max-stale
// each partition's call to the slow master is hedged to a slave, whose
// answer comes first and says so (X-Cortado-Replica: slave, Age); without
// it nothing is hedged and every read waits for the slow master.
func TestHedgedReadsOfManyDocuments(t *testing.T) {
	proxy, advertise := proxyLast(t)
	c := startClusterWith(t, clusterOptions{nodes: 3, partitions: 4, replicas: 3, advertiseLast: advertise,
		router: router.Options{Cache: keycache.Options{MaxBytes: -1}}})
	const slow = "n2"
	if _, _, err := c.reg.RegisterVersion(c.ctx, "d", "M", []schema.KeyPart{{Name: "g"}, {Name: "n", Type: "long"}},
		`{"type":"record","name":"M","fields":[{"name":"v","type":"string","index":"attribute"}]}`); err != nil {
		t.Fatal(err)
	}
	d, _ := c.reg.Database("d")
	c.put("first", "x") // the routing table is known
	masterOf := func(k string) string { return c.view.Table("d").Partitions[d.PartitionOf(keys.S(k))].Replicas[0] }
	group := ""
	for i := 0; group == "" && i < 1000; i++ {
		if g := fmt.Sprintf("g%d", i); masterOf(g) == slow {
			group = g
		}
	}
	var ks []string
	onSlow := 0
	for i := 0; (len(ks) < 12 || onSlow == 0 || onSlow == len(ks)) && i < 1000; i++ {
		k := fmt.Sprintf("k%d", i)
		c.put(k, k)
		ks = append(ks, k)
		if masterOf(k) == slow {
			onSlow++
		}
	}
	if group == "" || onSlow == 0 || onSlow == len(ks) {
		t.Fatalf("%s masters no collection, or the keys do not span it and others (%d of %d on it)", slow, onSlow, len(ks))
	}
	for i := range 5 {
		c.putPath(fmt.Sprintf("M/%s/%d", group, i), `{"v":"x"}`)
	}
	awaitReplicasEqual(t, c.view, c.nodes, 4)
	awaitSlavesConfirmed(t, c, 4)
	if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(`{"name":"lag","type":"latency","stream":"downstream","attributes":{"latency":300}}`)); err != nil {
		t.Fatal(err)
	}
	multi := "T/(" + strings.Join(ks, ",") + ")"
	reads := []struct {
		name, path string
		want       int
	}{
		{"collection", "M/" + group, 5},
		{"multi-get", multi, len(ks)},
		{"query in the collection", "M/" + group + "?query=v:x", 5},
		{"query of every partition", "M?query=v:x", 5},
	}
	count := func(r response) int {
		var page struct{ Documents []json.RawMessage }
		if err := json.Unmarshal([]byte(r.body), &page); err != nil {
			t.Fatalf("%s: %v", r.body, err)
		}
		return len(page.Documents)
	}
	for _, r := range reads {
		sent, won, _ := c.router.HedgeStats()
		start := time.Now()
		resp := c.read(r.path, http.Header{"Cache-Control": {"max-stale=60"}})
		took := time.Since(start)
		sentAfter, wonAfter, _ := c.router.HedgeStats()
		t.Logf("%s with max-stale: %v, hedges sent %d, won %d", r.name, took.Round(time.Millisecond), sentAfter-sent, wonAfter-won)
		if resp.StatusCode != 200 || count(resp) != r.want {
			t.Fatalf("%s with max-stale, its master slow: %d %s", r.name, resp.StatusCode, resp.body)
		}
		if wonAfter == won || resp.Header.Get("X-Cortado-Replica") != "slave" || resp.Header.Get("Age") == "" {
			t.Fatalf("%s with max-stale was not answered by a hedge to a slave: %d won, headers %v", r.name, wonAfter-won, resp.Header)
		}
	}
	sent, _, _ := c.router.HedgeStats()
	for _, r := range reads {
		start := time.Now()
		resp := c.read(r.path, nil)
		if took := time.Since(start); resp.StatusCode != 200 || count(resp) != r.want || took < 300*time.Millisecond || resp.Header.Get("X-Cortado-Replica") != "" {
			t.Fatalf("%s without max-stale: %d in %v, headers %v: %s; want the slow master's answer", r.name, resp.StatusCode, took, resp.Header, resp.body)
		}
	}
	if after, _, _ := c.router.HedgeStats(); after != sent {
		t.Fatalf("reads without max-stale were hedged: %d hedges", after-sent)
	}
}

// awaitSlavesConfirmed waits until every slave of d's partitions holds
// all its master holds and answers a read with max-stale at once: a
// slave's read waits until its master has confirmed holding what the
// read returns (node.Scan), which the master says in answer to the
// slave's acknowledgement. Once the master is slowed, so is that answer.
func awaitSlavesConfirmed(t *testing.T, c *testCluster, partitions int) {
	t.Helper()
	scan := func(id string, p int, maxStale, wait time.Duration) (storage.SCN, error) {
		ctx, cancel := context.WithTimeout(c.ctx, wait)
		defer cancel()
		res, err := c.nodes[id].Scan(ctx, node.ScanRequest{DB: "d", Table: "T", Partition: p, Limit: 1, MaxStale: maxStale})
		if err != nil {
			return storage.SCN{}, err
		}
		return res.SCN, nil
	}
	for p := range partitions {
		replicas := c.view.Table("d").Partitions[p].Replicas
		head, err := scan(replicas[0], p, 0, 10*time.Second)
		if err != nil {
			t.Fatalf("the master %s of partition %d: %v", replicas[0], p, err)
		}
		for _, id := range replicas[1:] {
			await(t, 20*time.Second, fmt.Sprintf("slave %s of partition %d answering at %s or later", id, p, head), func() bool {
				scn, err := scan(id, p, time.Minute, 50*time.Millisecond)
				return err == nil && !scn.Less(head)
			})
		}
	}
}

// TestOverloadedMasterReads: a master that refuses reads as overloaded
// (its admission full: it did nothing) sends a read that accepts a
// slave's answer to a slave — paid from that slave's hedge budget, so a
// cluster-wide overload cannot double its reads — while a read that
// needs the master gets the 503.
func TestOverloadedMasterReads(t *testing.T) {
	var expired atomic.Uint64
	lim := admission.New(admission.Options{MaxInFlight: 1, MaxQueue: 1, QueueTimeout: time.Millisecond})
	c := startClusterWith(t, clusterOptions{nodes: 3, partitions: 4, replicas: 3,
		lastServer: []grpc.ServerOption{grpc.UnaryInterceptor(admission.UnaryInterceptor(lim, &expired))},
		router:     router.Options{Hedge: router.HedgeOptions{Burst: 5, Floor: 0.001}, Cache: keycache.Options{MaxBytes: -1}}})
	full := "n2"
	d, _ := c.reg.Database("d")
	var onFull []string
	for i := 0; len(onFull) < 4 && i < 1000; i++ {
		k := fmt.Sprintf("o%d", i)
		c.put(k, "v")
		if c.view.Table("d").Partitions[d.PartitionOf(keys.S(k))].Replicas[0] == full {
			onFull = append(onFull, k)
		}
	}
	if len(onFull) == 0 {
		t.Fatalf("%s masters no partition", full)
	}
	awaitReplicasEqual(t, c.view, c.nodes, 4)
	// The test holds the master's only slot: every call it gets is
	// refused as overloaded.
	release, err := lim.Acquire(context.Background(), admission.Interactive)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	read := func(k string, stale bool) int {
		req, _ := http.NewRequest("GET", c.url+"/d/T/"+k, nil)
		if stale {
			req.Header.Set("Cache-Control", "max-stale=60")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := read(onFull[0], false); code != 503 {
		t.Fatalf("a read that needs the overloaded master: %d, want 503", code)
	}
	// Two slave hosts with a bank of 5 each: ten reads answered, then
	// refused as the master refused them.
	served := 0
	for i := range 20 {
		switch code := read(onFull[i%len(onFull)], true); code {
		case 200:
			served++
		case 503:
		default:
			t.Fatalf("read %d: %d", i, code)
		}
	}
	sent, _, denied := c.router.HedgeStats()
	if served != 10 || sent != 10 || denied == 0 {
		t.Fatalf("%d of 20 stale reads served by slaves (%d hedges, %d denied); want the two slaves' budgets of 5", served, sent, denied)
	}
}

// TestStalledNode: a storage node whose answers stop (toxiproxy holds
// them; the connection stays open) is found stalled once calls to it go
// unanswered: the reads waiting on it end as 503 long before their
// deadline, new ones fail at once as never delivered, reads of the other
// nodes' partitions go on, and once answers flow again a probe finds it
// and reads of it succeed.
func TestStalledNode(t *testing.T) {
	proxy, advertise := proxyLast(t)
	c := startClusterWith(t, clusterOptions{nodes: 3, partitions: 4, replicas: 3, advertiseLast: advertise,
		stall: node.StallOptions{Calls: 4, After: 300 * time.Millisecond}})
	onStalled, elsewhere := keysOnLast(t, c)
	read := readTimed(t, c.url)
	if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(`{"name":"hold","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`)); err != nil {
		t.Fatal(err)
	}
	// Eight reads wait on the stalled node; none waits out its deadline.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			code, _, took := read(onStalled[i%len(onStalled)])
			if code != 503 || took > 10*time.Second {
				t.Errorf("a read waiting on the stalled node: %d after %v", code, took)
			}
		})
	}
	// Meanwhile the other nodes answer; then a read of the stalled
	// node fails at once, never delivered.
	await(t, 10*time.Second, "a read of the stalled node to fail at once", func() bool {
		for _, k := range elsewhere {
			if code, _, _ := read(k); code != 200 {
				t.Fatalf("a read of a live node during the stall: %d", code)
			}
		}
		// Until the node counts as stalled this read waits too: it
		// gives up after 300 ms.
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", c.url+"/d/T/"+onStalled[0], nil)
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var p struct{ Title string }
		json.NewDecoder(resp.Body).Decode(&p)
		return resp.StatusCode == 503 && p.Title == "Storage unreachable" && time.Since(start) < 200*time.Millisecond
	})
	wg.Wait()
	if err := proxy.Toxics.RemoveToxic(context.Background(), "hold"); err != nil {
		t.Fatal(err)
	}
	await(t, 10*time.Second, "reads of the node to succeed again", func() bool {
		code, _, _ := read(onStalled[0])
		return code == 200
	})
}

// TestCallsToALeftNodeEnd: a write that hangs on its master (as in the
// fsync of a stalled disk: the node still answers pings, so the stall
// guard rightly leaves the call alone) ends as 503 once the node leaves
// the cluster — the router's table drops it — rather than at its
// deadline, and the partition then takes the write on its new master.
func TestCallsToALeftNodeEnd(t *testing.T) {
	var holding atomic.Bool
	held := make(chan struct{}, 16)
	hold := grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if holding.Load() && strings.HasSuffix(info.FullMethod, "/Write") {
			held <- struct{}{}
			<-ctx.Done() // the caller gave up
			return nil, ctx.Err()
		}
		return h(ctx, req)
	})
	c := startClusterWith(t, clusterOptions{nodes: 3, partitions: 4, replicas: 3, lastServer: []grpc.ServerOption{hold}})
	onLast, _ := keysOnLast(t, c)
	holding.Store(true)
	type outcome struct {
		code int
		body string
		took time.Duration
	}
	// This test's router sets no deadline of its own: the client's is
	// the only one, and it gives up after a minute.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := make(chan outcome, 1)
	go func() {
		start := time.Now()
		req, _ := http.NewRequestWithContext(ctx, "PUT", c.url+"/d/T/"+onLast[0], strings.NewReader(`{"v":"hung"}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- outcome{body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		out <- outcome{resp.StatusCode, string(b), time.Since(start)}
	}()
	<-held
	left := time.Now()
	if err := c.nodes["n2"].member.Leave(); err != nil {
		t.Fatal(err)
	}
	select {
	case o := <-out:
		if o.code != 503 || !strings.Contains(o.body, "left the cluster") {
			t.Fatalf("the write hanging on the node that left: %d %s", o.code, o.body)
		}
		t.Logf("the hanging write ended %v after the node left (%v after it was sent)", time.Since(left).Round(time.Millisecond), o.took.Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("the write hanging on the node that left still waits 30 s after it left")
	}
	c.put(onLast[0], "after")
	if r := c.get(onLast[0], ""); r.StatusCode != 200 || !strings.Contains(r.body, "after") {
		t.Fatalf("after the failover: %d %s", r.StatusCode, r.body)
	}
}

// TestNodeCallBound: a storage node that answers slowly (toxiproxy adds
// latency; it never stops answering, so it is not stalled) holds at most
// MaxCalls of the router's calls: the calls beyond fail at once as 503
// overloaded, not delivered, while the calls within it are answered and
// reads of the other nodes' partitions go on.
func TestNodeCallBound(t *testing.T) {
	proxy, advertise := proxyLast(t)
	c := startClusterWith(t, clusterOptions{nodes: 3, partitions: 4, replicas: 3, advertiseLast: advertise,
		stall: node.StallOptions{Calls: -1, MaxCalls: 3}})
	onSlow, elsewhere := keysOnLast(t, c)
	read := readTimed(t, c.url)
	if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(`{"name":"slow","type":"latency","stream":"downstream","attributes":{"latency":2000}}`)); err != nil {
		t.Fatal(err)
	}
	// Eight reads of the slow node at once: three are its bound.
	type outcome struct {
		code  int
		title string
		took  time.Duration
	}
	out := make(chan outcome, 8)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			code, title, took := read(onSlow[i%len(onSlow)])
			out <- outcome{code, title, took}
		})
	}
	// The refused ones come back at once, long before the slow answers;
	// the other nodes' partitions are read meanwhile.
	for range 5 {
		o := <-out
		if o.code != 503 || o.title != "Storage overloaded" || o.took > time.Second {
			t.Fatalf("a read beyond the slow node's bound: %d %q after %v, want 503 Storage overloaded at once", o.code, o.title, o.took)
		}
	}
	for _, k := range elsewhere {
		if code, _, took := read(k); code != 200 || took > time.Second {
			t.Fatalf("a read of a live node beside the slow one: %d after %v", code, took)
		}
	}
	wg.Wait()
	close(out)
	for o := range out {
		if o.code != 200 || o.took < time.Second {
			t.Fatalf("a read within the slow node's bound: %d after %v, want 200 once it answered", o.code, o.took)
		}
	}
	if err := proxy.Toxics.RemoveToxic(context.Background(), "slow"); err != nil {
		t.Fatal(err)
	}
}

// keysOnLast writes documents of d/T until at least four are in
// partitions the last node (n2, behind the proxy) masters and four in
// others, and waits for every replica to hold them.
func keysOnLast(t *testing.T, c *testCluster) (onLast, elsewhere []string) {
	t.Helper()
	d, _ := c.reg.Database("d")
	for i := 0; (len(onLast) < 4 || len(elsewhere) < 4) && i < 1000; i++ {
		k := fmt.Sprintf("s%d", i)
		c.put(k, "v")
		if c.view.Table("d").Partitions[d.PartitionOf(keys.S(k))].Replicas[0] == "n2" {
			onLast = append(onLast, k)
		} else {
			elsewhere = append(elsewhere, k)
		}
	}
	if len(onLast) == 0 || len(elsewhere) == 0 {
		t.Fatalf("keys on n2: %d, elsewhere: %d", len(onLast), len(elsewhere))
	}
	awaitReplicasEqual(t, c.view, c.nodes, 4)
	return onLast, elsewhere
}

// readTimed returns a read of document k of d/T through the router at
// base: its status, the problem's title and how long it took (a failed
// request is reported and gives status 0). Safe in any goroutine.
func readTimed(t *testing.T, base string) func(k string) (int, string, time.Duration) {
	hc := &http.Client{Timeout: 20 * time.Second}
	return func(k string) (int, string, time.Duration) {
		start := time.Now()
		resp, err := hc.Get(base + "/d/T/" + k)
		if err != nil {
			t.Error(err)
			return 0, "", 0
		}
		defer resp.Body.Close()
		var p struct{ Title string }
		json.NewDecoder(resp.Body).Decode(&p)
		return resp.StatusCode, p.Title, time.Since(start)
	}
}

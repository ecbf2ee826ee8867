package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/cachetier"
	"github.com/cortado-db/cortado/internal/cachetier/redistest"
	"github.com/cortado-db/cortado/internal/keycache"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/problem"
	"github.com/cortado-db/cortado/internal/router"
	"github.com/cortado-db/cortado/internal/routing"
	"github.com/cortado-db/cortado/internal/topo"
)

// startTier gives c's router the cache tier o names, and runs its
// updater (reading through the returned sources) until the test ends.
func startTier(t *testing.T, c *testCluster, o cachetier.Options) (*cachetier.Tier, *gatedSources) {
	t.Helper()
	tier, err := cachetier.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tier.Close)
	c.router.SetTier(tier)
	ctx, cancel := context.WithCancel(c.ctx)
	remotes := &node.Remotes{}
	gated := &gatedSources{ChangeSources: routing.NewChangeSources(c.view, topo.WatchRelays(ctx, c.cli, "/c"), remotes)}
	u := cachetier.NewUpdater(tier, c.reg, gated, slog.New(slog.DiscardHandler))
	done := make(chan struct{})
	go func() { defer close(done); u.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; remotes.Close() })
	return tier, gated
}

// gatedSources are a cache-tier updater's sources whose log reads hang
// while hold is set: an updater that falls behind.
type gatedSources struct {
	*routing.ChangeSources
	hold atomic.Bool
}

func (g *gatedSources) Log(db string, part int) (node.LogSource, error) {
	src, err := g.ChangeSources.Log(db, part)
	if err != nil {
		return nil, err
	}
	return gatedLog{src, g}, nil
}

type gatedLog struct {
	node.LogSource
	g *gatedSources
}

func (l gatedLog) Log(ctx context.Context, req node.LogRequest) (*node.LogResult, error) {
	for l.g.hold.Load() {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return l.LogSource.Log(ctx, req)
}

// refusedNothingDone is RefusedNothingDone of a write's 503 body.
func refusedNothingDone(body []byte) bool {
	var p problem.Problem
	return json.Unmarshal(body, &p) == nil && RefusedNothingDone(p)
}

// TestCacheTierBound runs the Redis cache tier on a three-node cluster
// (semi-sync, two replicas) while writers count up keys and readers read
// them with max-stale=1, the busiest master killed midway: every answer
// the tier gives is at least as new as every write acknowledged more
// than a second before the read began, and is a value some writer wrote
// and was not told failed. Then Redis is killed: reads go on from the
// nodes, at once once the tier is unhealthy, and the tier answers again
// once Redis is back.
func TestCacheTierBound(t *testing.T) {
	const partitions, keysN, bound = 4, 8, time.Second
	srv := redistest.Start(t)
	c := startClusterWith(t, clusterOptions{nodes: 3, partitions: partitions, replicas: 2,
		router: router.Options{Cache: keycache.Options{MaxBytes: -1}}})
	tier, gated := startTier(t, c, cachetier.Options{URL: srv.URL(), FreshEvery: 100 * time.Millisecond, ProbeEvery: 100 * time.Millisecond})

	type write struct {
		v   int
		end time.Time // the acknowledgement was received by then
	}
	var mu sync.Mutex
	acked := map[string][]write{}
	failed := map[string]map[int]string{} // writes the writer was told failed, with the answer
	type read struct {
		k     string
		v     int
		start time.Time
	}
	var fromTier []read
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for v := 1; ; v++ {
				select {
				case <-stop:
					return
				default:
				}
				k := fmt.Sprintf("c%d", w*2+v%2)
				req, _ := http.NewRequest("PUT", c.url+"/d/T/"+k, strings.NewReader(`{"v":"`+strconv.Itoa(v)+`"}`))
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				code, body := 0, []byte(nil)
				if err == nil {
					body, _ = io.ReadAll(resp.Body)
					resp.Body.Close()
					code = resp.StatusCode
				}
				mu.Lock()
				switch {
				case code >= 200 && code < 300:
					acked[k] = append(acked[k], write{v, time.Now()})
				case code >= 400 && code < 500 || code == 503 && refusedNothingDone(body):
					if failed[k] == nil {
						failed[k] = map[int]string{}
					}
					failed[k][v] = fmt.Sprintf("%d %s", code, body)
				}
				mu.Unlock()
			}
		}()
	}
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				k := fmt.Sprintf("c%d", rand.IntN(keysN))
				start := time.Now()
				req, _ := http.NewRequest("GET", c.url+"/d/T/"+k, nil)
				req.Header.Set("Cache-Control", "max-stale=1")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					continue
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || resp.Header.Get(router.HeaderCache) != "redis" {
					continue
				}
				var v int
				if _, err := fmt.Sscanf(string(body), `{"v":"%d"}`, &v); err != nil {
					t.Errorf("tier answer %s", body)
					continue
				}
				mu.Lock()
				fromTier = append(fromTier, read{k, v, start})
				mu.Unlock()
			}
		}()
	}
	// Let the tier fill and serve, then fail the busiest master over.
	awaitTier := func(what string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			mu.Lock()
			n := len(fromTier)
			mu.Unlock()
			if n >= 200 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the tier answered %d reads in 30 s", what, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	awaitTier("before the failover")
	victim := busiestMaster(c.view.Table("d"))
	c.nodes[victim].kill()
	delete(c.nodes, victim)
	mu.Lock()
	fromTier = fromTier[:0:0]
	mu.Unlock()
	awaitTier("after the failover")
	// The updater stalls (its log reads hang) while the writers go on:
	// within a second the tier stops answering.
	gated.hold.Store(true)
	time.Sleep(2 * bound) // the stall itself: reads meanwhile are checked below
	tooOld := func() uint64 { _, _, n, _, _ := tier.Stats(); return n }
	if tooOld() == 0 {
		t.Fatal("the tier answered every read while its updater was stalled")
	}
	gated.hold.Store(false)
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	checked := 0
	for _, r := range fromTier {
		// The newest write acknowledged more than the bound before the
		// read began.
		floor := 0
		for _, w := range acked[r.k] {
			if w.end.Before(r.start.Add(-bound)) {
				floor = max(floor, w.v)
			}
		}
		if r.v < floor {
			t.Errorf("%s: the tier answered %d; %d was acknowledged more than %v before the read", r.k, r.v, floor, bound)
		}
		if answer, ok := failed[r.k][r.v]; ok {
			t.Errorf("%s: the tier answered %d, a write its writer was told failed: %s", r.k, r.v, answer)
		}
		checked++
	}
	t.Logf("%d answers from the tier checked against the acknowledged writes", checked)

	// Redis dies: reads go on from the nodes.
	srv.Kill()
	for i := range 10 {
		start := time.Now()
		r := c.get("c0", "max-stale=1")
		if r.StatusCode != 200 || r.Header.Get(router.HeaderCache) == "redis" {
			t.Fatalf("read %d with Redis dead: %d %s", i, r.StatusCode, r.body)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("read %d with Redis dead took %v", i, took)
		}
	}
	if tier.Healthy() {
		t.Fatal("the tier is healthy with Redis dead")
	}
	// Back, empty: the updater loads every partition again. A write
	// after it: a partition whose newest commit is one the writers were
	// not told was acknowledged (refused as not replicated while a
	// replica was being replaced) misses the tier until a later commit
	// is acknowledged.
	srv.Restart()
	c.put("c0", "100000")
	deadline := time.Now().Add(30 * time.Second)
	for r := c.get("c0", "max-stale=1"); r.Header.Get(router.HeaderCache) != "redis" || r.body != `{"v":"100000"}`; r = c.get("c0", "max-stale=1") {
		if time.Now().After(deadline) {
			h, m, o, f, s := tier.Stats()
			t.Fatalf("the tier did not answer within 30 s of Redis coming back: %d %d %d %d %d", h, m, o, f, s)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCacheTierServe runs `cortado serve` (one node, which masters every
// partition alone: a commit is acknowledged once durable) with the tier
// and no hot-key cache: a document written is soon read from Redis, an
// update replaces it there, a delete leaves a tombstone the read does
// not answer from, and a read that does not accept staleness never
// reaches Redis.
func TestCacheTierServe(t *testing.T) {
	redis := redistest.Start(t)
	s := StartServe(t, ServeOptions{Args: []string{"--demo", "--router-cache-bytes", "-1", "--redis-url", redis.URL()}})
	h := tierClient{t, s.URL}
	// awaitRead reads the document with max-stale=5 until Redis answers
	// with want.
	awaitRead := func(want string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			r := h.get("/demo/MailboxStats/alice", "Cache-Control", "max-stale=5")
			if r.status == 200 && r.header.Get(router.HeaderCache) == "redis" && r.body == want && r.header.Get("Age") != "" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no read of %s from the tier in 20 s; last: %d %q %v", want, r.status, r.body, r.header)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	start := time.Now()
	h.put("/demo/MailboxStats/alice", `{"total":1}`)
	awaitRead(`{"total":1,"unread":0}`)
	t.Logf("first read from the tier %v after the write", time.Since(start))
	node := h.get("/demo/MailboxStats/alice")
	if node.header.Get(router.HeaderCache) != "" || node.header.Get("Age") != "" {
		t.Fatalf("a read without max-stale answered from a cache: %v", node.header)
	}
	// The tier's answer is the node's: body, tag, time and SCN, and
	// projected the node's way.
	tier := h.get("/demo/MailboxStats/alice", "Cache-Control", "max-stale=5")
	for _, name := range []string{"Etag", "Last-Modified", "X-Cortado-Scn", "X-Cortado-Schema-Version", "Content-Type"} {
		if tier.header.Get(name) != node.header.Get(name) {
			t.Errorf("%s: the tier's %q, the node's %q", name, tier.header.Get(name), node.header.Get(name))
		}
	}
	pn := h.get("/demo/MailboxStats/alice?fields=total")
	pt := h.get("/demo/MailboxStats/alice?fields=total", "Cache-Control", "max-stale=5")
	if pt.header.Get(router.HeaderCache) != "redis" || pt.body != pn.body || pt.header.Get("Etag") != pn.header.Get("Etag") {
		t.Errorf("projected: the tier answered %q %s (%s), the node %q %s", pt.body, pt.header.Get("Etag"), pt.header.Get(router.HeaderCache), pn.body, pn.header.Get("Etag"))
	}
	h.put("/demo/MailboxStats/alice", `{"total":2}`)
	awaitRead(`{"total":2,"unread":0}`)
	h.do("DELETE", "/demo/MailboxStats/alice", "")
	for range 20 {
		if r := h.get("/demo/MailboxStats/alice", "Cache-Control", "max-stale=5"); r.status != 404 && r.header.Get(router.HeaderCache) == "redis" {
			// The tombstone may take a moment; what the tier answers
			// meanwhile is the value before the delete, never another.
			if r.body != `{"total":2,"unread":0}` {
				t.Fatalf("after the delete the tier answered %q", r.body)
			}
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for h.get("/demo/MailboxStats/alice", "Cache-Control", "max-stale=5").status != 404 {
		if time.Now().After(deadline) {
			t.Fatal("a deleted document was still read 20 s after its delete")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tierClient sends requests to one server for the tier's tests.
type tierClient struct {
	t   *testing.T
	url string
}

type tierAnswer struct {
	status int
	body   string
	header http.Header
}

// do sends method path with body (JSON) and headers (name, value pairs).
func (c tierClient) do(method, path, body string, headers ...string) tierAnswer {
	c.t.Helper()
	req, _ := http.NewRequest(method, c.url+path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return tierAnswer{resp.StatusCode, string(b), resp.Header}
}

func (c tierClient) get(path string, headers ...string) tierAnswer {
	c.t.Helper()
	return c.do("GET", path, "", headers...)
}

func (c tierClient) put(path, body string) {
	c.t.Helper()
	if r := c.do("PUT", path, body); r.status >= 300 {
		c.t.Fatalf("PUT %s: %d %s", path, r.status, r.body)
	}
}

// TestCacheTierAfterFailover: a write acknowledged while the updater was
// stalled, then its master killed before the updater read it. The tier
// must not answer the value before the write once the bound has passed
// (the updater counts its freshness from the new master's newest
// commit, which holds the write), and answers again after the new
// master's next write. (The fault run's kill-two found the tier
// answering a write behind when the updater counted from the new
// master's acknowledged watermark instead; this test passes with that
// rule too, its window being shorter than the failover here.)
func TestCacheTierAfterFailover(t *testing.T) {
	srv := redistest.Start(t)
	c := startClusterWith(t, clusterOptions{nodes: 3, partitions: 1, replicas: 3,
		router: router.Options{Cache: keycache.Options{MaxBytes: -1}}})
	_, gated := startTier(t, c, cachetier.Options{URL: srv.URL(), FreshEvery: 50 * time.Millisecond})

	c.put("k", "one")
	fromTier := func() response {
		return c.get("k", "max-stale=1")
	}
	deadline := time.Now().Add(20 * time.Second)
	for r := fromTier(); r.Header.Get(router.HeaderCache) != "redis" || r.body != `{"v":"one"}`; r = fromTier() {
		if time.Now().After(deadline) {
			t.Fatalf("the tier did not answer within 20 s: %d %s", r.StatusCode, r.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	gated.hold.Store(true)
	c.put("k", "two")
	acked := time.Now()
	victim := busiestMaster(c.view.Table("d"))
	c.nodes[victim].kill()
	delete(c.nodes, victim)
	gated.hold.Store(false)
	// Until the bound has passed since "two" was acknowledged, "one" is
	// an answer within it; after, never.
	for time.Since(acked) < 5*time.Second {
		start := time.Now()
		r := fromTier()
		if r.Header.Get(router.HeaderCache) == "redis" && r.body != `{"v":"two"}` && start.Sub(acked) > time.Second {
			t.Fatalf("%v after \"two\" was acknowledged the tier answered %s (Age %s)", start.Sub(acked).Round(time.Millisecond), r.body, r.Header.Get("Age"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The next write through the new master: the tier answers again.
	c.put("k", "three")
	deadline = time.Now().Add(20 * time.Second)
	for r := fromTier(); r.Header.Get(router.HeaderCache) != "redis" || r.body != `{"v":"three"}`; r = fromTier() {
		if time.Now().After(deadline) {
			t.Fatalf("the tier did not answer after the failover within 20 s: %d %s", r.StatusCode, r.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cortado-db/cortado/client"
	"github.com/cortado-db/cortado/internal/changes"
	"github.com/cortado-db/cortado/internal/storage"
)

// consumer follows database d's change stream through a router the way a
// downstream system would: it disconnects after a random number of
// events (up to maxRun: a snapshot cut off midway starts over, so one
// that always left within fewer rows than a partition holds would never
// get past it) and resumes from the last token; it undoes what a rollback
// event names and starts a partition over at a snapshot (ChangeLog). It
// checks that each partition's changes come in commit order and never
// twice.
type consumer struct {
	t      *testing.T
	cl     *client.Client
	rand   *rand.Rand
	maxRun int

	mu sync.Mutex
	*ChangeLog
	resumes int
	lastErr string
}

func newConsumer(t *testing.T, url, since string, seed uint64, maxRun int) *consumer {
	return &consumer{t: t, cl: client.New(url), rand: rand.New(rand.NewPCG(seed, 1)), maxRun: maxRun, ChangeLog: NewChangeLog(since)}
}

// startConsumer starts a consumer (newConsumer) running until the test
// ends.
func startConsumer(t *testing.T, url, since string, seed uint64, maxRun int) *consumer {
	cons := newConsumer(t, url, since, seed, maxRun)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); cons.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return cons
}

func (c *consumer) run(ctx context.Context) {
	for ctx.Err() == nil {
		n := 1 + c.rand.IntN(c.maxRun)
		c.mu.Lock()
		since := c.Token
		c.resumes++
		c.mu.Unlock()
		for e, err := range c.cl.Changes(ctx, "d", &client.ChangeOptions{Since: since, Heartbeat: 200 * time.Millisecond}) {
			if err != nil {
				c.mu.Lock()
				c.lastErr = err.Error()
				c.mu.Unlock()
				time.Sleep(50 * time.Millisecond)
				break
			}
			c.mu.Lock()
			c.Apply(e)
			c.mu.Unlock()
			if n--; n == 0 {
				break
			}
		}
	}
}

// state replays what the consumer applied of table T: key → value.
func (c *consumer) state() map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]string{}
	for k, doc := range c.State() {
		var d struct{ V string }
		json.Unmarshal(doc, &d)
		out[strings.TrimPrefix(k, "T/")] = d.V
	}
	return out
}

// awaitEqual waits until the consumer's state holds every acknowledged
// write and equals what the router reads, then checks it saw no change
// twice or out of order.
func (c *consumer) awaitEqual(router string, acked map[string]string) {
	t := c.t
	t.Helper()
	var why string
	deadline := time.Now().Add(60 * time.Second)
	for !func() bool {
		st := c.state()
		for k, v := range acked {
			if st[k] != v {
				why = fmt.Sprintf("acknowledged %s=%s, consumer has %q", k, v, st[k])
				return false
			}
		}
		for k, v := range st {
			if _, ok := acked[k]; ok {
				continue
			}
			// Committed but not acknowledged (cut by a failover): the
			// database decides.
			resp, err := http.Get(router + "/d/T/" + k)
			if err != nil {
				return false
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(b) != `{"v":"`+v+`"}` {
				why = fmt.Sprintf("consumer has %s=%s, the database %d %s", k, v, resp.StatusCode, b)
				return false
			}
		}
		return true
	}() {
		if time.Now().After(deadline) {
			c.mu.Lock()
			msg := fmt.Sprintf("the consumer (token %s, %d resumes, last error %q, rollbacks %v, %d snapshots, %d problems %v) does not match the database: %s",
				c.Token, c.resumes, c.lastErr, c.Rollbacks, c.Snapshots, len(c.Problems), c.Problems[:min(3, len(c.Problems))], why)
			c.mu.Unlock()
			t.Fatal(msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.mu.Lock()
	problems := slices.Clone(c.Problems)
	c.mu.Unlock()
	if len(problems) > 0 {
		t.Fatalf("change stream: %d problems, first: %v", len(problems), problems[:min(5, len(problems))])
	}
}

// TestChangeStreamThroughFailover consumes the change stream of a
// three-node cluster with two relays through its router, disconnecting at
// random points and resuming from its token, while writers write, a relay
// is killed -9 (reads move to the other) and restarted, and the busiest
// master is killed -9 (and rejoins). Every acknowledged write reaches the
// consumer, no change arrives twice or out of commit order, and the
// consumer's state ends equal to the database; the replicas end on one
// timeline.
func TestChangeStreamThroughFailover(t *testing.T) {
	c := startProcCluster(t, 3, 4)
	second := StartRole(t, "relay", "--etcd-endpoints", c.cli.Endpoints()[0], "--relay-id", "second", "--lease-ttl", "2")
	cons := startConsumer(t, c.router.URL, "beginning", 1, 40)

	w := c.startWriters(3)
	awaitWrites(t, w, 100)
	c.relay.Kill()
	awaitWrites(t, w, 50)
	c.relay.Restart()
	awaitWrites(t, w, 50)
	victim := c.busiestMaster()
	c.storage[victim].Kill()
	c.awaitMastersOff(victim)
	awaitWrites(t, w, 100)
	c.storage[victim].Restart()
	c.awaitHosting(victim)
	awaitWrites(t, w, 50)
	acked := w.finish(t)
	cons.awaitEqual(c.router.URL, acked)
	if metric(t, second.URL, "cortado_relay_pulled_commits_total") == 0 {
		t.Fatal("the second relay pulled nothing")
	}
	t.Logf("%d writes acknowledged; the consumer resumed %d times, saw rollbacks %v", len(acked), cons.resumes, cons.Rollbacks)
	c.verify(acked)
}

// TestChangeStreamRetention trims the logs of a database that keeps one
// second of them, while a storage node is down (the live slaves pin their
// masters' logs, and are never rebuilt): a consumer holding a
// token older than the log gets a snapshot followed by the changes after
// it, in one stream; a token naming a generation the partition never had
// gets a rollback event, then the same; and the node coming back is
// rebuilt from its master's snapshot and ends on the master's timeline.
func TestChangeStreamRetention(t *testing.T) {
	fast := []string{"--retention-interval", "200ms"}
	// The relay keeps 5 commits per partition: readers behind them go to
	// the masters, whose logs hold one second.
	c := startProcClusterWith(t, 3, 4, map[string][]string{"s0": fast, "s1": fast, "s2": fast, "relay": {"--buffer", "5"},
		"db": {`{"partitions":4,"replicas":3,"retention":{"maxAge":"1s","maxSlaveLag":"1m"}}`}})
	// A token from before any write.
	var old string
	for e, err := range client.New(c.router.URL).Changes(context.Background(), "d", &client.ChangeOptions{Since: "now"}) {
		if err != nil {
			t.Fatal(err)
		}
		if tok, _ := changes.ParseToken("d", 4, e.Token); len(tok) == 4 {
			old = e.Token
			break
		}
	}
	c.storage["s2"].Kill()
	w := c.startWriters(3)
	awaitWrites(t, w, 200)
	await(t, 30*time.Second, "the masters to trim their logs", func() bool {
		return metric(t, c.storage["s0"].URL, "cortado_log_trimmed_bytes_total") > 0 &&
			metric(t, c.storage["s1"].URL, "cortado_log_trimmed_bytes_total") > 0
	})
	// A consumer from before the retained log.
	fromOld := newConsumer(t, c.router.URL, old, 2, 600)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { fromOld.run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	awaitWrites(t, w, 100)
	c.storage["s2"].Restart()
	await(t, 30*time.Second, "the returning node to be rebuilt from a snapshot", func() bool {
		return metric(t, c.storage["s2"].URL, "cortado_replica_rebuilt_total") > 0
	})
	awaitWrites(t, w, 100)
	acked := w.finish(t)
	// The live slaves pinned their masters' logs: none was rebuilt.
	for _, id := range []string{"s0", "s1"} {
		if n := metric(t, c.storage[id].URL, "cortado_replica_rebuilt_total"); n != 0 {
			t.Fatalf("%s, a live slave, was rebuilt %v times: its master trimmed what it had not applied", id, n)
		}
	}
	fromOld.awaitEqual(c.router.URL, acked)
	if fromOld.Snapshots == 0 {
		t.Fatal("a token older than the retained log got no snapshot")
	}

	// A consumer in the same state whose token says it saw commits of a
	// generation the partitions never had (as if lost in a failover): it
	// is told to roll back to where its history and the partitions' meet,
	// then follows on.
	fromBogus := newConsumer(t, c.router.URL, "", 3, 600)
	fromOld.mu.Lock()
	bogus := changes.Token{}
	for p, recs := range fromOld.Parts {
		fromBogus.Parts[p] = slices.Clone(recs)
		bogus[p] = changes.Position{SCN: storage.SCN{Gen: 999, Seq: 5}}
	}
	fromOld.mu.Unlock()
	fromBogus.Token = bogus.Encode("d")
	wg.Go(func() { fromBogus.run(ctx) })
	w = c.startWriters(1)
	awaitWrites(t, w, 20)
	maps.Copy(acked, w.finish(t))
	fromOld.awaitEqual(c.router.URL, acked)
	fromBogus.awaitEqual(c.router.URL, acked)
	if len(fromBogus.Rollbacks) != 4 {
		t.Fatalf("rollbacks for a token from another timeline: %v", fromBogus.Rollbacks)
	}
	t.Logf("%d writes; %d snapshots from the old token; rollbacks %v", len(acked), fromOld.Snapshots, fromBogus.Rollbacks)
	c.verify(acked)
}

// TestChangeStreamSnapshotOutlastsRetention: a consumer whose snapshots
// take longer than the database keeps its log (one second: the masters
// stream snapshots at 1 MiB/s, and each partition holds about 3 MiB)
// gets one snapshot of each partition and then the changes after it. A
// master keeps its log after the SCN of a snapshot it streams, while it
// streams and for a minute after, so the reader goes on from there; with
// a log trimmed past it, it would take another snapshot, and another.
func TestChangeStreamSnapshotOutlastsRetention(t *testing.T) {
	slow := []string{"--retention-interval", "200ms", "--snapshot-rate", "1048576"}
	// The relay keeps 5 commits per partition: readers behind them go to
	// the masters.
	c := startProcClusterWith(t, 3, 4, map[string][]string{"s0": slow, "s1": slow, "s2": slow, "relay": {"--buffer", "5"},
		"db": {`{"partitions":4,"replicas":3,"retention":{"maxAge":"1s","maxSlaveLag":"1m"}}`}})
	big := map[string]string{}
	hc := &http.Client{Timeout: 10 * time.Second}
	for i := range 400 {
		k, v := fmt.Sprint("big", i), strings.Repeat(fmt.Sprint(i%10), 32<<10)
		req, _ := http.NewRequest("PUT", c.router.URL+"/d/T/"+k, strings.NewReader(`{"v":"`+v+`"}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode >= 300 {
			t.Fatalf("PUT %s: %s", k, resp.Status)
		}
		big[k] = v
	}
	w := c.startWriters(3)
	awaitWrites(t, w, 100)
	await(t, 30*time.Second, "the masters to trim their logs", func() bool {
		for _, s := range c.storage {
			if metric(t, s.URL, "cortado_log_trimmed_bytes_total") == 0 {
				return false
			}
		}
		return true
	})
	// From the beginning, which the logs no longer hold.
	cons := startConsumer(t, c.router.URL, "beginning", 4, 1<<30)
	awaitWrites(t, w, 300)
	acked := w.finish(t)
	maps.Copy(acked, big)
	cons.awaitEqual(c.router.URL, acked)
	cons.mu.Lock()
	snapshots, resumes := maps.Clone(cons.SnapshotsOf), cons.resumes
	cons.mu.Unlock()
	if len(snapshots) == 0 || resumes != 1 {
		t.Fatalf("snapshots by partition %v in %d stream(s), want some in one stream", snapshots, resumes)
	}
	for p, n := range snapshots {
		if n != 1 {
			t.Fatalf("partition %d: %d snapshots (by partition: %v): a reader found the log trimmed past its snapshot", p, n, snapshots)
		}
	}
	t.Logf("snapshots by partition: %v", snapshots)
}

// TestChangeStreamShowsOnlyAcknowledgedChanges: a change stream sends
// only changes acknowledged to their writers, so no failover takes back
// what a consumer was told. Both slaves of the only partition are
// paused, so a write commits on the master alone (its writer is told
// 503, outcome unknown). Neither a consumer reading along nor one that
// starts "now" is shown it: the latter starts at the newest
// acknowledged commit. The relay and the master are then killed -9, so
// no replica has the write, the slaves resume and one takes over. Both
// consumers must end equal to the database, with every acknowledged
// write, never having seen the discarded one and with no rollback.
// (Before the stream held back what was not acknowledged, the first
// consumer got the write and then a rollback, and the second one a
// rollback: its "now" was past what the new master holds.)
func TestChangeStreamShowsOnlyAcknowledgedChanges(t *testing.T) {
	c := startProcCluster(t, 3, 1)
	acked := map[string]string{}
	for i := range 5 {
		k := fmt.Sprintf("k%d", i)
		await(t, 30*time.Second, "a first write", func() bool { st, _ := c.put(k, "1", "5s"); return st == 201 || st == 200 })
		acked[k] = "1"
	}
	// Both slaves must read through the relay: what the master sent
	// into a paused slave's socket would be applied on its resumption.
	c.awaitSlavesOnRelay(acked)
	along := startConsumer(t, c.router.URL, "beginning", 1, 1<<20)
	await(t, 30*time.Second, "the consumer to hold the first writes", func() bool { return along.state()["k4"] == "1" })
	along.mu.Lock()
	lastAcked := along.Parts[0][len(along.Parts[0])-1].SCN
	along.mu.Unlock()

	route := c.table().Partitions[0]
	master, slaves := route.Replicas[0], route.Replicas[1:]
	for _, s := range slaves {
		c.storage[s].Pause()
	}
	// Nothing the relay holds may reach them: what the relay had sent
	// into a paused slave's socket would be applied on its resumption.
	c.relayProxy.Stop()
	// Its outcome is unknown to the writer: not confirmed by a replica
	// in time, or its deadline passed first.
	if st, body := c.put("phantom", "x", "2s"); st != 503 || !strings.Contains(body, "not-replicated") && !strings.Contains(body, "deadline-exceeded") {
		t.Fatalf("a write with both slaves paused: %d %s, want 503 not-replicated or deadline-exceeded", st, body)
	}
	// "now" is the newest acknowledged commit, not the master's head.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var now *client.ChangeEvent
	for e, err := range client.New(c.router.URL).Changes(ctx, "d", &client.ChangeOptions{Since: "now"}) {
		if err != nil {
			t.Fatalf("a stream from now: %v", err)
		}
		now = e
		break
	}
	if now == nil || now.Type != "resolved" || now.Source.SCN != lastAcked.String() {
		t.Fatalf("a stream from now, the newest acknowledged commit %v: first event %+v", lastAcked, now)
	}
	fromNow := startConsumer(t, c.router.URL, now.Token, 2, 1<<20)

	c.relay.Kill()
	c.storage[master].Kill()
	for _, s := range slaves {
		c.storage[s].Resume()
	}
	c.awaitMastersOff(master)
	await(t, 60*time.Second, "a write to the new master", func() bool { st, _ := c.put("after", "2", "5s"); return st == 201 || st == 200 })
	acked["after"] = "2"
	if err := c.relayProxy.Start(); err != nil {
		t.Fatal(err)
	}
	c.relay.Restart()
	c.storage[master].Restart()
	c.awaitHosting(master)
	along.awaitEqual(c.router.URL, acked)
	await(t, 60*time.Second, "the consumer from now to get the write after the failover", func() bool { return fromNow.state()["after"] == "2" })
	for name, cons := range map[string]*consumer{"along": along, "from now": fromNow} {
		cons.mu.Lock()
		rollbacks, parts := slices.Clone(cons.Rollbacks), cons.Parts[0]
		cons.mu.Unlock()
		if len(rollbacks) > 0 {
			t.Errorf("consumer %s got rollbacks %v", name, rollbacks)
		}
		for _, ch := range parts {
			if ch.Key == "T/phantom" {
				t.Errorf("consumer %s was shown the write no replica confirmed, at %v", name, ch.SCN)
			}
		}
	}
	if st := fromNow.state(); len(st) != 1 {
		t.Errorf("the consumer from now holds %v, want only the write after the failover", st)
	}
	c.verify(acked)
}

// A router's change stream leaves a relay that falls silent while the
// master moves on, as a slave does, rather than after 5 s of missed
// heartbeats.
func TestChangeStreamLeavesSilentRelay(t *testing.T) {
	c := startProcCluster(t, 3, 1)
	acked := map[string]string{}
	await(t, 30*time.Second, "a first write", func() bool { st, _ := c.put("first", "1", "5s"); return st == 201 || st == 200 })
	acked["first"] = "1"
	c.awaitSlavesOnRelay(acked)
	cons := startConsumer(t, c.router.URL, "beginning", 1, 1<<20)
	await(t, 30*time.Second, "the consumer to hold the first write", func() bool { return cons.state()["first"] == "1" })
	left := func(reason string) float64 {
		return metric(t, c.router.URL, `cortado_changes_relay_left_total{reason="`+reason+`"}`)
	}
	if n := left("behind") + left("failed"); n != 0 {
		t.Fatalf("the stream left the relay %v times before it was cut", n)
	}
	if err := Cut(c.relayProxy); err != nil {
		t.Fatal(err)
	}
	if st, body := c.put("cut", "1", "30s"); st != 201 && st != 200 {
		t.Fatalf("a write with the relay cut off: %d %s", st, body)
	}
	acked["cut"] = "1"
	await(t, 30*time.Second, "the consumer to get the write made with the relay cut off", func() bool { return cons.state()["cut"] == "1" })
	if behind, failed := left("behind"), left("failed"); behind == 0 {
		t.Fatalf("the stream left the silent relay %v times as behind, %v as failed: want behind", behind, failed)
	}
	if err := Mend(c.relayProxy); err != nil {
		t.Fatal(err)
	}
	cons.awaitEqual(c.router.URL, acked)
	c.verify(acked)
}

package clustertest

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cortado-db/cortado/client"
	"github.com/cortado-db/cortado/internal/changes"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
)

// masterSources serves a stream's partition from whichever node is its
// master now, as a router's sources follow the routing table, and
// counts the snapshots asked and the rows they streamed.
type masterSources struct {
	master atomic.Pointer[node.Remote]
	asked  atomic.Int64 // snapshots asked
	ended  atomic.Int64 // snapshots ended, streamed whole or failed
	rows   atomic.Int64 // rows streamed
}

func (s *masterSources) Log(string, int) (node.LogSource, error) { return s.master.Load(), nil }

func (s *masterSources) Snapshot(string, int) (node.Snapshotter, error) {
	return countingSnapshots{s}, nil
}

type countingSnapshots struct{ s *masterSources }

func (c countingSnapshots) Snapshot(ctx context.Context, req node.SnapshotRequest, fn func(*node.SnapshotChunk) error) error {
	c.s.asked.Add(1)
	defer c.s.ended.Add(1)
	return c.s.master.Load().Snapshot(ctx, req, func(ch *node.SnapshotChunk) error {
		c.s.rows.Add(int64(len(ch.Rows)))
		return fn(ch)
	})
}

// TestChangeStreamSnapshotHoldsOnlyReplicated: a consumer whose position
// the log no longer holds gets a snapshot of the master while the master
// holds a commit no replica has (its writer was told not-replicated), and
// a failover then discards that commit. The snapshot's rows are state at
// the snapshot's SCN: had it held the commit, the rollback the consumer
// then gets would name an SCN before the snapshot's, and undoing the
// snapshot would drop acknowledged documents with the discarded one. The
// snapshot must wait for the replicas instead, and the consumer end with
// every acknowledged document and without the discarded one.
func TestChangeStreamSnapshotHoldsOnlyReplicated(t *testing.T) {
	ctx := context.Background()
	reg, a, b := semiSyncPair(t)
	var truncated int
	stopB := follow(t, b, remote(t, a.url), &truncated)
	write(t, a, "k1", "acked")
	write(t, a, "k2", "acked")
	stopB()

	// The log is trimmed as far as retention may (the acknowledged
	// watermark): a stream from the beginning starts with a snapshot.
	p, err := a.eng.Partition("d", 0)
	if err != nil {
		t.Fatal(err)
	}
	point, err := p.TrimPoint(storage.RetentionPolicy{MaxBytes: 1})
	if err != nil || point.IsZero() {
		t.Fatalf("trim point %s, %v; want the acknowledged watermark", point, err)
	}
	if _, err := p.Trim(point); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write(ctx, writeReq(t, "phantom")); !errors.Is(err, node.ErrNotReplicated) {
		t.Fatalf("a write no slave applied: %v, want ErrNotReplicated", err)
	}

	src := &masterSources{}
	src.master.Store(remote(t, a.url))
	feed := &changes.Feed{Reg: reg, Plans: schema.NewPlans(64), Sources: src, Logger: slog.New(slog.DiscardHandler)}
	consumer := consume(t, feed, changes.Request{DB: "d", Since: changes.SinceBeginning})
	await(t, 10*time.Second, "a snapshot of the master to end", func() bool { return src.ended.Load() >= 1 })
	if n := src.rows.Load(); n != 0 {
		t.Fatalf("a snapshot streamed %d rows while its master held a commit no replica had; want none until the replicas hold it", n)
	}

	// Failover: a is cut off and fenced; b, which never had the
	// phantom, becomes master of generation 2 with c as its slave.
	a.api.Abort()
	a.SetRole("d", 0, node.Slave, 0, 0)
	if err := b.SetRole("d", 0, node.Master, 2, 0); err != nil {
		t.Fatal(err)
	}
	b.SetSlaves("d", 0, []string{"follower", "x"})
	c := newStorageNodeWith(t, reg, node.Options{})
	c.SetRole("d", 0, node.Slave, 0, 0)
	stopC := follow(t, c, remote(t, b.url), &truncated)
	defer stopC()
	write(t, b, "k4", "acked")
	src.master.Store(remote(t, b.url))

	want := map[string]string{"T/k1": `{"v":"acked"}`, "T/k2": `{"v":"acked"}`, "T/k4": `{"v":"acked"}`}
	await(t, 30*time.Second, "the consumer to get the new master's write", func() bool { _, ok := consumer.state()["T/k4"]; return ok })
	got := consumer.state()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("the consumer holds %s = %q, want %q (acknowledged)", k, got[k], v)
		}
	}
	if _, ok := got["T/phantom"]; ok {
		t.Error("the consumer holds the write the failover discarded")
	}
	consumer.mu.Lock()
	defer consumer.mu.Unlock()
	if len(consumer.Problems) > 0 {
		t.Errorf("events repeated or out of order: %v", consumer.Problems)
	}
	t.Logf("snapshots asked %d, rows streamed %d; the consumer's rollbacks %v, snapshots %d, state %v", src.asked.Load(), src.rows.Load(), consumer.Rollbacks, consumer.Snapshots, got)
}

// feedConsumer is a consumer of a change stream served in this process
// (changes.Feed, without a router): its books and their lock.
type feedConsumer struct {
	mu sync.Mutex
	*ChangeLog
}

// consume opens req on feed and applies its events to a consumer's books
// until the test ends.
func consume(t *testing.T, feed *changes.Feed, req changes.Request) *feedConsumer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := feed.Open(ctx, req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	c := &feedConsumer{ChangeLog: NewChangeLog("")}
	done := make(chan struct{})
	go func() {
		defer close(done)
		stream.Run(ctx, func(e changes.Event) error {
			var ev client.ChangeEvent
			if err := json.Unmarshal(e.JSON, &ev); err != nil {
				return err
			}
			ev.Token = e.Token
			c.mu.Lock()
			c.Apply(&ev)
			c.mu.Unlock()
			return nil
		}, func() error { return nil })
	}()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// state is what the consumer applied: table/key → the document's JSON.
func (c *feedConsumer) state() map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]string{}
	for k, v := range c.State() {
		out[k] = string(v)
	}
	return out
}

// logSources serves every partition's log from one source, and no
// snapshot.
type logSources struct{ log node.LogSource }

func (s logSources) Log(string, int) (node.LogSource, error) { return s.log, nil }

func (s logSources) Snapshot(string, int) (node.Snapshotter, error) {
	return nil, errors.New("no snapshots in this test")
}

// earlierRelease is a log source of a release before acknowledged-only
// reads: it does not know the request's fields, so it sends every
// commit and says nothing of them.
type earlierRelease struct{ node.LogSource }

func (e earlierRelease) Log(ctx context.Context, req node.LogRequest) (*node.LogResult, error) {
	req.AckedOnly, req.WatchAcked = false, false
	res, err := e.LogSource.Log(ctx, req)
	if res != nil {
		res.AckedOnly = false
	}
	return res, err
}

// TestChangeStreamOfAnEarlierRelease: a change stream reads only
// acknowledged commits from a source that honours the request, and, as
// before, every commit from a source of an earlier release, which does
// not know it. Replicas 3, minInSync 3: "old" is acknowledged, "new"
// held by one slave only. Once the third replica holds "new", the
// stream from the current source sends it too.
func TestChangeStreamOfAnEarlierRelease(t *testing.T) {
	r := thirdUnacked(t)
	src := remote(t, r.a.url)
	feed := func(s node.LogSource) *changes.Feed {
		return &changes.Feed{Reg: r.reg, Plans: schema.NewPlans(64), Sources: logSources{s}, Logger: slog.New(slog.DiscardHandler)}
	}
	current := consume(t, feed(src), changes.Request{DB: "d", Since: changes.SinceBeginning})
	earlier := consume(t, feed(earlierRelease{src}), changes.Request{DB: "d", Since: changes.SinceBeginning})
	await(t, 10*time.Second, "the stream of the earlier release to send the unacknowledged write", func() bool { return earlier.state()["T/new"] != "" })
	// Both writes were in the log before the streams began: the first
	// answer of a source that sent every commit would hold both.
	await(t, 10*time.Second, "the current stream to get the acknowledged write", func() bool { return current.state()["T/old"] != "" })
	if _, ok := current.state()["T/new"]; ok {
		t.Fatalf("the current stream sent %v, which only two of three replicas hold", r.unacked)
	}
	r.ackC(r.unacked)
	await(t, 10*time.Second, "the current stream to send the write once acknowledged", func() bool { return current.state()["T/new"] != "" })
}

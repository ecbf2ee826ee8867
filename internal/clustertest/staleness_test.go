package clustertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
)

// TestSlaveStalenessCountsFromItsMaster: a slave's staleness counts, on
// its own clock, from the last time it is known to have held all its
// master had — known by asking the master (its acknowledgements answer
// with the master's head), not from its source's last answer: a relay cut
// off from the master still answers, with nothing new, and an answer
// applied late (a slave paused, or its disk stalled, with answers
// waiting) was made long before. Over the internal protocol, as between
// processes.
func TestSlaveStalenessCountsFromItsMaster(t *testing.T) {
	for _, late := range []bool{false, true} {
		name := "a relay cut off from its master"
		if late {
			name = "an answer applied late"
		}
		t.Run(name, func(t *testing.T) {
			a, master, slaves := onePartition(t, 2)
			b, c := slaves[0], slaves[1]
			gate := &sourceGate{master: master, release: make(chan struct{})}
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer func() { cancel(); wg.Wait() }()
			// b reads through the gate, as through a relay; c reads the
			// master and acknowledges the writes.
			wg.Go(func() {
				// A silent source ends the stream (the agent would read
				// the master then).
				err := b.Follow(ctx, "d", 0, node.FollowOptions{Source: gate, Master: master, Replica: "b"})
				if err != nil && !errors.Is(err, node.ErrRelayBehind) {
					t.Error(err)
				}
			})
			wg.Go(func() {
				if err := c.Follow(ctx, "d", 0, node.FollowOptions{Source: master, Replica: "c"}); err != nil {
					t.Error(err)
				}
			})
			v1 := write(t, a, "k", "v1")
			awaitSCN(t, b, v1)
			get := func(maxStale time.Duration) (*node.Item, error) {
				return b.Get(ctx, node.GetRequest{DB: "d", Table: "T", Partition: 0, Key: []keys.Part{keys.S("k")}, MaxStale: maxStale})
			}
			// A slave that holds what its master has answers a read
			// accepting a second.
			deadline := time.Now().Add(10 * time.Second)
			for {
				if it, err := get(time.Second); err == nil && it.Stale < time.Second {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("a slave that holds what its master has never answered a read accepting a second")
				}
				time.Sleep(10 * time.Millisecond)
			}
			if late {
				gate.late(ctx, v1)
			} else {
				gate.cut.Store(true)
			}
			write(t, a, "k", "v2")
			acked := time.Now()
			close(gate.release)
			// b still holds v1: every answer it gives counts its staleness
			// from before v2 was acknowledged.
			for {
				before := time.Since(acked)
				it, err := get(time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				if v1.Less(it.SCN) {
					t.Fatalf("b read %v through a source that passed nothing after %v", it.SCN, v1)
				}
				if it.Stale < before {
					t.Fatalf("b holds v1, written before v2 was acknowledged %v ago, and says it is %v stale", before, it.Stale)
				}
				if before > 1500*time.Millisecond {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if _, err := get(time.Second); !errors.Is(err, node.ErrTooStale) {
				t.Fatalf("a read accepting a second, 1.5 s after b last held all its master had: %v", err)
			}
		})
	}
}

// sourceGate passes a master's log on, as a relay would, until told
// otherwise: cut, it answers heartbeats of its own (nothing new, from a
// relay that says it heard from the master a moment ago); late, it hands
// over an answer made at once, when release is closed, and then nothing.
type sourceGate struct {
	master  node.LogSource
	cut     atomic.Bool
	lateOn  atomic.Bool
	held    atomic.Pointer[node.LogResult]
	release chan struct{}
}

func (g *sourceGate) Log(ctx context.Context, req node.LogRequest) (*node.LogResult, error) {
	if g.cut.Load() {
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return &node.LogResult{SourceRole: node.Offline, Holds: true, SourceSCN: req.After}, nil
	}
	if g.lateOn.Load() {
		res := g.held.Load()
		select {
		case <-g.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if res != nil && g.held.CompareAndSwap(res, nil) {
			return res, nil
		}
		<-ctx.Done() // nothing after it
		return nil, ctx.Err()
	}
	res, err := g.master.Log(ctx, req)
	if g.cut.Load() || g.lateOn.Load() {
		// Told otherwise while the master answered: the answer is not
		// passed on.
		return g.Log(ctx, req)
	}
	return res, err
}

// late holds back an answer the master makes now to a replica at after
// (nothing new: the master holds after).
func (g *sourceGate) late(ctx context.Context, after storage.SCN) {
	res, err := g.master.Log(ctx, node.LogRequest{DB: "d", Partition: 0, After: after})
	if err != nil || len(res.Commits) > 0 {
		panic(fmt.Sprintf("the master's answer after %v: %+v %v", after, res, err))
	}
	g.held.Store(res)
	g.lateOn.Store(true)
}

// TestACatchingUpSlaveIsNotFresh: a slave catching up on its master's
// log (a new replica, or one back from a failure) reads it in batches;
// an answer that is one batch of many says nothing of how far behind the
// slave still is, so a max-stale read must not take it for fresh. The
// fault run found a node that joined answering such reads with values
// 1,700 increments old.
func TestACatchingUpSlaveIsNotFresh(t *testing.T) {
	// The slave asks its master (as every slave in a cluster does), or
	// has only its source's answers (a source of tests, or a master of
	// an earlier release).
	for _, ask := range []bool{true, false} {
		t.Run(fmt.Sprintf("ask=%v", ask), func(t *testing.T) { catchingUp(t, ask) })
	}
}

func catchingUp(t *testing.T, ask bool) {
	a, master, slaves := onePartition(t, 2)
	b, c := slaves[0], slaves[1]
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	// c acknowledges the writes.
	wg.Go(func() {
		if err := c.Follow(ctx, "d", 0, node.FollowOptions{Source: master, Replica: "c"}); err != nil {
			t.Error(err)
		}
	})
	var scns []storage.SCN
	for i := range 6 {
		scns = append(scns, write(t, a, fmt.Sprint("k", i), "v"))
	}
	// b reads the log two commits an answer, and after its first answer
	// waits until released.
	release := make(chan struct{})
	var answers atomic.Int32
	gated := node.LogFunc(func(ctx context.Context, req node.LogRequest) (*node.LogResult, error) {
		if answers.Add(1) > 1 {
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		req.Max = 2
		return master.Log(ctx, req)
	})
	opts := node.FollowOptions{Source: gated, Replica: "b"}
	if ask {
		opts.Master = master
	}
	wg.Go(func() {
		// A silent source ends the stream: b reads it again.
		for ctx.Err() == nil {
			if err := b.Follow(ctx, "d", 0, opts); err != nil && !errors.Is(err, node.ErrRelayBehind) {
				t.Error(err)
				return
			}
		}
	})
	awaitSCN(t, b, scns[0]) // the first answer (the generation begins with a commit of its own)
	get := func() (*node.Item, error) {
		return b.Get(ctx, node.GetRequest{DB: "d", Table: "T", Partition: 0, Key: []keys.Part{keys.S("k0")}, MaxStale: time.Hour})
	}
	if it, err := get(); !errors.Is(err, node.ErrTooStale) {
		t.Fatalf("a slave holding 2 of its master's 7 commits answered a max-stale read: %+v %v", it, err)
	}
	close(release)
	awaitSCN(t, b, scns[5])
	deadline := time.Now().Add(10 * time.Second)
	for {
		it, err := get()
		if err == nil && it.Stale < 2*time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a slave that caught up never answered a max-stale read: %+v %v", it, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAReplicaThatLeftTheSlaveRoleIsNotFresh: a slave that became master
// (and may hold commits of its own that are never acknowledged) or
// offline is no copy of a master's timeline when it is made slave again,
// until it has caught up with its new master: a max-stale read is
// refused meanwhile, however much staleness it accepts.
func TestAReplicaThatLeftTheSlaveRoleIsNotFresh(t *testing.T) {
	a, master, slaves := onePartition(t, 1)
	b := slaves[0]
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := b.Follow(ctx, "d", 0, node.FollowOptions{Source: master, Replica: "b"}); err != nil {
			t.Error(err)
		}
	}()
	scn := write(t, a, "k", "v")
	awaitSCN(t, b, scn)
	get := func() error {
		_, err := b.Get(context.Background(), node.GetRequest{DB: "d", Table: "T", Partition: 0, Key: []keys.Part{keys.S("k")}, MaxStale: time.Hour})
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for get() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("a slave that caught up never answered a max-stale read: %v", get())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	for _, role := range []node.Role{node.Master, node.Offline} {
		if role == node.Master {
			if err := b.SetRole("d", 0, node.Master, 2, 0); err != nil {
				t.Fatal(err)
			}
		} else {
			b.SetRole("d", 0, node.Offline, 0, 0)
		}
		b.SetRole("d", 0, node.Slave, 0, 0)
		if err := get(); !errors.Is(err, node.ErrTooStale) {
			t.Fatalf("a replica made %s and slave again answered a max-stale read before following a master: %v", role, err)
		}
	}
}

// onePartition starts a storage node mastering partition d/0 in
// generation 1 and n more as its slaves (following nothing yet), and
// returns them with the master as a remote.
func onePartition(t *testing.T, n int) (*storageNode, *node.Remote, []*storageNode) {
	t.Helper()
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: 1})
	a := newStorageNode(t, reg)
	if err := a.SetRole("d", 0, node.Master, 1, 0); err != nil {
		t.Fatal(err)
	}
	var slaves []*storageNode
	for range n {
		s := newStorageNode(t, reg)
		s.SetRole("d", 0, node.Slave, 0, 0)
		slaves = append(slaves, s)
	}
	return a, remote(t, a.url), slaves
}

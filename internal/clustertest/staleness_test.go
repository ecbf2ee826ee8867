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

// TestSlaveStalenessCountsFromTheRelaysMaster: a slave that reads its
// master's log through a relay counts its staleness from when the relay
// last heard from the master (LogResult.SourceBehind), not from the
// relay's last answer: a relay cut off from its master still answers,
// with nothing new, and a max-stale read of the slave must not take that
// for fresh. Over the internal protocol, as between processes.
func TestSlaveStalenessCountsFromTheRelaysMaster(t *testing.T) {
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: 1})
	a, b, c := newStorageNode(t, reg), newStorageNode(t, reg), newStorageNode(t, reg)
	if err := a.SetRole("d", 0, node.Master, 1, 0); err != nil {
		t.Fatal(err)
	}
	b.SetRole("d", 0, node.Slave, 0, 0)
	c.SetRole("d", 0, node.Slave, 0, 0)
	master := remote(t, a.url)
	// b reads through a "relay" that heard from the master 10 s before
	// each answer; c reads the master.
	const behind = 10 * time.Second
	viaRelay := node.LogFunc(func(ctx context.Context, req node.LogRequest) (*node.LogResult, error) {
		res, err := master.Log(ctx, req)
		if err == nil {
			res.SourceRole, res.SourceBehind = node.Offline, behind
		}
		return res, err
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() {
		if err := b.Follow(ctx, "d", 0, node.FollowOptions{Source: viaRelay, Master: master, Replica: "b"}); err != nil {
			t.Error(err)
		}
	})
	wg.Go(func() {
		if err := c.Follow(ctx, "d", 0, node.FollowOptions{Source: master, Replica: "c"}); err != nil {
			t.Error(err)
		}
	})
	last := write(t, a, "k", "v")
	awaitSCN(t, b, last)
	awaitSCN(t, c, last)

	get := func(n *storageNode, maxStale time.Duration) (*node.Item, error) {
		return n.Get(ctx, node.GetRequest{DB: "d", Table: "T", Partition: 0, Key: []keys.Part{keys.S("k")}, MaxStale: maxStale})
	}
	// c heard from its master within a second (heartbeats come every
	// second at most): a read accepting 2 s is answered.
	deadline := time.Now().Add(10 * time.Second)
	for {
		it, err := get(c, 2*time.Second)
		if err == nil && it.Stale < 2*time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a slave reading its master directly: %v %v", it, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := get(b, 2*time.Second); !errors.Is(err, node.ErrTooStale) {
		t.Fatalf("a slave whose relay heard from the master %v ago answered a read accepting 2 s: %v", behind, err)
	}
	it, err := get(b, time.Minute)
	if err != nil {
		t.Fatalf("a read accepting a minute: %v", err)
	}
	if it.Stale < behind {
		t.Fatalf("a read accepting a minute says it is %v stale; want at least %v", it.Stale, behind)
	}
}

// TestACatchingUpSlaveIsNotFresh: a slave catching up on its master's
// log (a new replica, or one back from a failure) reads it in batches;
// an answer that is one batch of many says nothing of how far behind the
// slave still is, so a max-stale read must not take it for fresh. The
// fault run found a node that joined answering such reads with values
// 1,700 increments old.
func TestACatchingUpSlaveIsNotFresh(t *testing.T) {
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: 1})
	a, b, c := newStorageNode(t, reg), newStorageNode(t, reg), newStorageNode(t, reg)
	if err := a.SetRole("d", 0, node.Master, 1, 0); err != nil {
		t.Fatal(err)
	}
	b.SetRole("d", 0, node.Slave, 0, 0)
	c.SetRole("d", 0, node.Slave, 0, 0)
	master := remote(t, a.url)
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
	wg.Go(func() {
		if err := b.Follow(ctx, "d", 0, node.FollowOptions{Source: gated, Replica: "b"}); err != nil {
			t.Error(err)
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
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: 1})
	a, b := newStorageNode(t, reg), newStorageNode(t, reg)
	if err := a.SetRole("d", 0, node.Master, 1, 0); err != nil {
		t.Fatal(err)
	}
	b.SetRole("d", 0, node.Slave, 0, 0)
	master := remote(t, a.url)
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

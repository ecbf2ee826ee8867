package controller

import (
	"context"
	"log/slog"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/coord/coordtest"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/topo"
)

// TestStoppedControllerLeavesAtOnce: a controller that stops (its context
// ends: a clean shutdown) gives up the leadership at once, so that the
// next one — a standby, or the same process restarted — leads without
// waiting out the lease's TTL. Its session's lease was revoked under the
// ended context, which failed: a restarted serve waited 5 s for a
// controller, answering 503 meanwhile.
func TestStoppedControllerLeavesAtOnce(t *testing.T) {
	cli := coordtest.Start(t)
	reg, err := registry.Open(context.Background(), cli, registry.Options{Prefix: "/t"})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	ctx, cancel := context.WithCancel(context.Background())
	c := &Controller{Client: cli, Prefix: "/t", Registry: reg, ID: "c1", LeaseTTL: 60, Log: slog.New(slog.DiscardHandler)}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	leaders := func() int64 {
		resp, err := cli.Get(context.Background(), topo.ElectionPrefix("/t"), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	deadline := time.Now().Add(10 * time.Second)
	for leaders() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no controller elected within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := leaders(); n != 0 {
		t.Fatalf("after the controller stopped, %d election key(s) remain (its lease's TTL is 60 s)", n)
	}
}

// TestHandOverFromAGoneMasterIsStuckAtOnce: a partition handed over from
// a master that is gone (its lease lapsed mid-drain) is chosen again at
// once, not after StuckAfter: the new master cannot drain it and will
// not take over. One whose old master lives waits StuckAfter, and one
// whose new master took over is not stuck.
func TestHandOverFromAGoneMasterIsStuckAtOnce(t *testing.T) {
	c := &Controller{StuckAfter: time.Hour, Log: slog.New(slog.DiscardHandler)}
	route := topo.PartitionRoute{Replicas: []string{"b", "a", "c"}, From: "a", Generation: 4}
	role := node.Slave
	status := func(id string) (node.PartitionStatus, bool) {
		return node.PartitionStatus{Role: role}, id == "b"
	}
	alive := func(string) bool { return true }
	gone := func(id string) bool { return id != "a" }
	if c.stuck("d", 1, route, status, alive) || c.stuck("d", 1, route, status, alive) {
		t.Fatal("a hand-over from a live master was stuck before StuckAfter")
	}
	if !c.stuck("d", 1, route, status, gone) {
		t.Fatal("a hand-over from a master that is gone was not stuck at once")
	}
	role = node.Master
	if c.stuck("d", 1, route, status, gone) {
		t.Fatal("a master that took over was stuck")
	}
	role = node.Slave
	route.From = ""
	if c.stuck("d", 1, route, status, gone) {
		t.Fatal("a master chosen by failover (no hand-over) was stuck at once")
	}
}

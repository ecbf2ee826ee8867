package controller

import (
	"context"
	"log/slog"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/coord/coordtest"
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

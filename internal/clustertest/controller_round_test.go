package clustertest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/topo"
	"github.com/cortado-db/cortado/internal/wire"
)

// TestControllerRoundAsksEachNodeOnce: with many databases, a controller
// round asks each node once for all its partitions, not once a database
// (a round's work then grew with databases × partitions: 200 databases
// of 16 partitions took most of a core at idle; docs/performance.md,
// "Many databases"), and still places every database.
func TestControllerRoundAsksEachNodeOnce(t *testing.T) {
	var calls, named atomic.Int64
	count := grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if r, ok := req.(*wire.StatusRequest); ok {
			calls.Add(1)
			if r.Db != "" {
				named.Add(1)
			}
		}
		return h(ctx, req)
	})
	c := startClusterWith(t, clusterOptions{nodes: 3, partitions: 2, replicas: 3, lastServer: []grpc.ServerOption{count}})
	const dbs = 20
	for i := range dbs {
		if _, _, err := c.reg.CreateDatabase(c.ctx, schema.Database{Name: fmt.Sprintf("m%d", i), Partitions: 2, Replicas: 3}); err != nil {
			t.Fatal(err)
		}
	}
	// Every database placed, every partition with a master on its node.
	await(t, 30*time.Second, "every database's partitions to have masters", func() bool {
		tables, err := topo.RoutingTables(c.ctx, c.cli, "/c")
		if err != nil || len(tables) != dbs+1 {
			return false
		}
		for _, rt := range tables {
			for p, r := range rt.Partitions {
				if len(r.Replicas) != 3 || c.nodes[r.Replicas[0]].Role(rt.DB, p).String() != "MASTER" {
					return false
				}
			}
		}
		return true
	})
	// The controller's interval is 100 ms: over a second, about ten
	// rounds (and a few more, woken by reports), each one call to this
	// node — against a call a database a round, 210 and more, before.
	before, start := calls.Load(), time.Now()
	time.Sleep(time.Second)
	n, elapsed := calls.Load()-before, time.Since(start)
	if limit := int64(3*elapsed/(100*time.Millisecond)) + 5; n == 0 || n > limit {
		t.Fatalf("the node was asked for its status %d times in %v (at most %d: a call a round)", n, elapsed, limit)
	}
	if named.Load() != 0 {
		t.Fatalf("%d of %d status calls asked for one database's partitions", named.Load(), calls.Load())
	}
}

package clustertest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/keys"
)

// BenchmarkFailover is the paper's Figure 4 on this machine: three
// storage nodes (in this process, each with its own Pebble and internal
// HTTP API), replicas 3, lease TTL 2s. The node mastering the most
// partitions is killed; the benchmark reports the time from its lease's
// expiry (etcd deleting its registration) until every partition it
// mastered accepted a write through the router again (128 probing clients), with transitions
// grouped (one routing table version for all) and one by one (one version
// per partition). Run with -benchtime 1x: each run builds a cluster.
//
//	go test -run XXX -bench Failover -benchtime 1x ./internal/clustertest/
func BenchmarkFailover(b *testing.B) {
	for _, partitions := range []int{64, 256, 512, 1024} {
		for _, mode := range []string{"grouped", "one-by-one"} {
			b.Run(fmt.Sprintf("partitions=%d/%s", partitions, mode), func(b *testing.B) {
				for range b.N {
					afterExpiry, afterKill, toTable, moved := failoverOnce(b, partitions, mode == "one-by-one")
					b.ReportMetric(afterExpiry.Seconds(), "s-after-expiry")
					b.ReportMetric(toTable.Seconds(), "s-to-first-table")
					b.ReportMetric(afterKill.Seconds(), "s-after-kill")
					b.ReportMetric(float64(moved), "masters-moved")
				}
			})
		}
	}
}

func failoverOnce(b *testing.B, partitions int, oneByOne bool) (afterExpiry, afterKill, toTable time.Duration, moved int) {
	c := startClusterWith(b, clusterOptions{nodes: 3, partitions: partitions, replicas: 3, oneByOne: oneByOne, relayBuffer: 10000})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.view.AwaitDatabase(ctx, "d"); err != nil {
		b.Fatal(err)
	}
	d, err := c.reg.Database("d")
	if err != nil {
		b.Fatal(err)
	}
	probe := make([]string, partitions) // a key in each partition
	for i, found := 0, 0; found < partitions; i++ {
		k := fmt.Sprintf("p%d", i)
		if p := d.PartitionOf(keys.Part{Str: k}); probe[p] == "" {
			probe[p] = k
			found++
		}
	}
	table := c.view.Table("d")
	victim := busiestMaster(table)
	var victimParts []int
	for p, r := range table.Partitions {
		if r.Replicas[0] == victim {
			victimParts = append(victimParts, p)
		}
	}
	gone := c.cli.Watch(ctx, "/c/nodes/"+victim, clientv3.WithFilterPut())
	published := c.cli.Watch(ctx, "/c/routing/d")
	killed := time.Now()
	c.nodes[victim].kill()
	delete(c.nodes, victim)
	<-gone
	expired := time.Now()
	<-published
	toTable = time.Since(expired)
	work := make(chan int)
	var wg sync.WaitGroup
	for range 128 {
		wg.Go(func() {
			for p := range work {
				c.put(probe[p], "after")
			}
		})
	}
	for _, p := range victimParts {
		work <- p
	}
	close(work)
	wg.Wait()
	done := time.Now()
	return done.Sub(expired), done.Sub(killed), toTable, len(victimParts)
}

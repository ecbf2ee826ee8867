package clustertest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/node"
)

// BenchmarkReplication writes 1 KB documents through the router from 16
// clients into three storage nodes (in this process, each with its own
// Pebble and internal HTTP API; replicas 3, 8 partitions), acknowledged
// semi-sync (once a slave holds the commit) or async (once the master
// has it), and reports write throughput and the replication lag slaves
// saw (master commit → slave applied) at p50 and p99.
//
//	go test -run XXX -bench Replication -benchtime 5s ./internal/clustertest/
func BenchmarkReplication(b *testing.B) {
	for _, mode := range []string{"semi-sync", "async"} {
		b.Run(mode, func(b *testing.B) {
			var mu sync.Mutex
			var lags []time.Duration
			c := startClusterWith(b, clusterOptions{nodes: 3, partitions: 8, replicas: 3, replication: mode, relayBuffer: 10000,
				node: node.Options{ReplicationLag: func(d time.Duration) {
					mu.Lock()
					lags = append(lags, d)
					mu.Unlock()
				}}})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := c.view.AwaitDatabase(ctx, "d"); err != nil {
				b.Fatal(err)
			}
			value := `{"v":"` + strings.Repeat("x", 1000) + `"}`
			hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			var seq atomic.Int64
			mu.Lock()
			lags = lags[:0]
			mu.Unlock()
			b.SetParallelism(8) // 16 clients on 2 cores
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					k := fmt.Sprintf("k%d", seq.Add(1))
					req, _ := http.NewRequest("PUT", c.url+"/d/T/"+k, strings.NewReader(value))
					req.Header.Set("Content-Type", "application/json")
					resp, err := hc.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode >= 300 {
						b.Errorf("put: %d", resp.StatusCode)
						return
					}
				}
			})
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "writes/s")
			mu.Lock()
			defer mu.Unlock()
			if len(lags) > 0 {
				slices.Sort(lags)
				b.ReportMetric(float64(lags[len(lags)/2].Microseconds())/1000, "lag-p50-ms")
				b.ReportMetric(float64(lags[len(lags)*99/100].Microseconds())/1000, "lag-p99-ms")
			}
		})
	}
}

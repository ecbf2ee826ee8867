package topo

import (
	"context"
	"sync"
	"testing"

	"github.com/cortado-db/cortado/internal/coord/coordtest"
)

// TestClusterID: the first process to ask makes the cluster's identity;
// every later one, and every one asking at the same time, gets the same;
// another prefix is another cluster.
func TestClusterID(t *testing.T) {
	cli := coordtest.Start(t)
	ctx := context.Background()
	ids := make([]string, 8)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			id, err := ClusterID(ctx, cli, "/t")
			if err != nil {
				t.Error(err)
			}
			ids[i] = id
		})
	}
	wg.Wait()
	for _, id := range ids {
		if len(id) != 32 || id != ids[0] {
			t.Fatalf("asked at once, processes got %q", ids)
		}
	}
	if again, err := ClusterID(ctx, cli, "/t"); err != nil || again != ids[0] {
		t.Fatalf("asked again: %q, %v; want %q", again, err, ids[0])
	}
	if other, err := ClusterID(ctx, cli, "/u"); err != nil || other == ids[0] || len(other) != 32 {
		t.Fatalf("another prefix: %q, %v", other, err)
	}
}

package server

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/node"
)

// TestLocalNodeDropsExpired: a router's direct call to a storage node of
// its own process whose deadline has passed does no work (the node is nil
// here: touching it would panic) and is counted as dropped, as a call over
// the wire is.
func TestLocalNodeDropsExpired(t *testing.T) {
	expired := new(atomic.Uint64)
	c := &localNode{expired: expired}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Get(gone, node.GetRequest{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a read whose context ended: %v, want context.Canceled", err)
	}
	if _, err := c.MultiGet(gone, node.MultiGetRequest{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a multi-get whose context ended: %v, want context.Canceled", err)
	}
	if _, err := c.Scan(gone, node.ScanRequest{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a scan whose context ended: %v, want context.Canceled", err)
	}
	late, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if _, err := c.Write(late, node.WriteRequest{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a write past its deadline: %v, want context.DeadlineExceeded", err)
	}
	if n := expired.Load(); n != 4 {
		t.Fatalf("%d calls counted as dropped, want 4", n)
	}
}

package server

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/cortado-db/cortado/internal/admission"
	"github.com/cortado-db/cortado/internal/node"
)

// TestLocalNodeAdmits: a router's direct call to a storage node of its
// own process is admitted as a call over the wire is: a call whose
// deadline has passed does no work and is counted as dropped, and one
// past the node's bound is refused as overloaded — before the node is
// touched (it is nil here).
func TestLocalNodeAdmits(t *testing.T) {
	expired := new(atomic.Uint64)
	c := &localNode{id: "n1", l: admission.New(admission.Options{MaxInFlight: 1, MaxQueue: -1}), expired: expired}

	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Get(gone, node.GetRequest{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a call whose context ended: %v, want context.Canceled", err)
	}
	if _, err := c.Write(gone, node.WriteRequest{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a write whose context ended: %v, want context.Canceled", err)
	}
	if n := expired.Load(); n != 2 {
		t.Fatalf("%d calls counted as dropped, want 2", n)
	}

	release, err := c.admit(context.Background()) // the one slot
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.MultiGet(context.Background(), node.MultiGetRequest{}); !errors.Is(err, node.ErrOverloaded) {
		t.Fatalf("a call past the bound: %v, want node.ErrOverloaded", err)
	}
	if _, err := c.Scan(context.Background(), node.ScanRequest{}); !errors.Is(err, node.ErrOverloaded) {
		t.Fatalf("a scan past the bound: %v, want node.ErrOverloaded", err)
	}
	release()
	if release, err = c.admit(context.Background()); err != nil {
		t.Fatalf("after the slot was released: %v", err)
	}
	release()
	if n := expired.Load(); n != 2 {
		t.Fatalf("%d calls counted as dropped, want still 2", n)
	}
}

package node

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// TestByteGateBounds: writes of random sizes, at once, never hold more
// than the bound together; one larger than the bound goes alone.
func TestByteGateBounds(t *testing.T) {
	const bound = 100
	g := newByteGate(bound)
	var mu sync.Mutex
	held, most := int64(0), int64(0)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			for range 300 {
				n, err := g.acquire(context.Background(), 1+rng.Int64N(bound+20))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				held += n
				most = max(most, held)
				mu.Unlock()
				mu.Lock()
				held -= n
				mu.Unlock()
				g.release(n)
			}
		})
	}
	wg.Wait()
	if most > bound || g.free != bound || len(g.waiting) != 0 {
		t.Fatalf("held at most %d of %d; free %d, %d waiting at the end", most, bound, g.free, len(g.waiting))
	}
}

// TestByteGateOrder: writes are let in in the order they came, so a
// large one is not passed forever by small ones; a write whose context
// ends while it waits takes nothing and lets the next ones in.
func TestByteGateOrder(t *testing.T) {
	g := newByteGate(10)
	ctx := context.Background()
	a, _ := g.acquire(ctx, 8)
	got := make(chan string, 3)
	wait := func(name string, ctx context.Context, n int64) {
		go func() {
			if _, err := g.acquire(ctx, n); err != nil {
				got <- name + " " + err.Error()
				return
			}
			got <- name
		}()
		for { // queued before the next one comes
			g.mu.Lock()
			queued := false
			for _, w := range g.waiting {
				queued = queued || w.n == n
			}
			g.mu.Unlock()
			if queued {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	waiting := func() (names []int64) {
		g.mu.Lock()
		defer g.mu.Unlock()
		for _, w := range g.waiting {
			names = append(names, w.n)
		}
		return names
	}
	gone, cancel := context.WithCancel(ctx)
	wait("b", gone, 9)
	wait("c", ctx, 5)
	wait("d", ctx, 1) // fits now, but comes after c
	if w := waiting(); len(w) != 3 {
		t.Fatalf("waiting %v: a write was let in before the writes ahead of it", w)
	}
	cancel() // b gives up: c and d still wait for a
	if name := <-got; name != "b "+context.Canceled.Error() {
		t.Fatalf("first answer %q, want b's cancellation", name)
	}
	if w := waiting(); len(w) != 2 || g.free != 2 {
		t.Fatalf("after b gave up: waiting %v, free %d (a holds 8 of 10)", w, g.free)
	}
	g.release(a)
	if first, second := <-got, <-got; first+second != "cd" && first+second != "dc" {
		t.Fatalf("after a: %q and %q", first, second)
	}
	if g.free != 4 {
		t.Fatalf("free %d, want 4 (c's 5 and d's 1 held; b, cancelled, none)", g.free)
	}
}

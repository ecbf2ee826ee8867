package node

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestStallGuard: a node with StallCalls calls unanswered for StallAfter
// is stalled — its waiting calls end as unavailable, new ones fail at
// once as not delivered, a probe a StallAfter goes through, and an answer
// ends it; fewer waiting calls, or a burst after a quiet spell, is no
// stall.
func TestStallGuard(t *testing.T) {
	g := newStallGuard(StallOptions{Calls: 3, After: time.Hour})
	ctx := context.Background()
	type call struct {
		ctx context.Context
		end func(error) error
	}
	begin := func() (call, error) {
		c, end, err := g.begin(ctx, "n")
		return call{c, end}, err
	}
	quiet := func() { g.mu.Lock(); g.since = time.Now().Add(-2 * time.Hour); g.mu.Unlock() }
	var waiting []call
	for range 2 {
		c, err := begin()
		if err != nil {
			t.Fatal(err)
		}
		waiting = append(waiting, c)
	}
	quiet()
	c, err := begin() // two unanswered calls are no stall
	if err != nil {
		t.Fatalf("with two calls waiting: %v", err)
	}
	waiting = append(waiting, c)
	// Three waiting, unanswered for two hours.
	quiet()
	_, err = begin()
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrNotDelivered) {
		t.Fatalf("a call to a stalled node: %v, want unavailable, not delivered", err)
	}
	for i, w := range waiting {
		if w.ctx.Err() == nil {
			t.Fatalf("waiting call %d not ended", i)
		}
		if err := w.end(w.ctx.Err()); !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrNotDelivered) {
			t.Fatalf("a waiting call's end: %v, want unavailable (outcome unknown)", err)
		}
	}
	// A probe goes through when it is due; its answer ends the stall.
	g.mu.Lock()
	g.probeAt = time.Now().Add(-time.Millisecond)
	g.mu.Unlock()
	probe, err := begin()
	if err != nil {
		t.Fatalf("the probe: %v", err)
	}
	if _, err := begin(); err == nil {
		t.Fatal("a second call while the probe is out went through")
	}
	if err := probe.end(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := begin(); err != nil {
		t.Fatalf("after an answer: %v", err)
	}
	// A busy period after a quiet one starts its own clock.
	g2 := newStallGuard(StallOptions{Calls: 2, After: time.Minute})
	g2.since = time.Now().Add(-time.Hour)
	for i := range 5 {
		if _, _, err := g2.begin(ctx, "n"); err != nil {
			t.Fatalf("call %d of a burst after a quiet hour: %v", i, err)
		}
	}
	// Switched off, the guard refuses nothing but still says how long
	// the node has been quiet (hedging asks).
	off := newStallGuard(StallOptions{Calls: -1, After: time.Nanosecond})
	if off.quiet() != 0 {
		t.Fatal("quiet with nothing waiting")
	}
	for range 3 {
		if _, _, err := off.begin(ctx, "n"); err != nil {
			t.Fatalf("a guard switched off refused: %v", err)
		}
	}
	off.mu.Lock()
	off.since = time.Now().Add(-time.Minute)
	off.mu.Unlock()
	if q := off.quiet(); q < time.Minute {
		t.Fatalf("quiet %v, want a minute", q)
	}
	// A node that left the cluster: the calls waiting on it end as
	// unavailable (a write's outcome unknown), and later calls go
	// through (it may come back).
	g4 := newStallGuard(StallOptions{Calls: 8, After: time.Hour})
	lc, lend, _ := g4.begin(ctx, "n")
	g4.leave()
	if lc.Err() == nil {
		t.Fatal("a call waiting on a node that left was not ended")
	}
	if err := lend(lc.Err()); !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrNotDelivered) || !strings.Contains(err.Error(), "left the cluster") {
		t.Fatalf("a call waiting on a node that left: %v, want unavailable (outcome unknown)", err)
	}
	if _, _, err := g4.begin(ctx, "n"); err != nil {
		t.Fatalf("a call after the node left: %v", err)
	}
	// A caller that leaves is no answer, and no stall error either.
	g3 := newStallGuard(StallOptions{Calls: 1, After: time.Hour})
	cctx, cancel := context.WithCancel(ctx)
	c1, end, _ := g3.begin(cctx, "n")
	cancel()
	if err := end(c1.Err()); !errors.Is(err, context.Canceled) {
		t.Fatalf("a departed caller's call: %v", err)
	}
}

// TestStallGuardMaxCalls: beyond MaxCalls calls in flight to one node a
// call fails at once as overloaded and not delivered; an answer frees a
// place; -1 bounds nothing.
func TestStallGuardMaxCalls(t *testing.T) {
	ctx := context.Background()
	g := newStallGuard(StallOptions{Calls: -1, MaxCalls: 2})
	var ends []func(error) error
	for range 2 {
		_, end, err := g.begin(ctx, "n")
		if err != nil {
			t.Fatal(err)
		}
		ends = append(ends, end)
	}
	_, _, err := g.begin(ctx, "n")
	if !errors.Is(err, ErrOverloaded) || !errors.Is(err, ErrNotDelivered) {
		t.Fatalf("a third call with two in flight: %v, want overloaded, not delivered", err)
	}
	if err := ends[0](nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.begin(ctx, "n"); err != nil {
		t.Fatalf("after an answer: %v", err)
	}
	unbounded := newStallGuard(StallOptions{Calls: -1, MaxCalls: -1})
	for i := range 1000 {
		if _, _, err := unbounded.begin(ctx, "n"); err != nil {
			t.Fatalf("call %d without a bound: %v", i, err)
		}
	}
}

// A silent node that answers the ping is alive — its calls wait on
// something else, such as replicas' acknowledgements — and is not
// stalled; one that does not answer it is.
func TestStallGuardPings(t *testing.T) {
	for _, alive := range []bool{true, false} {
		g := newStallGuard(StallOptions{Calls: 2, After: 200 * time.Millisecond}) // pings time out after 50 ms
		pinged := make(chan struct{}, 4)
		g.ping = func(ctx context.Context) error {
			pinged <- struct{}{}
			if alive {
				return nil
			}
			<-ctx.Done() // a frozen process: no answer
			return ctx.Err()
		}
		ctx := context.Background()
		var waiting []context.Context
		for range 2 {
			c, _, err := g.begin(ctx, "n")
			if err != nil {
				t.Fatal(err)
			}
			waiting = append(waiting, c)
		}
		g.mu.Lock()
		g.since = time.Now().Add(-2 * time.Hour)
		g.mu.Unlock()
		// Silent for two hours: the call that notices pings the node and
		// is not refused meanwhile.
		if _, _, err := g.begin(ctx, "n"); err != nil {
			t.Fatalf("alive %v: the call that starts the ping: %v", alive, err)
		}
		<-pinged
		g.close() // waits for the ping
		g.mu.Lock()
		stalled, quiet := g.stalled, time.Since(g.since)
		g.mu.Unlock()
		if stalled == alive {
			t.Fatalf("alive %v: stalled %v", alive, stalled)
		}
		if alive && quiet > time.Minute {
			t.Fatalf("an answered ping did not count as an answer: quiet %v", quiet)
		}
		for i, c := range waiting {
			if (c.Err() != nil) == alive {
				t.Fatalf("alive %v: waiting call %d ended: %v", alive, i, c.Err())
			}
		}
	}
}

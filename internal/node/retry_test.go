package node

import (
	"context"
	"testing"
	"time"
)

// TestStreamRetry: the wait after a failed attempt doubles from 100 ms to
// 1 s while attempts keep failing, and starts over after an attempt that
// read for a second, or one that ended on purpose. (A cancelled context
// makes each Wait return at once: what is checked is the wait it chose.)
func TestStreamRetry(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var r StreamRetry
	now := time.Now()
	var got []time.Duration
	for range 6 {
		r.Wait(ctx, now, false)
		got = append(got, r.wait)
	}
	want := []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second, time.Second, time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("the waits after six failures (each the next one's): %v, want %v", got, want)
		}
	}
	if r.Wait(ctx, now.Add(-2*time.Second), false); r.wait != 200*time.Millisecond {
		t.Fatalf("after an attempt that read for 2 s, the next wait is %v, want 200 ms (100 ms waited)", r.wait)
	}
	r.Wait(ctx, now, false)
	if r.Wait(ctx, now, true); r.wait != 200*time.Millisecond {
		t.Fatalf("after an attempt that ended on purpose, the next wait is %v, want 200 ms", r.wait)
	}
}

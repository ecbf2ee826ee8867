package admission

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
)

// TestLazyDeadlineIsADeadline checks that a request's deadline behaves as
// context.WithDeadline's in every way a caller can see: its error before
// and after the deadline, with or without anything waiting on Done, when
// cancelled, when its parent ends, and for contexts derived from it.
func TestLazyDeadlineIsADeadline(t *testing.T) {
	t.Run("passes unwatched", func(t *testing.T) {
		ctx, cancel := WithDeadline(context.Background(), time.Now().Add(20*time.Millisecond))
		defer cancel()
		if d, ok := ctx.Deadline(); !ok || time.Until(d) > 20*time.Millisecond {
			t.Fatalf("deadline %v %v", d, ok)
		}
		if ctx.Err() != nil {
			t.Fatalf("error before the deadline: %v", ctx.Err())
		}
		for ctx.Err() == nil {
			runtime.Gosched()
		}
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			t.Fatalf("error after the deadline: %v", ctx.Err())
		}
		select {
		case <-ctx.Done():
		default:
			t.Fatal("Done asked after the deadline is not closed")
		}
		if !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
			t.Fatalf("cause %v", context.Cause(ctx))
		}
	})
	t.Run("passes watched", func(t *testing.T) {
		ctx, cancel := WithDeadline(context.Background(), time.Now().Add(20*time.Millisecond))
		defer cancel()
		<-ctx.Done()
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			t.Fatalf("error once Done closed: %v", ctx.Err())
		}
	})
	t.Run("derived", func(t *testing.T) {
		ctx, cancel := WithDeadline(context.Background(), time.Now().Add(20*time.Millisecond))
		defer cancel()
		// context.WithCancel starts a goroutine for a parent it does not
		// know unless the parent can say when it is done without one.
		// Derive many, so that goroutines of other tests that end
		// meanwhile cannot hide one started for each.
		const derived = 100
		before := runtime.NumGoroutine()
		var child context.Context
		for range derived {
			var stop context.CancelFunc
			child, stop = context.WithCancel(ctx)
			defer stop()
		}
		if n := runtime.NumGoroutine(); n-before >= derived/2 {
			t.Fatalf("deriving %d contexts started %d goroutines", derived, n-before)
		}
		<-child.Done()
		if !errors.Is(child.Err(), context.DeadlineExceeded) {
			t.Fatalf("derived context's error: %v", child.Err())
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		for _, watch := range []bool{false, true} {
			ctx, cancel := WithDeadline(context.Background(), time.Now().Add(time.Hour))
			if watch {
				ctx.Done()
			}
			cancel()
			if !errors.Is(ctx.Err(), context.Canceled) {
				t.Fatalf("watched %v: error after cancel: %v", watch, ctx.Err())
			}
			<-ctx.Done()
		}
	})
	t.Run("parent ends", func(t *testing.T) {
		parent, end := context.WithCancel(context.Background())
		ctx, cancel := WithDeadline(parent, time.Now().Add(time.Hour))
		defer cancel()
		end()
		if !errors.Is(ctx.Err(), context.Canceled) {
			t.Fatalf("error once the parent ended: %v", ctx.Err())
		}
		<-ctx.Done()
		type key struct{}
		vctx, vcancel := WithDeadline(context.WithValue(context.Background(), key{}, 7), time.Now().Add(time.Hour))
		defer vcancel()
		if vctx.Value(key{}) != 7 {
			t.Fatal("a parent's value is lost")
		}
	})
}

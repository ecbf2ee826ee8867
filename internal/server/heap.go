package server

import (
	"context"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
	"time"
)

// DefaultHeapFloor is the heap goal below which a Cortado process does not
// let the garbage collector aim (Options.HeapFloor).
const DefaultHeapFloor = 64 << 20

// heapTuned is set while a server of this process tunes the collector:
// GOGC is the process's, so only one may.
var heapTuned atomic.Bool

// tuneHeap keeps the garbage collector's heap goal at floor bytes or more
// until the server stops. A server's live heap is small (documents live in
// Pebble's memory, outside it), so with GOGC=100 the goal is a few MB and
// a loaded server collected 25–30 times a second, each cycle's marking
// and assists taken from requests. The goal becomes max(floor, the
// goal GOGC gives): as the live heap grows past floor/2 GOGC is what it
// was. It leaves the collector alone when floor is not positive, when
// the GOGC environment variable is set (the operator chose), and when
// another server of this process tunes it already.
func (s *Server) tuneHeap(floor int64) {
	if floor <= 0 || os.Getenv("GOGC") != "" || !heapTuned.CompareAndSwap(false, true) {
		return
	}
	base := debug.SetGCPercent(100)
	debug.SetGCPercent(base)
	if base < 0 { // GOGC=off set by the program
		heapTuned.Store(false)
		return
	}
	s.background(func(ctx context.Context) {
		defer func() {
			debug.SetGCPercent(base)
			heapTuned.Store(false)
		}()
		live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		set := base
		for {
			metrics.Read(live)
			if p := gcPercent(live[0].Value.Uint64(), uint64(floor), base); p != set {
				debug.SetGCPercent(p)
				set = p
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
}

// gcPercent is the GOGC that puts the heap goal, live×(1+GOGC/100), at
// floor or more: base when base already does, at most 100× the live heap.
func gcPercent(live, floor uint64, base int) int {
	live = max(live, 1<<20) // before the first collection it reads 0
	if live >= floor {
		return base
	}
	p := (floor - live) * 100 / live
	return max(base, int(min(p, 10000)))
}

package server

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// DefaultHeapFloor is the heap goal below which a Cortado process does not
// let the garbage collector aim (Options.HeapFloor): 1 GiB, about the goal
// GOGC=100 gives a storage node whose caches are full (Pebble's 256 MiB
// block cache, the 128 MiB row cache and its memtables are on the Go
// heap). With 64 MiB, a node whose caches were still filling collected
// every 3 s under a multi-get load of 7,000/s, and each collection's
// marking and assists held requests for tens of milliseconds: the
// multi-get's p99 was 9–87 ms with three collections in 10 s, 2–3 ms
// with one.
const DefaultHeapFloor = 1 << 30

// heapTuned is set while a server of this process tunes the collector:
// GOGC is the process's, so only one may.
var heapTuned atomic.Bool

// tuneHeap keeps the garbage collector's heap goal at floor bytes or more
// until the server stops. A server's live heap is small until its caches
// (Pebble's block cache, the row cache) fill, so with GOGC=100 the goal
// is a few MB and a loaded server collected 25–30 times a second, each
// cycle's marking and assists taken from requests. The goal becomes
// max(floor, the goal GOGC gives): once the live heap passes floor/2,
// GOGC is what it was.
//
// GOGC is set at the end of every collection, from the live heap that
// collection found (a finalizer of an object dropped each cycle runs
// then), so the goal the runtime computes from it is exactly that: set
// on a timer instead, a live heap that grew between two ticks multiplied
// an old, large GOGC and overshot the floor (133 MiB under the overload
// test's burst against a 64 MiB floor).
//
// It leaves the collector alone when floor is not positive, when the GOGC
// environment variable is set (the operator chose), when GOGC is off, and
// when another server of this process tunes it already.
func (s *Server) tuneHeap(floor int64) {
	if floor <= 0 || os.Getenv("GOGC") != "" || !heapTuned.CompareAndSwap(false, true) {
		return
	}
	base := debug.SetGCPercent(100)
	debug.SetGCPercent(base)
	if base < 0 {
		heapTuned.Store(false)
		return
	}
	t := &heapTuner{floor: uint64(floor), base: base, set: base}
	t.tune()
	t.arm()
	s.stop = append(s.stop, t.stop)
}

// heapTuner sets GOGC after each collection until stopped.
type heapTuner struct {
	floor uint64
	base  int

	mu      sync.Mutex
	set     int // the GOGC last set
	stopped bool
}

// sentinel is dropped at once; its finalizer runs after the collection
// that found it unreachable.
type sentinel struct{ _ [16]byte }

func (t *heapTuner) arm() {
	runtime.SetFinalizer(&sentinel{}, func(*sentinel) {
		t.mu.Lock()
		stopped := t.stopped
		t.mu.Unlock()
		if !stopped {
			t.tune()
			t.arm()
		}
	})
}

func (t *heapTuner) tune() {
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(live)
	p := gcPercent(live[0].Value.Uint64(), t.floor, t.base)
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.stopped && p != t.set {
		debug.SetGCPercent(p)
		t.set = p
	}
}

// stop puts GOGC back; a finalizer still pending does nothing.
func (t *heapTuner) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	t.stopped = true
	debug.SetGCPercent(t.base)
	heapTuned.Store(false)
}

// gcPercent is the GOGC that puts the heap goal, live×(1+GOGC/100), at
// floor or more: base when base already does, at most 100× the live heap.
// Before the first collection the live heap reads 0: base, until that
// collection measures it (the runtime would apply a GOGC computed from a
// guess to the heap it actually marked).
func gcPercent(live, floor uint64, base int) int {
	if live == 0 || live >= floor {
		return base
	}
	p := (floor - live) * 100 / live
	return max(base, int(min(p, 10000)))
}

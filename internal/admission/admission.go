// Package admission owns overload protection at a process's edge (the
// FollowFeed lessons, DESIGN.md §9): a bounded number of requests in
// progress, a short bounded queue in front of them, shedding by priority
// class (bulk first, then the change stream and snapshots, interactive
// reads and writes last), and request deadlines. A request it refuses is
// refused before anything reads its body. A slot bounds a process's own
// work: a request that goes on to wait for other processes (a storage
// node's write waiting for its replicas) may give it back (Park).
//
// It never parses a request beyond its method, path and headers, never
// blocks longer than a request's deadline or the queue timeout, and holds
// nothing for a refused request.
package admission

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"
)

// Class is a request's priority: under overload the highest class is
// shed first.
type Class int

// Classes, most important first.
const (
	Interactive Class = iota // document reads and writes, queries
	Stream                   // change stream, snapshots, bootstrap
	Bulk                     // everything else: administration, scans of whole tables
	classes
)

func (c Class) String() string {
	return [...]string{"interactive", "stream", "bulk"}[c]
}

// queueShare is the part of the queue a class may fill: when the queue is
// that full, the class is refused and only more important ones wait.
var queueShare = [classes]float64{Interactive: 1, Stream: 0.5, Bulk: 0.25}

// Options bound a Limiter; zero values take the defaults.
type Options struct {
	// MaxInFlight is how many requests may be in progress at once
	// (default 64; negative: no limit, the limiter is off).
	MaxInFlight int
	// MaxQueue is how many requests may wait for a slot. By default (0)
	// it is sized from the measured capacity, as the FollowFeed post
	// sizes its queues: the most requests completed in one second over
	// the last ten, times QueueTimeout — what the process can still
	// serve before a waiting request gives up — at least MinQueue
	// (default 256) and at most 4096. Negative: nothing waits.
	MaxQueue, MinQueue int
	// QueueTimeout and StandingTimeout bound a request's wait the way
	// CoDel bounds a packet's ("Fail at Scale", Facebook 2015): while
	// the queue has been empty within the last QueueTimeout (default
	// 100 ms), a request waits up to QueueTimeout, so a burst or a
	// short stall is absorbed rather than refused; once the queue has
	// stood for longer than that, or a request was refused, the process
	// is overloaded for ten queue timeouts (1 s), and a request waits at
	// most StandingTimeout (default 10 ms), and slots go to the newest
	// waiters first (adaptive LIFO): those whose clients are still
	// waiting, while the oldest time out. A fixed
	// 100 ms let a standing queue add 100 ms to every request admitted
	// past capacity (p50 117–120 ms at 1.05C); a fixed 10 ms refused
	// requests in every stall of tens of milliseconds at capacity, which
	// the unprotected server absorbed (docs/performance.md).
	QueueTimeout, StandingTimeout time.Duration
	// Adaptive lets the limit follow latency (a gradient limiter in the
	// style of Netflix's concurrency-limits): it shrinks when requests
	// take longer than the fastest recently seen, grows while they do
	// not, between MinInFlight (default 8) and MaxInFlight.
	Adaptive    bool
	MinInFlight int
	// MaxParked bounds the requests that gave their slot back while they
	// wait on other processes (Park; default 16 × MaxInFlight, negative:
	// none may). One parked past the bound keeps its slot.
	MaxParked int
}

// Defaults.
const (
	DefaultMaxInFlight = 64
	// DefaultRouterMaxInFlight is a router's: by Little's law its limit
	// must exceed throughput × latency at capacity, or the limit itself
	// caps throughput (with 64, the open-loop overload test queued every
	// request for 100 ms at C). `serve --nodes 3` now serves 21,000–
	// 28,000 requests a second, at tens of milliseconds each past
	// capacity: with 256 a router refused more than the excess, and
	// served 1.19–1.22C at 2C and 5C against 1.32–1.37C with 512 or
	// 1,024 (docs/performance.md). 512 holds at most 1 GiB of request
	// bodies at the default --max-body-bytes. Storage nodes, whose own
	// limits bound the work, keep 64.
	DefaultRouterMaxInFlight = 512
	DefaultMinQueue          = 256
	maxQueueCap              = 4096
	DefaultQueueTimeout      = 100 * time.Millisecond
	DefaultStandingTimeout   = 10 * time.Millisecond
)

// ErrOverloaded is a request refused: no slot, and no room (or no time)
// to wait for one.
var ErrOverloaded = errors.New("overloaded")

// Limiter admits requests into a bounded number of slots.
type Limiter struct {
	opts Options

	mu       sync.Mutex
	inFlight int
	parked   int // requests that gave their slot back (Park)
	waiting  [classes][]*waiter
	queued   int
	// emptied is when the queue was last empty (it has not been since,
	// while queued > 0); overloaded, until when the limiter counts as
	// overloaded since it last refused a request or found its queue
	// standing (Options.StandingTimeout).
	emptied, overloaded time.Time
	grad                gradient                 // the adaptive limit, when Options.Adaptive
	done                [throughputWindow]second // requests completed, per second
	now                 func() time.Time

	// Counters, read by Stats.
	admitted, rejected [classes]uint64
}

type waiter struct {
	ready chan struct{} // closed when the slot is handed over
	done  bool          // handed over (guarded by Limiter.mu)
}

// New returns a limiter.
func New(o Options) *Limiter {
	if o.MaxInFlight == 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	if o.MinQueue <= 0 {
		o.MinQueue = DefaultMinQueue
	}
	if o.QueueTimeout == 0 {
		o.QueueTimeout = DefaultQueueTimeout
	}
	if o.StandingTimeout == 0 {
		o.StandingTimeout = min(DefaultStandingTimeout, o.QueueTimeout)
	}
	if o.MinInFlight <= 0 {
		o.MinInFlight = min(8, max(1, o.MaxInFlight))
	}
	if o.MaxParked == 0 {
		o.MaxParked = 16 * max(o.MaxInFlight, 1)
	}
	l := &Limiter{opts: o, now: time.Now}
	l.grad.limit = float64(o.MaxInFlight)
	return l
}

// limitLocked is how many requests may be in progress now.
func (l *Limiter) limitLocked() int {
	if !l.opts.Adaptive {
		return l.opts.MaxInFlight
	}
	return int(l.grad.limit)
}

// Off reports whether the limiter admits everything.
func (l *Limiter) Off() bool { return l == nil || l.opts.MaxInFlight < 0 }

// Acquire takes a slot for a request of class c, waiting in the queue if
// there is room for its class, until the queue timeout or ctx ends. The
// caller must call release exactly once.
func (l *Limiter) Acquire(ctx context.Context, c Class) (release func(), err error) {
	if l.Off() {
		return func() {}, nil
	}
	l.mu.Lock()
	if l.inFlight < l.limitLocked() && l.queued == 0 {
		l.inFlight++
		l.admitted[c]++
		l.mu.Unlock()
		return l.releaser(), nil
	}
	now := l.now()
	if float64(l.queued) >= float64(l.queueLimitLocked())*queueShare[c] {
		l.rejected[c]++
		l.refusedLocked(now)
		l.mu.Unlock()
		return nil, ErrOverloaded
	}
	if l.queued == 0 {
		l.emptied = now
	}
	wait := l.opts.QueueTimeout
	if l.overloadedLocked(now) {
		wait = l.opts.StandingTimeout
	}
	w := &waiter{ready: make(chan struct{})}
	l.waiting[c] = append(l.waiting[c], w)
	l.queued++
	l.mu.Unlock()

	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-w.ready:
		return l.releaser(), nil
	case <-t.C:
	case <-ctx.Done():
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.done { // handed a slot just as it gave up: use it
		return l.releaser(), nil
	}
	q := l.waiting[c]
	for i, o := range q {
		if o == w {
			l.waiting[c] = append(q[:i], q[i+1:]...)
			break
		}
	}
	now = l.now()
	l.dequeuedLocked(now)
	l.rejected[c]++
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.refusedLocked(now)
	return nil, ErrOverloaded
}

// releaser returns the release of a slot taken now: with an adaptive
// limit, the request's time in progress feeds it.
func (l *Limiter) releaser() func() {
	if !l.opts.Adaptive {
		return l.release
	}
	start := time.Now()
	return func() {
		l.mu.Lock()
		l.grad.observe(time.Since(start), l.inFlight, float64(l.opts.MinInFlight), float64(l.opts.MaxInFlight))
		l.mu.Unlock()
		l.release()
	}
}

// overloadHold is how many queue timeouts the limiter stays overloaded
// after it refused a request or found its queue standing: past capacity
// the queue empties now and then (the requests reach the limiter only as
// fast as the process parses them), and each moment it did made the next
// requests wait the long timeout again (up to 409 ms inside the server at
// 5C, against 205 ms with a fixed 10 ms wait).
const overloadHold = 10

// overloadedLocked reports whether the process is past its capacity, not
// in a burst (Options.StandingTimeout): the queue has not been empty for
// longer than the queue timeout, or the limiter refused a request or saw
// that within the last overloadHold queue timeouts.
func (l *Limiter) overloadedLocked(now time.Time) bool {
	if l.queued > 0 && now.Sub(l.emptied) > l.opts.QueueTimeout {
		l.refusedLocked(now)
	}
	return now.Before(l.overloaded)
}

// refusedLocked notes a request refused (or a standing queue) at now.
func (l *Limiter) refusedLocked(now time.Time) {
	l.overloaded = now.Add(overloadHold * l.opts.QueueTimeout)
}

// dequeuedLocked counts a waiter out of the queue at now.
func (l *Limiter) dequeuedLocked(now time.Time) {
	if l.queued--; l.queued == 0 {
		l.emptied = now
	}
}

// release frees a slot, handing it to the most important waiter (unless
// the limit shrank below what is in progress): the oldest of its class,
// or the newest while the queue stands (Options.StandingTimeout).
func (l *Limiter) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.completedLocked()
	for c := range classes {
		if l.inFlight > l.limitLocked() {
			break
		}
		if q := l.waiting[c]; len(q) > 0 {
			var w *waiter
			if l.overloadedLocked(now) {
				w, l.waiting[c] = q[len(q)-1], q[:len(q)-1]
			} else {
				w, l.waiting[c] = q[0], q[1:]
			}
			l.dequeuedLocked(now)
			w.done = true
			l.admitted[c]++
			close(w.ready)
			return // the slot passes on: inFlight is unchanged
		}
	}
	l.inFlight--
}

// throughputWindow is how many seconds of completions size the queue.
const throughputWindow = 10

type second struct {
	unix int64
	n    int
}

// completedLocked counts a completed request in its second, and returns
// the time.
func (l *Limiter) completedLocked() time.Time {
	t := l.now()
	now := t.Unix()
	b := &l.done[now%throughputWindow]
	if b.unix != now {
		*b = second{unix: now}
	}
	b.n++
	return t
}

// queueLimitLocked is how many requests may wait now: Options.MaxQueue,
// or the most completed in one of the last throughputWindow seconds times
// the queue timeout (see Options.MaxQueue).
func (l *Limiter) queueLimitLocked() int {
	if l.opts.MaxQueue != 0 {
		return max(0, l.opts.MaxQueue) // negative: nothing waits
	}
	now, peak := l.now().Unix(), 0
	for _, b := range l.done {
		if now-b.unix < throughputWindow {
			peak = max(peak, b.n)
		}
	}
	n := int(float64(peak) * l.opts.QueueTimeout.Seconds())
	return min(maxQueueCap, max(l.opts.MinQueue, n))
}

// Stats is a limiter's state and counters.
type Stats struct {
	InFlight, Queued  int
	Parked            int // in progress without a slot (Park)
	Limit, QueueLimit int
	// QueueAge is how long the queue has not been empty (0 when it is):
	// past the queue timeout, the process is overloaded and waits are
	// the standing timeout.
	QueueAge           time.Duration
	Admitted, Rejected map[string]uint64
}

// Stats returns the limiter's state.
func (l *Limiter) Stats() Stats {
	s := Stats{Admitted: map[string]uint64{}, Rejected: map[string]uint64{}}
	if l.Off() {
		return s
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s.InFlight, s.Queued, s.Limit, s.QueueLimit = l.inFlight, l.queued, l.limitLocked(), l.queueLimitLocked()
	s.Parked = l.parked
	if l.queued > 0 {
		s.QueueAge = l.now().Sub(l.emptied)
	}
	for c := range classes {
		s.Admitted[c.String()], s.Rejected[c.String()] = l.admitted[c], l.rejected[c]
	}
	return s
}

// gradient is an adaptive concurrency limit: every window of samples it
// compares the window's average latency with the latency without
// queueing (the shortest window average since the last probe). While the
// average stays within twice that floor, the limit grows by √limit a
// window; beyond, it shrinks in proportion (at most halving, smoothed):
//
//	limit' = limit × clamp(2 × floor / average, 0.5, 1)
//
// Either only while the limit is in use: a window in which the most
// requests in progress at once stayed under half the limit leaves it as
// it is (Netflix's Gradient2 does the same). Such a window's latency is
// the work's, not a queue's — a mix of reads and fsynced writes, a slow
// disk moment — and shrinking on it walked every storage node of a
// lightly loaded cluster (1,000 requests a second, half writes) down to
// the minimum within 25 s; the next burst, a few dozen retries after a
// failover, then stood in the queue and was refused as overloaded.
//
// Every gradientProbe windows the limit drops to its minimum for one
// window, whose average is the new floor (a floor learned under load
// would let the limit drift up with the queue it causes), and then goes
// back to what it was.
type gradient struct {
	limit   float64
	floor   time.Duration
	probing bool
	windows int
	sum     time.Duration
	n       int
	peak    int     // the most in progress at once this window
	resume  float64 // the limit to go back to after a probe
}

const (
	gradientWindow  = 50   // samples per adjustment
	gradientProbe   = 1000 // windows between probes of the floor
	gradientSmoothe = 0.2
)

func (g *gradient) observe(d time.Duration, inFlight int, lo, hi float64) {
	g.sum += max(d, time.Nanosecond)
	g.n++
	g.peak = max(g.peak, inFlight)
	if g.n < gradientWindow {
		return
	}
	avg, peak := g.sum/time.Duration(g.n), g.peak
	g.sum, g.n, g.peak = 0, 0, 0
	if g.probing {
		// The probe's window gave the floor; the limit goes back to
		// where it was (it could not climb back from the minimum in
		// windows that do not use it).
		g.floor, g.probing, g.limit = avg, false, g.resume
		return
	}
	if g.floor == 0 || avg < g.floor {
		g.floor = avg
	}
	ratio := math.Min(1, math.Max(0.5, 2*float64(g.floor)/float64(avg)))
	switch {
	case float64(peak) < g.limit/2:
		// Not in use: neither the cause of the latency nor short.
	case ratio < 1:
		g.limit = g.limit*(1-gradientSmoothe) + g.limit*ratio*gradientSmoothe
	default:
		g.limit += math.Sqrt(g.limit)
	}
	g.limit = math.Min(hi, math.Max(lo, g.limit))
	if g.windows++; g.windows >= gradientProbe {
		g.windows, g.resume, g.limit, g.probing = 0, g.limit, lo, true
	}
}

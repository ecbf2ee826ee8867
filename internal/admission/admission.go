// Package admission owns overload protection at a process's edge (the
// FollowFeed lessons, DESIGN.md §9): a bounded number of requests in
// progress, a short bounded queue in front of them, shedding by priority
// class (bulk first, then the change stream and snapshots, interactive
// reads and writes last), and request deadlines. A request it refuses is
// refused before anything reads its body.
//
// It never parses a request beyond its method, path and headers, never
// blocks longer than a request's deadline or the queue timeout, and holds
// nothing for a refused request.
package admission

import (
	"context"
	"errors"
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
	// (default 512; negative: no limit, the limiter is off).
	MaxInFlight int
	// MaxQueue is how many requests may wait for a slot (default 2048):
	// on two cores a storage node serves about 25,000 reads a second, so
	// a full queue drains in under 100 ms, far inside any client's
	// timeout, and its goroutines and buffers stay bounded.
	MaxQueue int
	// QueueTimeout is the longest a request waits for a slot (default
	// 1s; less if its deadline is sooner).
	QueueTimeout time.Duration
}

// Defaults.
const (
	DefaultMaxInFlight  = 512
	DefaultMaxQueue     = 2048
	DefaultQueueTimeout = time.Second
)

// ErrOverloaded is a request refused: no slot, and no room (or no time)
// to wait for one.
var ErrOverloaded = errors.New("overloaded")

// Limiter admits requests into a bounded number of slots.
type Limiter struct {
	opts Options

	mu       sync.Mutex
	inFlight int
	waiting  [classes][]*waiter
	queued   int

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
	if o.MaxQueue == 0 {
		o.MaxQueue = DefaultMaxQueue
	}
	if o.QueueTimeout == 0 {
		o.QueueTimeout = DefaultQueueTimeout
	}
	return &Limiter{opts: o}
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
	if l.inFlight < l.opts.MaxInFlight && l.queued == 0 {
		l.inFlight++
		l.admitted[c]++
		l.mu.Unlock()
		return l.release, nil
	}
	if float64(l.queued) >= float64(l.opts.MaxQueue)*queueShare[c] {
		l.rejected[c]++
		l.mu.Unlock()
		return nil, ErrOverloaded
	}
	w := &waiter{ready: make(chan struct{})}
	l.waiting[c] = append(l.waiting[c], w)
	l.queued++
	l.mu.Unlock()

	t := time.NewTimer(l.opts.QueueTimeout)
	defer t.Stop()
	select {
	case <-w.ready:
		return l.release, nil
	case <-t.C:
	case <-ctx.Done():
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.done { // handed a slot just as it gave up: use it
		return l.release, nil
	}
	q := l.waiting[c]
	for i, o := range q {
		if o == w {
			l.waiting[c] = append(q[:i], q[i+1:]...)
			break
		}
	}
	l.queued--
	l.rejected[c]++
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return nil, ErrOverloaded
}

// release frees a slot, handing it to the most important waiter.
func (l *Limiter) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range classes {
		if q := l.waiting[c]; len(q) > 0 {
			w := q[0]
			l.waiting[c] = q[1:]
			l.queued--
			w.done = true
			l.admitted[c]++
			close(w.ready)
			return // the slot passes on: inFlight is unchanged
		}
	}
	l.inFlight--
}

// Stats is a limiter's state and counters.
type Stats struct {
	InFlight, Queued   int
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
	s.InFlight, s.Queued = l.inFlight, l.queued
	for c := range classes {
		s.Admitted[c.String()], s.Rejected[c.String()] = l.admitted[c], l.rejected[c]
	}
	return s
}

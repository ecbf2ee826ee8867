package admission

import "context"

// Parking: a slot bounds the work a process does at once, not the time
// its requests wait on other processes. A storage node's semi-sync write
// is done once it has committed; what remains is waiting for a replica's
// acknowledgement. While a relay is cut off that wait lasts seconds, and
// writes holding their slots through it took every slot of the node
// (its adaptive limit shrinking to 8 as their latency grew): the node then
// refused every read and write, of every partition, as overloaded — and
// writes to partitions whose masters could not commit gave their slaves
// no sign that the relay had fallen behind (docs/jepsen.md, pause-relay).
// CockroachDB's admission control likewise holds a slot only while a
// request evaluates, not while it waits for replication.
//
// A parked request gives its slot back at once (an adaptive limit sees
// the time until then: its work) and goes on without one; the process
// still holds its goroutine and request until it ends, within its
// deadline. Options.MaxParked bounds how many do so at once.

// slot is the slot a request holds, carried in its context for Park.
type slot struct {
	l       *Limiter
	release func()
	parked  bool
}

type slotKey struct{}

// Hold returns ctx carrying the slot that release gives back, for Park,
// and the function that ends the request: it gives the slot back unless
// Park did. Both are called from the request's goroutine.
func (l *Limiter) Hold(ctx context.Context, release func()) (context.Context, func()) {
	if l.Off() {
		return ctx, release
	}
	s := &slot{l: l, release: release}
	return context.WithValue(ctx, slotKey{}, s), s.end
}

func (s *slot) end() {
	if !s.parked {
		s.release()
		return
	}
	s.l.mu.Lock()
	s.l.parked--
	s.l.mu.Unlock()
}

// Park gives back the slot of the request ctx belongs to while it waits
// for other processes (a write for its replicas' acknowledgements), if
// it holds one through Hold, has not parked yet, and fewer than
// Options.MaxParked requests are parked. It reports whether it did.
func Park(ctx context.Context) bool {
	s, _ := ctx.Value(slotKey{}).(*slot)
	if s == nil || s.parked {
		return false
	}
	l := s.l
	l.mu.Lock()
	if l.opts.MaxParked < 0 || l.parked >= l.opts.MaxParked {
		l.mu.Unlock()
		return false
	}
	l.parked++
	l.mu.Unlock()
	s.parked = true
	s.release()
	return true
}

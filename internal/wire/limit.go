package wire

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// LimitConns bounds the connections open at once through ln to max. A
// connection beyond it is not accepted: it waits in the kernel's accept
// queue, where it costs this process nothing, until another closes, and
// a client that gives up meanwhile costs it nothing either. This is the
// FollowFeed post's lesson (let the accept queue push back): answering
// each request past capacity with 503 costs about what a cheap answer
// does, and under five times the load those answers took the cores the
// real work needed (docs/performance.md, the overload test).
//
// So that idle kept-alive connections do not hold the places, a full
// listener closes the connection that has been idle longest, once it
// has been idle for minIdle; an http.Server reports idleness through
// ConnState.
func LimitConns(ln net.Listener, max int) *ConnLimit {
	return &ConnLimit{Listener: ln, slots: make(chan struct{}, max), idle: map[net.Conn]time.Time{}, closed: make(chan struct{}), minIdle: minIdle}
}

// minIdle is how long a connection must have been idle before a full
// listener closes it for a new one: under load a connection is idle only
// between its client's requests, and closing it then would make the
// client dial again.
const minIdle = time.Second

// retryEvict is how often a full listener looks again for an idle
// connection to close.
const retryEvict = 50 * time.Millisecond

// ConnLimit is a listener bounding its open connections (LimitConns).
type ConnLimit struct {
	net.Listener
	slots                chan struct{} // one per open connection
	closed               chan struct{}
	closeOnce            sync.Once
	open, full, nEvicted atomic.Int64
	minIdle              time.Duration

	mu   sync.Mutex
	idle map[net.Conn]time.Time // HTTP connections between requests, since when
}

// Accept returns the next connection once one may be open, closing the
// longest-idle connection to make room if the listener is full.
func (l *ConnLimit) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	default:
		l.full.Add(1)
		if err := l.waitForSlot(); err != nil {
			return nil, err
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	l.open.Add(1)
	return &limitedConn{Conn: c, l: l}, nil
}

func (l *ConnLimit) waitForSlot() error {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case l.slots <- struct{}{}:
			return nil
		case <-l.closed:
			return net.ErrClosed
		case <-t.C:
			l.evict()
			t.Reset(retryEvict)
		}
	}
}

// evict closes the connection idle longest, if it has been idle minIdle.
func (l *ConnLimit) evict() {
	l.mu.Lock()
	var oldest net.Conn
	var since time.Time
	for c, t := range l.idle {
		if oldest == nil || t.Before(since) {
			oldest, since = c, t
		}
	}
	if oldest == nil || time.Since(since) < l.minIdle {
		l.mu.Unlock()
		return
	}
	delete(l.idle, oldest)
	l.mu.Unlock()
	l.nEvicted.Add(1)
	oldest.Close()
}

// ConnState is an http.Server's ConnState hook: it tells the listener
// which connections are idle between requests.
func (l *ConnLimit) ConnState(c net.Conn, s http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s == http.StateIdle {
		l.idle[c] = time.Now()
	} else {
		delete(l.idle, c)
	}
}

// Close stops accepting, also in an Accept waiting for a slot.
func (l *ConnLimit) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// Open is how many accepted connections are open.
func (l *ConnLimit) Open() int64 { return l.open.Load() }

// Full is how many times a connection had to wait because the listener
// held its maximum.
func (l *ConnLimit) Full() int64 { return l.full.Load() }

// Evicted is how many idle connections were closed to make room.
func (l *ConnLimit) Evicted() int64 { return l.nEvicted.Load() }

type limitedConn struct {
	net.Conn
	l    *ConnLimit
	once sync.Once
}

func (c *limitedConn) Close() error {
	c.once.Do(func() {
		c.l.open.Add(-1)
		<-c.l.slots
	})
	return c.Conn.Close()
}

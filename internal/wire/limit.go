package wire

import (
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// LimitConns bounds the connections open at once through ln to max: a
// connection beyond it is accepted and closed at once, so its client
// fails fast (and may try another replica) instead of waiting in the
// kernel's accept queue or costing this process a goroutine and buffers.
// The FollowFeed post's lesson: under overload, refuse connections early.
// Refused counts them.
func LimitConns(ln net.Listener, max int) *ConnLimit {
	return &ConnLimit{Listener: ln, max: int64(max)}
}

// ConnLimit is a listener bounding its open connections (LimitConns).
type ConnLimit struct {
	net.Listener
	max           int64
	open, refused atomic.Int64

	mu    sync.Mutex
	conns []*limitedConn // the open ones, for Waiting's samples

	// Waiting's estimate, and when it is next due (UnixNano).
	waiting, due atomic.Int64
	sampling     atomic.Bool
}

// Accept returns the next connection within the bound, closing those
// beyond it.
func (l *ConnLimit) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) <= l.max {
			lc := &limitedConn{Conn: c, l: l}
			l.mu.Lock()
			lc.at = len(l.conns)
			l.conns = append(l.conns, lc)
			l.mu.Unlock()
			return lc, nil
		}
		l.open.Add(-1)
		l.refused.Add(1)
		c.Close()
	}
}

// Open is how many accepted connections are open.
func (l *ConnLimit) Open() int64 { return l.open.Load() }

// Refused is how many connections were closed as over the bound.
func (l *ConnLimit) Refused() int64 { return l.refused.Load() }

// Sampling of Waiting: how many connections it reads, and how often.
const (
	waitingSample = 128
	waitingEvery  = 50 * time.Millisecond
)

// Waiting estimates how many open connections hold bytes this process
// has not read. Past capacity each is a request the kernel keeps and no
// admission has seen yet: a queue that only the number of connections
// bounds (HTTP/1.1 sends one request a connection at a time). An idle
// kept-alive connection holds none. It reads the receive queues of up to waitingSample
// connections picked at random, at most every waitingEvery (the calls
// between get the last estimate); 0 where the platform cannot tell.
func (l *ConnLimit) Waiting() int64 {
	now := time.Now().UnixNano()
	if now < l.due.Load() || !l.sampling.CompareAndSwap(false, true) {
		return l.waiting.Load()
	}
	defer l.sampling.Store(false)
	l.due.Store(now + int64(waitingEvery))
	l.mu.Lock()
	n := len(l.conns)
	sample := make([]*limitedConn, 0, min(n, waitingSample))
	if n <= waitingSample {
		sample = append(sample, l.conns...)
	} else {
		for range waitingSample {
			sample = append(sample, l.conns[rand.IntN(n)])
		}
	}
	l.mu.Unlock()
	var read, holding int
	for _, c := range sample {
		if b, ok := unread(c.Conn); ok {
			read++
			if b > 0 {
				holding++
			}
		}
	}
	est := int64(0)
	if read > 0 {
		est = int64(holding) * int64(n) / int64(read)
	}
	l.waiting.Store(est)
	return est
}

type limitedConn struct {
	net.Conn
	l    *ConnLimit
	at   int // index in l.conns (guarded by l.mu)
	once sync.Once
}

func (c *limitedConn) Close() error {
	c.once.Do(func() {
		c.l.open.Add(-1)
		c.l.mu.Lock()
		last := len(c.l.conns) - 1
		moved := c.l.conns[last]
		c.l.conns[c.at], moved.at = moved, c.at
		c.l.conns[last] = nil
		c.l.conns = c.l.conns[:last]
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}

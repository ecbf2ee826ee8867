package wire

import (
	"net"
	"sync"
	"sync/atomic"
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
			return &limitedConn{Conn: c, l: l}, nil
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

type limitedConn struct {
	net.Conn
	l    *ConnLimit
	once sync.Once
}

func (c *limitedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}

//go:build linux

package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"time"

	"golang.org/x/sys/unix"
)

// offerEvents is offer on one goroutine's event loop (epoll and a
// timerfd), as wrk is built, rather than a goroutine per connection.
//
// With a goroutine per connection the generator answered to Go's
// scheduler: past a server's capacity it held thousands of connections'
// goroutines on the two cores it shares with the servers, and a ready
// connection waited for the runtime's network poll, which a busy process
// makes only when its run queues are empty or every 10 ms (sysmon), 128
// connections a poll. Answers then sat unread in its sockets (3,000–
// 5,900 at 2C) and dials took a median of 290–360 ms, all of it counted
// in the latency of the requests it measured. Here one loop sends what
// is due, reads what is ready, and times out what is late, in that
// order, and never uses more than one core.
//
// It keeps offer's semantics: the same schedule, the same pool (an idle
// connection is used, else one is dialled within maxConns and
// redialRate), the same timeouts and answers.
func offerEvents(ctx context.Context, base string, rate float64, d, timeout time.Duration, l openLoad) error {
	u, err := url.Parse(base)
	if err != nil {
		return err
	}
	addr, err := net.ResolveTCPAddr("tcp", u.Host)
	if err != nil {
		return err
	}
	g := &eventLoop{l: l, host: u.Host, timeout: timeout, conns: map[int32]*evConn{}}
	if ip := addr.IP.To4(); ip != nil {
		g.family, g.sa = unix.AF_INET, &unix.SockaddrInet4{Port: addr.Port, Addr: [4]byte(ip)}
		g.loopback = ip.IsLoopback()
	} else {
		g.family, g.sa = unix.AF_INET6, &unix.SockaddrInet6{Port: addr.Port, Addr: [16]byte(addr.IP.To16())}
	}
	if g.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return fmt.Errorf("bench: epoll: %w", err)
	}
	defer unix.Close(g.ep)
	if g.timer, err = unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC); err != nil {
		return fmt.Errorf("bench: timerfd: %w", err)
	}
	defer unix.Close(g.timer)
	if err := unix.EpollCtl(g.ep, unix.EPOLL_CTL_ADD, g.timer, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(g.timer)}); err != nil {
		return fmt.Errorf("bench: epoll: %w", err)
	}
	defer g.closeAll()
	g.bw = bufio.NewWriterSize(&g.out, 4<<10)
	g.br = bufio.NewReaderSize(&g.rd, 4<<10)
	g.scratch = make([]byte, 64<<10)
	events := make([]unix.EpollEvent, 1024)

	interval := time.Duration(float64(time.Second) / rate)
	n := int(d / interval)
	start := time.Now().Add(50 * time.Millisecond)
	g.budget, g.last = maxConns, start
	for i := 0; ; {
		now := time.Now()
		scheduling := i < n && ctx.Err() == nil
		for ; scheduling && i < n; i++ {
			at := start.Add(time.Duration(i) * interval)
			if at.After(now) {
				break
			}
			g.send(at)
		}
		g.expire(time.Now())
		if !scheduling && g.busy == 0 {
			return ctx.Err()
		}
		// Sleep until the next request is due, the next deadline
		// passes, or a connection is ready; at most 50 ms, so that a
		// cancelled context is seen.
		now = time.Now()
		wake := now.Add(50 * time.Millisecond)
		if i < n && scheduling {
			wake = earliest(wake, start.Add(time.Duration(i)*interval))
		}
		if g.dhead < len(g.deadlines) {
			wake = earliest(wake, g.deadlines[g.dhead].at)
		}
		wait := 0
		if wake.After(now) {
			if err := g.arm(wake.Sub(now)); err != nil {
				return err
			}
			wait = -1
		}
		nev, err := unix.EpollWait(g.ep, events, wait)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("bench: epoll: %w", err)
		}
		for _, ev := range events[:max(nev, 0)] {
			if int(ev.Fd) == g.timer {
				var b [8]byte
				unix.Read(g.timer, b[:])
				continue
			}
			if c := g.conns[ev.Fd]; c != nil {
				g.ready(c, ev.Events)
			}
		}
	}
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// eventLoop is offerEvents' state, owned by its one goroutine.
type eventLoop struct {
	l       openLoad
	host    string
	timeout time.Duration
	family  int
	sa      unix.Sockaddr
	ep      int // epoll
	timer   int // timerfd: the loop's next wake-up
	// loopback: the server is on 127.0.0.0/8, and each dial comes from
	// the next address of 127.1.1.1–127.1.250.250 (source counts them).
	loopback bool
	source   uint32

	conns map[int32]*evConn // open connections by descriptor
	idle  []*evConn         // connections waiting for a request, newest last (closed ones skipped)
	// deadlines are the requests in flight (and dials) in the order
	// they time out, which is the order they were due: an entry whose
	// connection has moved on (seq) is stale.
	deadlines []evDeadline
	dhead     int // deadlines before it are done
	busy      int // requests in flight, dials included

	budget float64   // dials that may be spent (offer's token bucket)
	last   time.Time // when budget was last refilled
	seed   uint64

	out     bytes.Buffer // a request being built
	bw      *bufio.Writer
	rd      bytes.Reader // what a connection has read, as br's source
	br      *bufio.Reader
	tail    tailWriter
	scratch []byte
}

// evConn is one connection of the pool.
type evConn struct {
	fd    int
	state evState
	r     *rand.Rand
	seq   uint64 // counts the requests sent on it: a deadline's key
	// The request in flight: its due time, how late it left, whether
	// its connection was dialled for it, and whether it writes.
	due           time.Time
	late          time.Duration
	dialed, write bool
	out           []byte // the request's bytes not yet written
	in            []byte // bytes read, not yet an answer
	wantOut       bool   // registered for EPOLLOUT
}

type evState uint8

const (
	evDialling evState = iota
	evBusy
	evIdle
	evClosed
)

type evDeadline struct {
	c   *evConn
	seq uint64
	at  time.Time
}

// send sends the request due at on an idle connection, or on one it
// dials, or fails it unsent.
func (g *eventLoop) send(at time.Time) {
	for len(g.idle) > 0 {
		c := g.idle[len(g.idle)-1]
		g.idle = g.idle[:len(g.idle)-1]
		if c.state == evIdle {
			g.start(c, at, false)
			return
		}
	}
	g.budget, g.last = min(maxConns, g.budget+at.Sub(g.last).Seconds()*redialRate), at
	if len(g.conns) >= maxConns || g.budget < 1 {
		g.l.answer(at, 0, answer{problem: "unsent"})
		return
	}
	g.budget--
	g.dial(at)
}

func (g *eventLoop) dial(at time.Time) {
	notConnected := func() { g.l.answer(at, time.Since(at), answer{problem: "not connected"}) }
	fd, err := unix.Socket(g.family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		notConnected()
		return
	}
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1) // as net.Dial sets it
	if g.loopback {
		// From an address of its own in 127.0.0.0/8, as clients on
		// many machines would come: tens of thousands of dials a step
		// from one address to one port leave its ephemeral ports in
		// TIME_WAIT, and the kernel then searches for a free one on
		// every connect (220 µs of the generator's CPU a dial at 2C,
		// profiled). The port is still chosen at connect.
		unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
		a := g.source % (250 * 250)
		g.source++
		unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 1, byte(1 + a/250), byte(1 + a%250)}})
	}
	err = unix.Connect(fd, g.sa)
	if err != nil && !errors.Is(err, unix.EINPROGRESS) {
		unix.Close(fd)
		notConnected()
		return
	}
	if unix.EpollCtl(g.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP, Fd: int32(fd)}) != nil {
		unix.Close(fd)
		notConnected()
		return
	}
	g.seed++
	c := &evConn{fd: fd, state: evDialling, r: rand.New(rand.NewPCG(g.seed, 7)), due: at, dialed: true, wantOut: true}
	g.conns[int32(fd)] = c
	g.busy++
	g.deadlines = append(g.deadlines, evDeadline{c, c.seq, at.Add(g.timeout)})
}

// start sends a request due at on c, idle or just connected.
func (g *eventLoop) start(c *evConn, at time.Time, dialed bool) {
	if c.state == evIdle {
		g.busy++
		c.seq++
		g.deadlines = append(g.deadlines, evDeadline{c, c.seq, at.Add(g.timeout)})
	}
	c.state, c.due, c.dialed = evBusy, at, dialed
	c.late = time.Since(at)
	g.out.Reset()
	c.write = g.l.write(g.bw, c.r, g.host)
	g.bw.Flush()
	c.out = append(c.out[:0], g.out.Bytes()...)
	g.flush(c)
}

// flush writes what c has to write, waiting for EPOLLOUT when the socket
// is full.
func (g *eventLoop) flush(c *evConn) {
	for len(c.out) > 0 {
		n, err := unix.Write(c.fd, c.out)
		if errors.Is(err, unix.EAGAIN) {
			break
		}
		if err != nil {
			g.fail(c, "timeout")
			return
		}
		c.out = c.out[n:]
	}
	if want := len(c.out) > 0; want != c.wantOut {
		ev := uint32(unix.EPOLLIN | unix.EPOLLRDHUP)
		if want {
			ev |= unix.EPOLLOUT
		}
		unix.EpollCtl(g.ep, unix.EPOLL_CTL_MOD, c.fd, &unix.EpollEvent{Events: ev, Fd: int32(c.fd)})
		c.wantOut = want
	}
}

// ready handles c's events.
func (g *eventLoop) ready(c *evConn, ev uint32) {
	if c.state == evDialling {
		if ev&(unix.EPOLLOUT|unix.EPOLLERR|unix.EPOLLHUP) == 0 {
			return
		}
		if e, err := unix.GetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || e != 0 {
			due := c.due
			g.busy--
			g.close(c)
			g.l.answer(due, time.Since(due), answer{problem: "not connected"})
			return
		}
		g.start(c, c.due, true)
		return
	}
	if ev&unix.EPOLLOUT != 0 && c.state == evBusy && len(c.out) > 0 {
		g.flush(c)
	}
	if c.state == evClosed || ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) == 0 {
		return
	}
	eof := false
	for {
		n, err := unix.Read(c.fd, g.scratch)
		if n > 0 {
			c.in = append(c.in, g.scratch[:n]...)
		}
		if errors.Is(err, unix.EAGAIN) {
			break
		}
		if err != nil || n == 0 {
			eof = true
			break
		}
		if n < len(g.scratch) {
			break // level-triggered: the rest, if any, wakes the loop again
		}
	}
	if c.state != evBusy {
		g.close(c) // an idle connection closed, or sent what nobody asked
		return
	}
	g.parse(c, eof)
}

// parse completes c's request when its answer has arrived.
func (g *eventLoop) parse(c *evConn, eof bool) {
	// A dry run first, so that a part answer's bytes reach neither the
	// problem nor the tail twice.
	g.rd.Reset(c.in)
	g.br.Reset(&g.rd)
	_, _, err := readAnswer(g.br, nil, eof)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		if eof {
			g.fail(c, "timeout") // cut off
		}
		return
	}
	if err != nil {
		g.fail(c, "timeout")
		return
	}
	var tail *tailWriter
	if g.l.tail {
		tail = &g.tail
	}
	g.rd.Reset(c.in)
	g.br.Reset(&g.rd)
	a, alive, _ := readAnswer(g.br, tail, eof)
	rest := g.rd.Len() + g.br.Buffered()
	a.sent, a.dialed, a.late, a.write = true, c.dialed, c.late, c.write
	g.busy--
	c.seq++
	c.in = c.in[:copy(c.in, c.in[len(c.in)-rest:])]
	if alive && !eof && rest == 0 && len(c.out) == 0 {
		c.state = evIdle
		g.idle = append(g.idle, c)
	} else {
		g.close(c)
	}
	g.l.answer(c.due, time.Since(c.due), a)
}

// fail ends c's request in flight with problem and closes c.
func (g *eventLoop) fail(c *evConn, problem string) {
	if c.state != evBusy {
		return
	}
	g.busy--
	c.seq++
	g.close(c)
	g.l.answer(c.due, time.Since(c.due), answer{problem: problem, sent: true, dialed: c.dialed, late: c.late, write: c.write})
}

// expire times out the requests and dials whose deadline has passed.
func (g *eventLoop) expire(now time.Time) {
	for ; g.dhead < len(g.deadlines) && !g.deadlines[g.dhead].at.After(now); g.dhead++ {
		e := g.deadlines[g.dhead]
		if e.c.seq != e.seq {
			continue
		}
		switch e.c.state {
		case evBusy:
			g.fail(e.c, "timeout")
		case evDialling:
			g.busy--
			g.close(e.c)
			g.l.answer(e.c.due, time.Since(e.c.due), answer{problem: "not connected"})
		}
	}
	if g.dhead > 1024 && g.dhead > len(g.deadlines)/2 {
		n := copy(g.deadlines, g.deadlines[g.dhead:])
		clear(g.deadlines[n:])
		g.deadlines, g.dhead = g.deadlines[:n], 0
	}
	// The idle stack keeps closed connections until they are popped;
	// drop them when they outnumber the open ones.
	if len(g.idle) > 2*len(g.conns)+64 {
		open := g.idle[:0]
		for _, c := range g.idle {
			if c.state == evIdle {
				open = append(open, c)
			}
		}
		clear(g.idle[len(open):])
		g.idle = open
	}
}

func (g *eventLoop) close(c *evConn) {
	if c.state == evClosed {
		return
	}
	c.state = evClosed
	delete(g.conns, int32(c.fd))
	unix.Close(c.fd) // which takes it out of the epoll set
}

func (g *eventLoop) closeAll() {
	for _, c := range g.conns {
		g.close(c)
	}
}

// arm sets the timer to fire after d.
func (g *eventLoop) arm(d time.Duration) error {
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(max(d.Nanoseconds(), 1000))}
	if err := unix.TimerfdSettime(g.timer, 0, &spec, nil); err != nil {
		return fmt.Errorf("bench: timerfd: %w", err)
	}
	return nil
}

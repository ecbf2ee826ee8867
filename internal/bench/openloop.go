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
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// An open-loop generator cheap enough to offer several times a server's
// capacity from the same two cores: net/http's client costs tens of
// microseconds and a goroutine per request, so at high multiples it
// starved the servers it measured (and every request left late, counted
// from when it was due). This one sends each request, at its due time,
// on an idle HTTP/1.1 connection of its own pool, dialling a new one when
// none is idle (up to maxConns) — never behind another request, as
// pipelining would: a request the server holds in its queue must not
// hold back the next.

// maxConns bounds the connections the generator holds open at once (the
// servers' default --max-conns is 4096: beyond it they close connections
// at once), and is how many it may dial at the start of a step. After
// those, a connection closed (its request timed out, or the server
// refused it) is replaced at most redialRate times a second, as a client
// with backoff on failed connections replaces them; a request finding no
// idle connection and no dial to spend fails unsent. Redialling at once
// was tried (2026-11-24): the generator spent a whole core dialling, the
// protected server's connection bound closed most of them, and both
// servers served 0.03–0.13C from 1.0C on — a reconnection storm of this
// generator's making. Never redialling (a budget of maxConns dials a
// step) starved the protected server at 5C instead: the connections
// beyond its bound, closed at once, and those whose requests timed out
// were gone for the rest of the step.
const (
	maxConns   = 16384
	redialRate = 1000
)

// loopResult is what openLoop measured.
type loopResult struct {
	// lat holds the latencies of the requests that succeeded; reads and
	// writes split them (the mix's GETs and PUTs).
	lat, reads, writes []time.Duration
	// late holds, for each request sent, how long after its due time it
	// left (after its connection's dial, for the first on a
	// connection): on two cores shared with the server, the generator's
	// own delay, which counts in the latency.
	late []time.Duration
	// failed is how many requests did not succeed, dials how many
	// connections the generator opened.
	failed, dials int
}

// openLoop offers the mix at rate to base for d: request i is due at
// start + i/rate. A request answered within timeout of its due time with
// a status below 300 or 404 succeeds, its latency counted from its due
// time; one not answered by then fails and its connection is closed, as
// a client that gives up closes it. A request that finds no idle
// connection and may not dial one (maxConns, redialRate) fails unsent.
func openLoop(ctx context.Context, o Options, base string, rate float64, d, timeout time.Duration) (loopResult, error) {
	doc := docJSON(o.DocBytes)
	var mu sync.Mutex
	var res loopResult
	err := offer(ctx, base, rate, d, timeout, openLoad{
		write: func(bw *bufio.Writer, r *rand.Rand, host string) bool { return writeMix(bw, r, o, host, doc) },
		answer: func(_ time.Time, took time.Duration, a answer) {
			mu.Lock()
			defer mu.Unlock()
			if a.sent {
				res.late = append(res.late, a.late)
				if a.dialed {
					res.dials++
				}
			}
			if succeeded(a.status) && took <= timeout {
				res.lat = append(res.lat, took)
				if a.write {
					res.writes = append(res.writes, took)
				} else {
					res.reads = append(res.reads, took)
				}
			} else {
				res.failed++
			}
		},
	})
	return res, err
}

// openLoad is what an open-loop run sends and where its answers go.
type openLoad struct {
	// write appends a request to bw (host is the Host header's) and
	// says whether it writes (its answer's write).
	write func(bw *bufio.Writer, r *rand.Rand, host string) (writes bool)
	// answer is called once for each request of the schedule, from
	// any goroutine, with its due time and latency from it.
	answer func(due time.Time, took time.Duration, a answer)
	// tail keeps each answer's last bytes (answer.tail); without it a
	// body is discarded as it is read.
	tail bool
}

// answer is what became of a request: its status (0 when it got none:
// timed out, cut off, or never sent) and, for a status of 500 or more,
// the problem type of the body.
type answer struct {
	status  int
	problem string
	// sent says whether the request was written (or begun) at all, late
	// how long after its due time that began, and dialed whether its
	// connection was dialled for it.
	sent, dialed bool
	late         time.Duration
	// write says whether the request was a write (openLoad.write).
	write bool
	// tail is the body's last bytes (up to tailBytes: a stream's end
	// line) when the load asks for them, valid only during its answer
	// call.
	tail []byte
}

const tailBytes = 256

// offer sends l's requests at rate to base for d, open loop, as openLoop
// describes.
func offer(ctx context.Context, base string, rate float64, d, timeout time.Duration, l openLoad) error {
	u, err := url.Parse(base)
	if err != nil {
		return err
	}
	interval := time.Duration(float64(time.Second) / rate)
	n := int(d / interval)
	g := &generator{l: l, host: u.Host, timeout: timeout, work: make(chan time.Time)}
	if ip := net.ParseIP(u.Hostname()); ip != nil && ip.To4() != nil && ip.IsLoopback() && bindNoPort != nil {
		g.spread = true
	}
	start := time.Now().Add(50 * time.Millisecond)
	var open atomic.Int64
	dials, last, seed := float64(maxConns), start, uint64(0)
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		if err := waitUntil(ctx, at); err != nil {
			break
		}
		select {
		case g.work <- at:
			continue
		default:
		}
		dials, last = min(maxConns, dials+at.Sub(last).Seconds()*redialRate), at
		if open.Load() >= maxConns || dials < 1 {
			l.answer(at, 0, answer{problem: "unsent"})
			continue
		}
		dials--
		open.Add(1)
		seed++
		s := seed
		g.wg.Go(func() {
			defer open.Add(-1)
			g.connection(s, at)
		})
	}
	close(g.work)
	g.wg.Wait()
	return ctx.Err()
}

// generator is offer's pool of connections.
type generator struct {
	l       openLoad
	host    string
	timeout time.Duration
	work    chan time.Time // due times of requests to send
	wg      sync.WaitGroup
	// spread: the server is on 127.0.0.0/8, and each dial comes from
	// the next address of 127.1.1.1–127.1.250.250 (sources counts them).
	spread  bool
	sources atomic.Uint32
}

// dial connects to the server within timeout. Spread over addresses of
// its own, as clients on many machines would come: tens of thousands of
// dials a step from one address to one port leave its ephemeral ports
// (32768–60999) in TIME_WAIT, and the kernel then searched them for a
// free one on every connect (220 µs of the generator's CPU a dial at 2C,
// profiled; 25 µs spread). The port is still chosen at connect
// (IP_BIND_ADDRESS_NO_PORT).
func (g *generator) dial(timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	if g.spread {
		a := g.sources.Add(1) % (250 * 250)
		d.LocalAddr = &net.TCPAddr{IP: net.IPv4(127, 1, byte(1+a/250), byte(1+a%250))}
		d.Control = bindNoPort
	}
	return d.Dial("tcp", g.host)
}

// connection dials, sends first, then whatever work comes while it is
// idle, until the work ends or the connection fails.
func (g *generator) connection(seed uint64, first time.Time) {
	r := rand.New(rand.NewPCG(seed, 7))
	c, err := g.dial(time.Until(first.Add(g.timeout)))
	if err != nil {
		g.l.answer(first, time.Since(first), answer{problem: "not connected"})
		return
	}
	defer c.Close()
	bw, br := bufio.NewWriterSize(c, 4<<10), bufio.NewReaderSize(c, 4<<10)
	var tail *tailWriter
	if g.l.tail {
		tail = &tailWriter{}
	}
	for at, dialed := first, true; ; dialed = false {
		late := time.Since(at)
		c.SetDeadline(at.Add(g.timeout))
		writes := g.l.write(bw, r, g.host)
		a, alive := roundTrip(bw, br, tail)
		a.sent, a.dialed, a.late, a.write = true, dialed, late, writes
		g.l.answer(at, time.Since(at), a)
		if !alive {
			return
		}
		var more bool
		if at, more = <-g.work; !more {
			return
		}
	}
}

// roundTrip sends what bw holds and reads the answer; alive if the
// connection can carry another request. With tail, the answer keeps the
// body's last bytes; without, the body is discarded.
//
// It reads the response itself — the status line, the three headers it
// needs, the body by its length or its chunks — in place in br:
// net/http's ReadResponse and a JSON decoder for a refusal's problem cost
// 15–20 µs and 35 KB a refusal, more than half a core at 2C of the two
// the generator shares with the servers it measures.
func roundTrip(bw *bufio.Writer, br *bufio.Reader, tail *tailWriter) (a answer, alive bool) {
	if err := bw.Flush(); err != nil {
		return answer{problem: "timeout"}, false
	}
	h, err := readHead(br)
	if err != nil {
		return answer{problem: "timeout"}, false
	}
	var keep func([]byte)
	var problem []byte
	if tail != nil {
		tail.b = tail.b[:0]
	}
	if h.status >= 500 || tail != nil {
		keep = func(b []byte) {
			if n := maxProblemBytes - len(problem); h.status >= 500 && n > 0 {
				problem = append(problem, b[:min(n, len(b))]...)
			}
			if tail != nil {
				tail.Write(b)
			}
		}
	}
	switch {
	case h.status == http.StatusNoContent || h.status == http.StatusNotModified || h.status < 200:
	case h.chunked:
		err = readChunks(br, keep)
	case h.length >= 0:
		err = readN(br, h.length, keep)
	default:
		// Delimited by the connection's end.
		err, h.closing = readN(br, -1, keep), true
		if err == io.EOF {
			err = nil
		}
	}
	if err != nil {
		return answer{problem: "timeout"}, false
	}
	a.status = h.status
	a.problem = problemType(problem)
	if tail != nil {
		a.tail = tail.b
	}
	return a, !h.closing
}

// maxProblemBytes is how much of a 5xx body is searched for its problem
// type.
const maxProblemBytes = 4 << 10

// head is what roundTrip needs of a response's head.
type head struct {
	status           int
	length           int // -1: none given
	chunked, closing bool
}

var errResponse = errors.New("bench: malformed HTTP response")

// readHead reads a response's status line and headers.
func readHead(br *bufio.Reader) (h head, err error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return h, err
	}
	// "HTTP/1.1 200 OK"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
		return h, errResponse
	}
	if h.status, err = strconv.Atoi(string(line[9:12])); err != nil {
		return h, errResponse
	}
	h.closing = line[7] == '0' // HTTP/1.0 closes unless told otherwise
	h.length = -1
	for {
		if line, err = br.ReadSlice('\n'); err != nil {
			return h, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			return h, nil
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return h, errResponse
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if h.length, err = strconv.Atoi(string(value)); err != nil || h.length < 0 {
				return h, errResponse
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			h.chunked = hasToken(value, "chunked")
		case bytes.EqualFold(name, []byte("Connection")):
			h.closing = hasToken(value, "close")
		}
	}
}

// readN consumes n bytes of br (n < 0: up to its end, returning io.EOF
// there), passing them to keep when it is set.
func readN(br *bufio.Reader, n int, keep func([]byte)) error {
	for n != 0 {
		want := br.Size()
		if n > 0 {
			want = min(n, want)
		}
		b, err := br.Peek(want)
		if len(b) > 0 {
			if keep != nil {
				keep(b)
			}
			br.Discard(len(b))
			if n > 0 {
				n -= len(b)
			}
		}
		if err != nil && (n != 0 || len(b) == 0) {
			return err
		}
	}
	return nil
}

// readChunks consumes a chunked body and its trailer.
func readChunks(br *bufio.Reader, keep func([]byte)) error {
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return err
		}
		size, _, _ := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte(";"))
		n, err := strconv.ParseUint(string(bytes.TrimSpace(size)), 16, 31)
		if err != nil {
			return errResponse
		}
		if n == 0 {
			for {
				if line, err = br.ReadSlice('\n'); err != nil {
					return err
				}
				if len(bytes.TrimRight(line, "\r\n")) == 0 {
					return nil
				}
			}
		}
		if err := readN(br, int(n), keep); err != nil {
			return err
		}
		if err := readN(br, 2, nil); err != nil { // the chunk's CRLF
			return err
		}
	}
}

// problemType is the short problem type ("overloaded") of a problem+json
// body, or "" when it names none.
func problemType(body []byte) string {
	_, rest, ok := bytes.Cut(body, []byte(`"type":"`))
	if !ok {
		return ""
	}
	t, _, ok := bytes.Cut(rest, []byte(`"`))
	if !ok {
		return ""
	}
	return strings.TrimPrefix(string(t), "urn:cortado:problem:")
}

// hasToken reports whether a header's comma-separated value lists token,
// in any case.
func hasToken(value []byte, token string) bool {
	for len(value) > 0 {
		var t []byte
		t, value, _ = bytes.Cut(value, []byte(","))
		if bytes.EqualFold(bytes.TrimSpace(t), []byte(token)) {
			return true
		}
	}
	return false
}

// tailWriter keeps the last tailBytes written to it.
type tailWriter struct{ b []byte }

func (t *tailWriter) Write(p []byte) (int, error) {
	if len(p) >= tailBytes {
		t.b = append(t.b[:0], p[len(p)-tailBytes:]...)
		return len(p), nil
	}
	if keep := tailBytes - len(p); len(t.b) > keep {
		t.b = append(t.b[:0], t.b[len(t.b)-keep:]...)
	}
	t.b = append(t.b, p...)
	return len(p), nil
}

// docJSON is the body of a PUT of the mix, with %d for its key.
func docJSON(size int) string {
	return `{"n":%d,"payload":"` + strings.Repeat("x", size) + `"}`
}

// writeMix appends a request of the mix (95 % GET, 5 % PUT of a random
// key) to bw and says whether it is a PUT.
func writeMix(bw *bufio.Writer, r *rand.Rand, o Options, host, doc string) (put bool) {
	id := r.IntN(o.Keys)
	if r.IntN(100) < 5 {
		body := fmt.Sprintf(doc, id)
		fmt.Fprintf(bw, "PUT /%s/Doc/%d HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", o.DB, id, host, len(body), body)
		return true
	}
	fmt.Fprintf(bw, "GET /%s/Doc/%d HTTP/1.1\r\nHost: %s\r\n\r\n", o.DB, id, host)
	return false
}

// closedLoop measures the mix's throughput at o.URL on o.Workers
// connections, each sending its next request when the last is answered
// (as wrk does), with the same requests as openLoop.
func closedLoop(ctx context.Context, o Options) (float64, error) {
	u, err := url.Parse(o.URL)
	if err != nil {
		return 0, err
	}
	deadline := time.Now().Add(o.Duration)
	doc := docJSON(o.DocBytes)
	var (
		mu sync.Mutex
		ok int
		wg sync.WaitGroup
	)
	for w := range o.Workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 5))
			n := 0
			for time.Now().Before(deadline) && ctx.Err() == nil {
				c, err := net.DialTimeout("tcp", u.Host, 10*time.Second)
				if err != nil {
					break
				}
				bw, br := bufio.NewWriterSize(c, 4<<10), bufio.NewReaderSize(c, 4<<10)
				for alive := true; alive && time.Now().Before(deadline) && ctx.Err() == nil; {
					c.SetDeadline(time.Now().Add(10 * time.Second))
					writeMix(bw, r, o, u.Host, doc)
					var a answer
					if a, alive = roundTrip(bw, br, nil); succeeded(a.status) {
						n++
					}
				}
				c.Close()
			}
			mu.Lock()
			ok += n
			mu.Unlock()
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return float64(ok) / o.Duration.Seconds(), nil
}

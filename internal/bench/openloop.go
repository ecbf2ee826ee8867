package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// An open-loop generator cheap enough to offer several times a server's
// capacity from the same two cores: net/http's client costs tens of
// microseconds and a goroutine per request, so at 5C it starved the
// servers it measured (and every request left late, counted from when it
// was due). This one keeps a fixed set of HTTP/1.1 connections, each
// sending its share of the schedule pipelined (requests written at their
// due time without waiting for earlier answers; Go's server answers them
// in order) and reading the answers as they come.

// openLoop offers the mix at rate to base for d over conns connections:
// request i is due at start + i/rate, on connection i mod conns. A
// request answered within timeout of its due time with a status below 300
// or 404 succeeds; its latency counts from its due time. A connection
// holding a timeout's worth of unanswered requests sends no more until it
// is answered (those requests fail, as a client that gave up), and one
// the server closes fails what it had unanswered and is dialled again.
func openLoop(ctx context.Context, o Options, base string, rate float64, d, timeout time.Duration, conns int) (lat []time.Duration, failed int, err error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, 0, err
	}
	interval := time.Duration(float64(time.Second) / rate)
	n := int(d / interval)
	perConn := int(rate*timeout.Seconds())/conns + 16
	start := time.Now().Add(50 * time.Millisecond)
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	record := func(l []time.Duration, f int) {
		mu.Lock()
		defer mu.Unlock()
		lat = append(lat, l...)
		failed += f
	}
	for k := range conns {
		wg.Go(func() {
			c := &pipeline{o: o, host: u.Host, timeout: timeout, due: make(chan time.Time, perConn),
				r: rand.New(rand.NewPCG(uint64(k), uint64(rate))), doc: docJSON(o.DocBytes)}
			l, f := c.run(ctx, start, interval, k, conns, n)
			record(l, f)
		})
	}
	wg.Wait()
	return lat, failed, ctx.Err()
}

// docJSON is the body of a PUT of the mix, with %d for its key.
func docJSON(size int) string {
	b := make([]byte, size)
	for i := range b {
		b[i] = 'x'
	}
	return `{"n":%d,"payload":"` + string(b) + `"}`
}

// pipeline is one connection of openLoop.
type pipeline struct {
	o       Options
	host    string
	timeout time.Duration
	r       *rand.Rand
	doc     string
	due     chan time.Time // due times of the requests sent and not yet answered

	mu     sync.Mutex
	lat    []time.Duration
	failed int
}

func (p *pipeline) fail(n int) {
	p.mu.Lock()
	p.failed += n
	p.mu.Unlock()
}

// run sends requests k, k+step, … below n at their due times.
func (p *pipeline) run(ctx context.Context, start time.Time, interval time.Duration, k, step, n int) ([]time.Duration, int) {
	var (
		conn   net.Conn
		bw     *bufio.Writer
		reader chan struct{} // closed when the connection's reader is done
	)
	hangUp := func() { // and fail what it had unanswered
		if conn != nil {
			conn.Close()
			<-reader
			conn = nil
		}
		p.fail(len(p.due))
		for len(p.due) > 0 {
			<-p.due
		}
	}
	defer hangUp()
	for i := k; i < n; i += step {
		at := start.Add(time.Duration(i) * interval)
		if err := waitUntil(ctx, at); err != nil {
			break
		}
		if conn == nil {
			c, err := net.DialTimeout("tcp", p.host, p.timeout)
			if err != nil {
				p.fail(1)
				continue
			}
			conn, bw, reader = c, bufio.NewWriterSize(c, 16<<10), make(chan struct{})
			go p.read(c, reader)
		}
		select {
		case <-reader: // the server closed the connection
			hangUp()
			p.fail(1)
			continue
		default:
		}
		if len(p.due) == cap(p.due) {
			p.fail(1) // a timeout's worth unanswered: the user gave up
			continue
		}
		p.due <- at
		p.write(bw, i)
		// Requests already due go out in the same write.
		if next := start.Add(time.Duration(i+step) * interval); time.Until(next) > 0 {
			if err := bw.Flush(); err != nil {
				hangUp()
			}
		}
	}
	if conn != nil {
		bw.Flush()
		// Wait for the answers still due, at most a timeout.
		deadline := time.Now().Add(p.timeout)
		for len(p.due) > 0 && time.Now().Before(deadline) {
			select {
			case <-reader:
				deadline = time.Now()
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	hangUp()
	return p.lat, p.failed
}

// write appends request i of the mix (95 % GET, 5 % PUT) to bw.
func (p *pipeline) write(bw *bufio.Writer, i int) {
	id := p.r.IntN(p.o.Keys)
	if p.r.IntN(100) < 5 {
		body := fmt.Sprintf(p.doc, id)
		fmt.Fprintf(bw, "PUT /%s/Doc/%d HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", p.o.DB, id, p.host, len(body), body)
		return
	}
	fmt.Fprintf(bw, "GET /%s/Doc/%d HTTP/1.1\r\nHost: %s\r\n\r\n", p.o.DB, id, p.host)
}

// read takes the answers of c in order until it fails or closes.
func (p *pipeline) read(c net.Conn, done chan struct{}) {
	defer close(done)
	br := bufio.NewReaderSize(c, 16<<10)
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			return
		}
		at := <-p.due
		took := time.Since(at)
		ok := (resp.StatusCode < 300 || resp.StatusCode == http.StatusNotFound) && took <= p.timeout
		p.mu.Lock()
		if ok {
			p.lat = append(p.lat, took)
		} else {
			p.failed++
		}
		p.mu.Unlock()
		if resp.Close {
			return
		}
	}
}

// closedLoop measures the mix's throughput on o.Workers connections, each
// sending its next request when the last is answered (as wrk does), with
// the same requests as openLoop.
func closedLoop(ctx context.Context, o Options, base string) (float64, error) {
	u, err := url.Parse(base)
	if err != nil {
		return 0, err
	}
	deadline := time.Now().Add(o.Duration)
	var (
		mu sync.Mutex
		ok int
		wg sync.WaitGroup
	)
	for w := range o.Workers {
		wg.Go(func() {
			p := &pipeline{o: o, host: u.Host, r: rand.New(rand.NewPCG(uint64(w), 5)), doc: docJSON(o.DocBytes)}
			n := 0
			defer func() {
				mu.Lock()
				ok += n
				mu.Unlock()
			}()
			var conn net.Conn
			defer func() {
				if conn != nil {
					conn.Close()
				}
			}()
			var (
				bw *bufio.Writer
				br *bufio.Reader
			)
			for time.Now().Before(deadline) && ctx.Err() == nil {
				if conn == nil {
					c, err := net.DialTimeout("tcp", u.Host, 10*time.Second)
					if err != nil {
						return
					}
					conn, bw, br = c, bufio.NewWriterSize(c, 16<<10), bufio.NewReaderSize(c, 16<<10)
				}
				conn.SetDeadline(time.Now().Add(10 * time.Second))
				p.write(bw, 0)
				resp, err := func() (*http.Response, error) {
					if err := bw.Flush(); err != nil {
						return nil, err
					}
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						return nil, err
					}
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					return resp, err
				}()
				if err != nil || resp.Close {
					conn.Close()
					conn = nil
				}
				if err == nil && (resp.StatusCode < 300 || resp.StatusCode == http.StatusNotFound) {
					n++
				}
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return float64(ok) / o.Duration.Seconds(), nil
}

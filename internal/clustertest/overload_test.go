package clustertest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cortado-db/cortado/client"
	"github.com/cortado-db/cortado/internal/coord"
	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/schema"
)

// metricValue reads one unlabelled sample from /metrics.
func metricValue(t *testing.T, base, name string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestAdmissionUnderOverload holds every slot of a router with requests
// whose bodies never arrive, fills its queue, and then sends five times
// its capacity in requests for two seconds: they are refused at once with
// 503 overloaded and Retry-After, the change stream before document
// requests, the process's goroutines and heap stay flat, and once the
// slots free up requests are served again.
func TestAdmissionUnderOverload(t *testing.T) {
	const inFlight, queue = 4, 8
	s := StartServe(t, ServeOptions{Args: []string{"--demo", "--max-in-flight", strconv.Itoa(inFlight), "--max-queue", strconv.Itoa(queue), "--queue-timeout", "20s", "--body-timeout", "30s"}})
	base := s.URL
	host := strings.TrimPrefix(base, "http://")
	if r, err := http.Get(base + "/demo/MailboxStats/x"); err != nil || r.StatusCode != 404 {
		t.Fatalf("before: %v %v", r, err)
	}
	// Slow writers: headers sent, body never.
	var slow []net.Conn
	defer func() {
		for _, c := range slow {
			c.Close()
		}
	}()
	for i := range inFlight + queue {
		c, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		slow = append(slow, c)
		fmt.Fprintf(c, "PUT /demo/MailboxStats/slow%d HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n", i, host)
	}
	deadline := time.Now().Add(10 * time.Second)
	for metricValue(t, base, `cortado_admission_queued{edge="http"}`) != queue {
		if time.Now().After(deadline) {
			t.Fatal("the slow writers did not fill the slots and the queue")
		}
		time.Sleep(10 * time.Millisecond)
	}
	goroutines0 := metricValue(t, base, "go_goroutines")
	heap0 := metricValue(t, base, "go_memstats_heap_inuse_bytes")
	// Garbage up to the collector's goal is not growth: with the heap
	// floor (64 MiB) the goal is above the live heap from the start.
	goal0 := metricValue(t, base, "go_memstats_next_gc_bytes")

	// The change stream is shed first (the queue is over its share).
	resp, err := http.Get(base + "/demo/_changes?since=now")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("change stream under overload: %d %v", resp.StatusCode, resp.Header)
	}

	// Five times the capacity, for two seconds.
	var refused, other atomic.Int64
	var maxGoroutines, maxHeap float64
	stop := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 100}, Timeout: 5 * time.Second}
	for range 5 * (inFlight + queue) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				r, err := hc.Get(base + "/demo/Message/alice/1")
				if err != nil {
					other.Add(1)
					continue
				}
				body, _ := io.ReadAll(r.Body)
				r.Body.Close()
				if r.StatusCode == 503 && strings.Contains(string(body), "urn:cortado:problem:overloaded") && r.Header.Get("Retry-After") != "" {
					refused.Add(1)
				} else {
					other.Add(1)
				}
			}
		}()
	}
	for time.Now().Before(stop) {
		maxGoroutines = max(maxGoroutines, metricValue(t, base, "go_goroutines"))
		maxHeap = max(maxHeap, metricValue(t, base, "go_memstats_heap_inuse_bytes"))
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()
	t.Logf("%d refused, %d other; goroutines %.0f → max %.0f; heap %.1f → max %.1f MiB",
		refused.Load(), other.Load(), goroutines0, maxGoroutines, heap0/(1<<20), maxHeap/(1<<20))
	if refused.Load() < 100 || other.Load() != 0 {
		t.Fatalf("under overload: %d refused as overloaded, %d answered otherwise", refused.Load(), other.Load())
	}
	// One goroutine or two per open connection of the load, no more.
	if maxGoroutines > goroutines0+float64(3*5*(inFlight+queue))+20 || maxHeap > max(heap0, goal0)+64<<20 {
		t.Fatalf("the process grew under overload: goroutines %.0f → %.0f, heap %.0f → %.0f (goal %.0f)", goroutines0, maxGoroutines, heap0, maxHeap, goal0)
	}

	// The slow writers give up; the slots free; requests are served.
	for _, c := range slow {
		c.Close()
	}
	slow = nil
	deadline = time.Now().Add(10 * time.Second)
	for {
		r, err := http.Get(base + "/demo/MailboxStats/x")
		if err == nil {
			r.Body.Close()
			if r.StatusCode == 404 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not served again after the overload: %v %v", r, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRequestTimeout: a Request-Timeout that passes while the request
// waits for a slot ends it with 503 deadline-exceeded; a malformed one is
// 400.
func TestRequestTimeout(t *testing.T) {
	s := StartServe(t, ServeOptions{Args: []string{"--demo", "--max-in-flight", "1", "--max-queue", "4", "--queue-timeout", "20s"}})
	host := strings.TrimPrefix(s.URL, "http://")
	c, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "PUT /demo/MailboxStats/slow HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n", host)
	deadline := time.Now().Add(10 * time.Second)
	for metricValue(t, s.URL, `cortado_admission_in_flight{edge="http"}`) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the slow writer did not take the slot")
		}
		time.Sleep(10 * time.Millisecond)
	}
	req, _ := http.NewRequest("GET", s.URL+"/demo/MailboxStats/x", nil)
	req.Header.Set("Request-Timeout", "0.2")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(body), "deadline-exceeded") || time.Since(start) > 5*time.Second {
		t.Fatalf("a request whose deadline passed in the queue: %d %s after %v", resp.StatusCode, body, time.Since(start))
	}
	req.Header.Set("Request-Timeout", "soon")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("a malformed Request-Timeout: %d", resp.StatusCode)
	}
}

// TestPartialOK: with a partition that has no replica left, a multi-get
// and a query without a partition key fail with 503, unless the caller
// prefers a partial answer: then the answer lists the missing partitions
// and holds everything the others have.
func TestPartialOK(t *testing.T) {
	const partitions = 4
	c := startCluster(t, 3, partitions, 1) // one replica: a dead node's partitions have no master
	qt := qTable{name: "Q", indexed: map[string]bool{"from": true}}
	if _, _, err := c.reg.RegisterVersion(c.ctx, "d", "Q", []schema.KeyPart{{Name: "box"}, {Name: "id", Type: "long"}}, qt.schema()); err != nil {
		t.Fatal(err)
	}
	d, _ := c.reg.Database("d")
	boxes := []string{}
	for i := 0; len(boxes) < 12; i++ {
		boxes = append(boxes, fmt.Sprintf("b%d", i))
	}
	cl := client.New(c.url)
	defer cl.Close()
	for _, b := range boxes {
		c.put(b, "v") // table T, key b (waits for the partition's master)
		if _, err := cl.Put(c.ctx, "d", "Q", client.Key{b, int64(1)}, randMsg(rand.New(rand.NewPCG(1, 2)), 1), nil); err != nil {
			t.Fatal(err)
		}
	}
	victim := busiestMaster(c.view.Table("d"))
	dead := map[int]bool{}
	for p, r := range c.view.Table("d").Partitions {
		if r.Replicas[0] == victim {
			dead[p] = true
		}
	}
	c.nodes[victim].kill()
	delete(c.nodes, victim)
	var keysText []string
	wantDocs := 0
	for _, b := range boxes {
		keysText = append(keysText, b)
		if !dead[d.PartitionOf(keys.S(b))] {
			wantDocs++
		}
	}
	multiGet := c.url + "/d/T/(" + strings.Join(keysText, ",") + ")"
	// Until the routers see the node gone, a call may still go to it:
	// either way, whole answers are 503 and partial ones list the same
	// partitions.
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(multiGet)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == 503 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("multi-get over a dead partition without partial-ok: %d", resp.StatusCode)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var want []string
	for p := range partitions {
		if dead[p] {
			want = append(want, strconv.Itoa(p))
		}
	}
	req, _ := http.NewRequest("GET", multiGet, nil)
	req.Header.Set("Prefer", "partial-ok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var page struct {
		Documents         []json.RawMessage
		Missing           []json.RawMessage
		MissingPartitions []int
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	json.Unmarshal(raw, &page)
	if resp.StatusCode != 200 {
		t.Logf("body %s", raw)
	}
	if resp.StatusCode != 200 || resp.Header.Get("X-Cortado-Missing-Partitions") != strings.Join(want, ",") ||
		len(page.Documents) != wantDocs || len(page.Missing) != 0 || len(page.MissingPartitions) != len(want) {
		t.Fatalf("partial multi-get: %d %v, %d documents (want %d), missing %d, missing partitions %v (want %v)",
			resp.StatusCode, resp.Header, len(page.Documents), wantDocs, len(page.Missing), page.MissingPartitions, want)
	}
	// Streamed: the answering partitions' lines, then an end line (and a
	// trailer) naming the others; without partial-ok, a problem or a
	// stream that ends in an error, never one that looks complete.
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	lines := parseLines(t, raw)
	end := lines[len(lines)-1]
	if resp.StatusCode != 200 || len(lines) != wantDocs+1 || !end.End || end.Documents != wantDocs || end.MissingKeys != 0 ||
		strings.Trim(strings.Join(strings.Fields(fmt.Sprint(end.MissingPartitions)), ","), "[]") != strings.Join(want, ",") ||
		resp.Trailer.Get("X-Cortado-Missing-Partitions") != strings.Join(want, ",") {
		t.Fatalf("partial stream: %d, trailer %v, %d lines (want %d documents), end %+v (want missing partitions %v)",
			resp.StatusCode, resp.Trailer, len(lines), wantDocs, end, want)
	}
	req.Header.Del("Prefer")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	switch resp.StatusCode {
	case 503:
	case 200:
		lines := parseLines(t, raw)
		if last := lines[len(lines)-1]; last.Error == nil || fmt.Sprint(last.Error["status"]) != "503" {
			t.Fatalf("a stream over a dead partition without partial-ok ended with %+v", last)
		}
		for _, l := range lines {
			if l.End {
				t.Fatalf("a stream over a dead partition without partial-ok has an end line: %s", raw)
			}
		}
	default:
		t.Fatalf("a stream over a dead partition without partial-ok: %d %s", resp.StatusCode, raw)
	}
	// A query without a partition key, through the client.
	if _, err := cl.Query(c.ctx, "d", "Q", nil, client.Query{Where: "NOT from:nobody"}, nil); err == nil {
		t.Fatal("a query over a dead partition answered without partial-ok")
	}
	p, err := cl.Query(c.ctx, "d", "Q", nil, client.Query{Where: "NOT from:nobody", Limit: 100}, &client.ReadOptions{PartialOK: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Documents) != wantDocs || len(p.MissingPartitions) != len(want) {
		t.Fatalf("partial query: %d documents (want %d), missing partitions %v (want %v)", len(p.Documents), wantDocs, p.MissingPartitions, want)
	}
}

// TestClientQuotas: a client over its quota gets 429 with Retry-After;
// another client is not held back by it.
func TestClientQuotas(t *testing.T) {
	s := StartServe(t, ServeOptions{Args: []string{"--demo", "--quota-rate", "2", "--quota-burst", "3"}})
	get := func(client string) *http.Response {
		req, _ := http.NewRequest("GET", s.URL+"/demo/MailboxStats/x", nil)
		req.Header.Set("X-Cortado-Client", client)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	limited := 0
	for range 8 {
		if r := get("batch-job"); r.StatusCode == 429 {
			if r.Header.Get("Retry-After") == "" {
				t.Fatal("429 without Retry-After")
			}
			limited++
		} else if r.StatusCode != 404 {
			t.Fatalf("within the quota: %d", r.StatusCode)
		}
	}
	if limited < 4 {
		t.Fatalf("8 quick requests with a burst of 3 at 2/s: only %d refused", limited)
	}
	if r := get("web"); r.StatusCode != 404 {
		t.Fatalf("another client: %d", r.StatusCode)
	}
	if r := get(strings.Repeat("x", 200)); r.StatusCode != 400 {
		t.Fatalf("an over-long client name: %d", r.StatusCode)
	}

	// The Go client names itself (WithClientID); over its quota it gets
	// ErrQuotaExceeded with the server's Retry-After, and another name is
	// not held back.
	job := client.New(s.URL, client.WithClientID("nightly-job"))
	defer job.Close()
	var refused *client.Error
	for range 8 {
		_, err := job.Get(t.Context(), "demo", "MailboxStats", client.Key{"x"}, nil)
		if errors.Is(err, client.ErrQuotaExceeded) {
			errors.As(err, &refused)
			break
		}
		if !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("within the quota: %v", err)
		}
	}
	if refused == nil || refused.Status != 429 || refused.RetryAfter < time.Second {
		t.Fatalf("8 quick requests of a Go client with a burst of 3 at 2/s: refusal %+v, want 429 with Retry-After ≥ 1 s", refused)
	}
	other := client.New(s.URL, client.WithClientID("web"))
	defer other.Close()
	if _, err := other.Get(t.Context(), "demo", "MailboxStats", client.Key{"x"}, nil); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("another Go client: %v", err)
	}
}

// TestSlowAndIdleClients: a router bounds what clients that stop
// reading, sit idle or open too much can hold. A kept-alive connection
// that sends nothing is closed after --idle-timeout; a change-stream
// consumer that stops reading is cut off --write-timeout after the write
// it did not take (the stream's handler ends); streams beyond
// --max-streams are refused with 503 overloaded; connections beyond
// --max-conns are closed at once, and served again once others close.
func TestSlowAndIdleClients(t *testing.T) {
	const maxConns = 12
	s := StartServe(t, ServeOptions{Args: []string{"--demo", "--idle-timeout", "300ms", "--write-timeout", "500ms",
		"--max-streams", "2", "--max-conns", strconv.Itoa(maxConns)}})
	host := strings.TrimPrefix(s.URL, "http://")
	ctx := t.Context()
	// No kept-alive connections of the test's own: they would count.
	plain := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	c := client.New(s.URL, client.WithHTTPClient(plain))
	defer c.Close()

	// Idle: one request answered, then nothing; the server closes it.
	conn, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("idle kept-alive connection: read %v, want EOF (closed by the server)", err)
	}
	conn.Close()

	// A consumer that stops reading: 6 MB of changes to send, a receive
	// buffer of 4 KiB, nothing read. The handler must end.
	// Four writers: each may briefly hold two connections (the server
	// closes the last one just after its client has the answer and dials
	// again), and 2 × 4 stays under the port's bound of 12, which eight
	// writers crossed under the race detector (a write refused, reset).
	body := strings.Repeat("lorem ipsum ", 350)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 380 {
				if _, err := c.Insert(ctx, "demo", "Message", client.Key{fmt.Sprintf("box%d", w)},
					map[string]any{"from": "x", "subject": fmt.Sprint(i), "body": body}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	stuck, err := d.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer stuck.Close()
	fmt.Fprintf(stuck, "GET /demo/_changes?since=beginning HTTP/1.1\r\nHost: x\r\n\r\n")
	await(t, 10*time.Second, "the stream to start", func() bool { return metricValue(t, s.URL, "cortado_change_streams") == 1 })
	await(t, 20*time.Second, "the stream that nobody reads to end", func() bool { return metricValue(t, s.URL, "cortado_change_streams") == 0 })

	// Two streams at most.
	var streams []*http.Response
	for range 2 {
		r, err := plain.Get(s.URL + "/demo/_changes?since=now")
		if err != nil || r.StatusCode != 200 {
			t.Fatalf("stream: %v %v", r, err)
		}
		streams = append(streams, r)
	}
	r, err := plain.Get(s.URL + "/demo/_changes?since=now")
	if err != nil {
		t.Fatal(err)
	}
	var p struct{ Type string }
	json.NewDecoder(r.Body).Decode(&p)
	r.Body.Close()
	if r.StatusCode != 503 || p.Type != "urn:cortado:problem:overloaded" || r.Header.Get("Retry-After") == "" {
		t.Fatalf("third stream: %d %q Retry-After %q, want 503 overloaded", r.StatusCode, p.Type, r.Header.Get("Retry-After"))
	}
	for _, r := range streams {
		r.Body.Close()
	}
	await(t, 10*time.Second, "the streams to end", func() bool { return metricValue(t, s.URL, "cortado_change_streams") == 0 })

	// Connections: hold them until one is closed at once.
	for _, c := range fillPort(t, host, maxConns) {
		c.Close()
	}
	awaitHealthy(t, plain, s.URL) // a request after the connections closed
	if n := metricValue(t, s.URL, "cortado_connections_refused_total"); n < 1 {
		t.Fatalf("connections refused %v, want at least 1", n)
	}
}

// fillPort dials host and holds each connection the server keeps open
// (waiting for its request) until one is closed at once, as beyond
// --max-conns; it fails the test if none is within maxConns + 1 dials.
// The connections are closed when the test ends.
func fillPort(t *testing.T, host string, maxConns int) []net.Conn {
	t.Helper()
	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	for len(held) <= maxConns {
		c, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		_, err = c.Read(make([]byte, 1))
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			held = append(held, c) // kept: waiting for its request
			continue
		}
		c.Close()
		return held
	}
	t.Fatalf("%d connections held, none refused (--max-conns %d)", len(held), maxConns)
	return nil
}

// awaitHealthy waits until base answers /healthz with 200 through hc:
// an admin port (--admin-listen) may start just after the ready file is
// written, and a port that refused connections serves again once others
// close.
func awaitHealthy(t testing.TB, hc *http.Client, base string) {
	t.Helper()
	await(t, 10*time.Second, base+"/healthz", func() bool {
		r, err := hc.Get(base + "/healthz")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == 200
	})
}

// TestAdminPortOutsideTheBounds: with --admin-listen, /metrics and
// /healthz answer on their own port while the document API's port is
// full (--max-conns) and refuses connections, and that port serves no
// documents.
func TestAdminPortOutsideTheBounds(t *testing.T) {
	const maxConns = 2
	adminURL, err := coord.FreeLoopbackURL()
	if err != nil {
		t.Fatal(err)
	}
	s := StartServe(t, ServeOptions{Args: []string{"--demo", "--max-conns", strconv.Itoa(maxConns),
		"--admin-listen", strings.TrimPrefix(adminURL, "http://")}})
	host := strings.TrimPrefix(s.URL, "http://")
	awaitHealthy(t, http.DefaultClient, adminURL)
	before := metricValue(t, adminURL, "cortado_connections_refused_total")

	// Fill the document API's port until it refuses a connection.
	held := fillPort(t, host, maxConns)
	if len(held) != maxConns {
		t.Fatalf("%d connections held before one was refused (--max-conns %d)", len(held), maxConns)
	}
	// Monitoring still sees the process, and what refused it.
	if got := metricValue(t, adminURL, "cortado_connections_refused_total"); got < before+1 {
		t.Fatalf("refused connections %v on the admin port, want at least %v", got, before+1)
	}
	if got := metricValue(t, adminURL, "cortado_connections_open"); got < maxConns {
		t.Fatalf("open connections %v, want the %d held", got, maxConns)
	}
	// The held connections sent nothing: none holds an unread request.
	if got := metricValue(t, adminURL, "cortado_connections_waiting"); got != 0 {
		t.Fatalf("connections waiting %v, want 0 of idle ones", got)
	}
	// The admin port is not a way around the bounds: no documents there.
	r, err := http.Get(adminURL + "/demo/Message/x")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusNotFound || r.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("a document path on the admin port: %d %s, want 404 problem+json", r.StatusCode, r.Header.Get("Content-Type"))
	}
}

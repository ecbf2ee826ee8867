package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cortado-db/cortado/client"
)

// TestOpenLoop: every request of the schedule is sent once and counted
// once (answered, or failed), PUT bodies are the mix's documents, a
// server that hangs up fails that request only, and a request the server
// holds past the timeout fails without holding back the others.
func TestOpenLoop(t *testing.T) {
	var gets, puts, hangups, held atomic.Int64
	var fromMu sync.Mutex
	from := map[string]bool{} // the clients' addresses
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		fromMu.Lock()
		from[host] = true
		fromMu.Unlock()
		if !strings.HasPrefix(r.URL.Path, "/b/Doc/") {
			t.Errorf("path %q", r.URL.Path)
		}
		switch r.Method {
		case http.MethodGet:
			switch gets.Add(1) % 50 {
			case 0:
				hangups.Add(1)
				panic(http.ErrAbortHandler) // the connection is cut
			case 25:
				held.Add(1)
				<-r.Context().Done() // answered never: the client gives up
				return
			}
			w.Write([]byte(`{}`))
		case http.MethodPut:
			puts.Add(1)
			var doc struct {
				N       int
				Payload string
			}
			b, _ := io.ReadAll(r.Body)
			if err := json.Unmarshal(b, &doc); err != nil || len(doc.Payload) != 100 || !strings.HasSuffix(r.URL.Path, "/"+strconv.Itoa(doc.N)) {
				t.Errorf("PUT %s: %s (%v)", r.URL.Path, b, err)
			}
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	defer srv.Close()
	o := Options{DB: "b", Keys: 100, DocBytes: 100}
	const rate, d = 2000, 500 * time.Millisecond
	// A timeout far above a request's time even on a loaded machine under
	// the race detector (at 300 ms, 18 of 1,000 were answered in one such
	// run): a held request still fails by it.
	res, err := openLoop(t.Context(), o, srv.URL, rate, d, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	lat, late, failed, dials := res.lat, res.late, res.failed, res.dials
	// Every success is a read or a write, and the writes are the PUTs
	// the server answered.
	if len(res.reads)+len(res.writes) != len(lat) || len(res.writes) == 0 || len(res.writes) > int(puts.Load()) {
		t.Fatalf("%d reads + %d writes counted for %d successes (server saw %d PUTs)", len(res.reads), len(res.writes), len(lat), puts.Load())
	}
	n := int(rate * d.Seconds())
	// Every request the server saw was sent, and each connection the
	// server accepted was dialled for a request sent on it.
	if len(late) < len(lat) || len(late) > n || dials < 1 || dials > len(late) {
		t.Fatalf("%d requests counted as sent, %d dials, for %d answered of %d", len(late), dials, len(lat), n)
	}
	if len(lat)+failed != n {
		t.Fatalf("%d answered + %d failed, want the %d requests of the schedule", len(lat), failed, n)
	}
	if int(gets.Load()+puts.Load()) < len(lat) || puts.Load() == 0 {
		t.Fatalf("server saw %d GETs %d PUTs, client counted %d answered", gets.Load(), puts.Load(), len(lat))
	}
	if lost := int(hangups.Load() + held.Load()); hangups.Load() == 0 || held.Load() == 0 || failed < lost {
		t.Fatalf("%d hang-ups and %d held, %d failed: each fails its request", hangups.Load(), held.Load(), failed)
	}
	if len(lat) < n/2 {
		t.Fatalf("%d of %d answered: requests held by the server held back others", len(lat), n)
	}
	// On Linux each dial comes from an address of its own in
	// 127.1.0.0/16, so that tens of thousands of dials do not search one
	// address's ports in TIME_WAIT.
	if runtime.GOOS == "linux" {
		fromMu.Lock()
		defer fromMu.Unlock()
		for host := range from {
			if !strings.HasPrefix(host, "127.1.") {
				t.Fatalf("a connection from %s, want one of 127.1.0.0/16", host)
			}
		}
		if len(from) > dials || dials > 1 && len(from) < 2 {
			t.Fatalf("%d client addresses for %d dials, want one a dial", len(from), dials)
		}
	}
}

// TestCapacity: against a server that serves 400 requests a second and
// refuses the rest at once, the open-loop capacity is about 400/s.
func TestCapacity(t *testing.T) {
	const limit = 400.0
	var mu sync.Mutex
	last, tokens := time.Now(), 0.0 // a token bucket, 20 deep
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		now := time.Now()
		tokens = min(20, tokens+now.Sub(last).Seconds()*limit)
		last = now
		ok := tokens >= 1
		if ok {
			tokens--
		}
		mu.Unlock()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	var progress strings.Builder
	o := OverloadOptions{Options: Options{DB: "b", Keys: 100, DocBytes: 100, Duration: time.Second}}
	c, err := Capacity(t.Context(), o, srv.URL, &progress)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(progress.String())
	if c < 0.8*limit || c > 1.05*limit {
		t.Fatalf("capacity %.0f/s of a server serving %.0f/s:\n%s", c, limit, progress.String())
	}
}

// TestSearchCapacity: the search ends below the highest rate served, by
// at most 5 % of the closed loop's figure, in six probes at most, and takes the closed loop's figure when
// that rate is served.
func TestSearchCapacity(t *testing.T) {
	for _, tc := range []struct{ closed, served float64 }{{10000, 6170}, {10000, 2500}, {10000, 12000}, {10000, 1000}, {10000, 9990}} {
		probes := 0
		c, err := searchCapacity(tc.closed, func(rate float64) (bool, error) {
			probes++
			return rate <= tc.served, nil
		})
		want := min(tc.served, tc.closed)
		if err != nil || c > want || c < want-0.05*tc.closed || probes > 6 {
			t.Errorf("closed %.0f, served up to %.0f: capacity %.0f after %d probes, %v", tc.closed, tc.served, c, probes, err)
		}
	}
}

// TestConfirmCapacity: the search's rate is kept when a whole step
// serves it, and lowered by 5 % a try until one does, at most
// confirmTries rates in all, the last one not offered.
func TestConfirmCapacity(t *testing.T) {
	for _, tc := range []struct {
		served, want float64
		probes       int
	}{{1000, 1000, 1}, {903, 902.5, 3}, {960, 950, 2}, {100, 857.375, 3}} {
		probes := 0
		c, err := confirmCapacity(1000, func(rate float64) (bool, error) {
			probes++
			return rate <= tc.served, nil
		})
		if err != nil || math.Abs(c-tc.want) > 0.01 || probes != tc.probes {
			t.Errorf("served up to %.0f: capacity %.3f after %d probes (%v), want %.3f after %d", tc.served, c, probes, err, tc.want, tc.probes)
		}
	}
}

// TestSearchCapacityNothingServed: a server that serves no rate is an
// error, not a capacity of 0.
func TestSearchCapacityNothingServed(t *testing.T) {
	if c, err := searchCapacity(1000, func(float64) (bool, error) { return false, nil }); err == nil {
		t.Fatalf("capacity %.0f of a server that serves nothing", c)
	}
}

// TestOfferAnswers: each request's answer carries its status and, for a
// problem, its type; a problem's body is read whole, so the connection
// carries the next request: no connection closes before the schedule's
// last request is due. (Counting connections instead failed under the
// race detector beside other packages' tests: a round trip slower than
// the 5 ms between requests rightly opens another connection.)
func TestOfferAnswers(t *testing.T) {
	var n atomic.Int64
	var closedMu sync.Mutex
	var closed []time.Time
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Cache-Control") != "max-stale=10" {
			t.Errorf("Cache-Control %q", r.Header.Get("Cache-Control"))
		}
		if n.Add(1)%2 == 0 {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"type":"urn:cortado:problem:overloaded","title":"` + strings.Repeat("x", 8000) + `"}`))
			return
		}
		w.Write([]byte(`{}`))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			closedMu.Lock()
			closed = append(closed, time.Now())
			closedMu.Unlock()
		}
	}
	srv.Start()
	defer srv.Close()
	var mu sync.Mutex
	got := map[string]int{}
	var lastDue time.Time
	err := offer(t.Context(), srv.URL, 200, 500*time.Millisecond, time.Second, openLoad{
		write: func(bw *bufio.Writer, r *rand.Rand, host string) bool {
			fmt.Fprintf(bw, "GET /b/Doc/%d HTTP/1.1\r\nHost: %s\r\nCache-Control: max-stale=10\r\n\r\n", r.IntN(10), host)
			return false
		},
		answer: func(due time.Time, _ time.Duration, a answer) {
			mu.Lock()
			got[strconv.Itoa(a.status)+" "+a.problem]++
			if due.After(lastDue) {
				lastDue = due
			}
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got["200 "] != 50 || got["503 overloaded"] != 50 || len(got) != 2 {
		t.Fatalf("answers %v, want 50 of 200 and 50 of 503 overloaded", got)
	}
	closedMu.Lock()
	defer closedMu.Unlock()
	for _, at := range closed {
		if at.Before(lastDue) {
			t.Fatalf("a connection closed %v before the last request was due: a problem closed it", lastDue.Sub(at))
		}
	}
}

// TestMultiGetOpenLoop: the multi-get generator sends every request of
// its schedule with multiKeys keys of the table and its Accept header,
// and counts a stream without its end line as failed.
func TestMultiGetOpenLoop(t *testing.T) {
	var seen atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := seen.Add(1)
		ids, ok := strings.CutPrefix(r.URL.Path, "/b/Doc/(")
		if !ok || !strings.HasSuffix(ids, ")") || len(strings.Split(strings.TrimSuffix(ids, ")"), ",")) != 3 {
			t.Errorf("path %q", r.URL.Path)
		}
		for _, id := range strings.Split(strings.TrimSuffix(ids, ")"), ",") {
			if k, err := strconv.Atoi(id); err != nil || k < 0 || k >= 100 {
				t.Errorf("key %q", id)
			}
		}
		if r.Header.Get("Accept") != "application/x-ndjson" {
			t.Errorf("Accept %q", r.Header.Get("Accept"))
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, strings.Repeat(`{"key":[1],"document":{"payload":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}}`+"\n", 20))
		if n%4 != 0 { // every fourth stream breaks off before its end
			io.WriteString(w, `{"end":true,"documents":3,"missingKeys":0}`+"\n")
		}
	}))
	defer srv.Close()
	const rate, d = 400, 500 * time.Millisecond
	p, err := OpenLoop(t.Context(), Options{URL: srv.URL, DB: "b", Keys: 100, Duration: d}, rate, 3, "application/x-ndjson")
	if err != nil {
		t.Fatal(err)
	}
	n := int(rate * d.Seconds())
	if p.Requests+p.Errors != n || int(seen.Load()) != n || p.Errors != n/4 {
		t.Fatalf("%d answered + %d failed (server saw %d), want %d requests, a quarter of them failed", p.Requests, p.Errors, seen.Load(), n)
	}
}

// TestSuccessP99: the server's p99 comes from the successful requests'
// histogram buckets between two readings; failures do not count, and a
// method given counts only its requests.
func TestSuccessP99(t *testing.T) {
	page := func(fast, slow, failed, slowPuts int) metricsPage {
		var m metricsPage
		for _, b := range []struct {
			le      string
			n, f, p int
		}{{"0.0001", 0, 0, 0}, {"0.0002", fast, 0, 0}, {"0.0004", fast, 0, 0}, {"0.0008", fast + slow, failed, slowPuts}, {"+Inf", fast + slow, failed, slowPuts}} {
			m = append(m,
				fmt.Sprintf(`cortado_request_duration_seconds_bucket{code="200",method="GET",route="doc",le="%s"} %d`, b.le, b.n),
				fmt.Sprintf(`cortado_request_duration_seconds_bucket{code="503",method="GET",route="doc",le="%s"} %d`, b.le, b.f),
				fmt.Sprintf(`cortado_request_duration_seconds_bucket{code="204",method="PUT",route="doc",le="%s"} %d`, b.le, b.p))
		}
		return m
	}
	// Between the readings: 990 fast successes, 10 slow ones, and 5,000
	// slow failures that would move the p99 if they counted.
	if got := successP99(page(1000, 0, 0, 0), page(1990, 10, 5000, 0), ""); got != 200*time.Microsecond {
		t.Fatalf("p99 %v, want the 0.2 ms bucket", got)
	}
	if got := successP99(page(1000, 0, 0, 0), page(1980, 20, 0, 0), ""); got != 800*time.Microsecond {
		t.Fatalf("p99 %v, want the 0.8 ms bucket", got)
	}
	if got := successP99(page(1000, 0, 0, 0), page(1000, 0, 0, 0), ""); got != 0 {
		t.Fatalf("p99 of nothing served: %v", got)
	}
	// 50 slow PUTs beside 1,000 fast GETs: they are the p99 of all, and
	// of the PUTs, not of the GETs.
	before, after := page(1000, 0, 0, 0), page(2000, 0, 0, 50)
	for method, want := range map[string]time.Duration{"": 800 * time.Microsecond, "GET": 200 * time.Microsecond, "PUT": 800 * time.Microsecond} {
		if got := successP99(before, after, method); got != want {
			t.Errorf("p99 of %q: %v, want %v", method, got, want)
		}
	}
}

// TestRoundTrip: the generator's own response reader against net/http's
// server: every status, body length, chunked body, problem type, tail
// and connection close read as net/http's client reads them, and the
// next response on the connection starts where the last ended.
func TestRoundTrip(t *testing.T) {
	big := strings.Repeat("0123456789", 1000) // over the reader's 4 KiB
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			w.Write([]byte(`{"a":1}`))
		case "/big":
			w.Header().Set("Content-Length", strconv.Itoa(len(big)))
			w.Write([]byte(big))
		case "/chunked":
			for i := range 3 {
				w.Write([]byte(big + strconv.Itoa(i)))
				w.(http.Flusher).Flush()
			}
			w.Write([]byte(`{"end":true}`))
		case "/none":
			w.WriteHeader(http.StatusNoContent)
		case "/overloaded":
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"type":"urn:cortado:problem:overloaded","title":"Overloaded","status":503}`))
		case "/close":
			w.Header().Set("Connection", "close")
			w.Write([]byte(`bye`))
		}
	}))
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	bw, br := bufio.NewWriter(c), bufio.NewReaderSize(c, 4<<10)
	tail := &tailWriter{}
	for _, tc := range []struct {
		path    string
		status  int
		problem string
		tail    string // the body's end
		alive   bool
	}{
		{"/ok", 200, "", `{"a":1}`, true},
		{"/big", 200, "", big[len(big)-tailBytes:], true},
		{"/chunked", 200, "", `456789` + "2" + `{"end":true}`, true},
		{"/none", 204, "", "", true},
		{"/overloaded", 503, "overloaded", `"status":503}`, true},
		{"/ok", 200, "", `{"a":1}`, true},
		{"/close", 200, "", "bye", false},
	} {
		fmt.Fprintf(bw, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", tc.path)
		a, alive := roundTrip(bw, br, tail)
		if a.status != tc.status || a.problem != tc.problem || !strings.HasSuffix(string(a.tail), tc.tail) || alive != tc.alive {
			t.Fatalf("%s: status %d problem %q tail …%q alive %v; want %d %q …%q %v", tc.path, a.status, a.problem, a.tail, alive, tc.status, tc.problem, tc.tail, tc.alive)
		}
	}
	// A cut connection is a failure, not an answer.
	c2, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c2.Write([]byte("GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"))
	c2.(*net.TCPConn).CloseWrite()
	br2 := bufio.NewReader(io.LimitReader(c2, 20)) // the response cut after 20 bytes
	if a, alive := roundTrip(bufio.NewWriter(io.Discard), br2, nil); a.status != 0 || alive {
		t.Fatalf("a cut response read as status %d, alive %v", a.status, alive)
	}
	c2.Close()
}

// TestLoadWaitsOutRefusals: a server refusing writes as overloaded (503,
// Retry-After) slows a load down but does not fail it, and every
// document ends up written; any other error still ends it.
func TestLoadWaitsOutRefusals(t *testing.T) {
	var mu sync.Mutex
	tries, stored := map[string]int{}, map[string]bool{}
	fail := "" // a path answered 400 when set
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path == fail {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(`{"type":"urn:cortado:problem:malformed","status":400}`))
			return
		}
		if tries[r.URL.Path]++; tries[r.URL.Path] <= 2 {
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"type":"urn:cortado:problem:overloaded","status":503}`))
			return
		}
		stored[r.URL.Path] = true
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	o := Options{DB: "b", Keys: 20, Workers: 4}
	if err := load(t.Context(), client.New(srv.URL), o, "x"); err != nil {
		t.Fatalf("load refused twice a document: %v", err)
	}
	if len(stored) != o.Keys {
		t.Fatalf("%d of %d documents stored", len(stored), o.Keys)
	}
	mu.Lock()
	fail = "/b/Doc/3"
	mu.Unlock()
	if err := load(t.Context(), client.New(srv.URL), o, "x"); err == nil {
		t.Fatal("a load whose write is malformed succeeded")
	}
}

// TestSocketQueues: bytes a server has not read count as a waiting
// request on its port, bytes its client has not read as a waiting
// answer. Against the kernel's own table; TestCountQueues has what does
// not count (backlogs, other states, other ports), in a fixed dump.
func TestSocketQueues(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	read := func() (int, int) {
		rq, rs, err := socketQueues(port)
		if err != nil {
			t.Fatal(err)
		}
		return rq, rs
	}
	if rq, rs := read(); rq != 0 || rs != 0 {
		t.Fatalf("idle connection: %d unread requests, %d unread answers", rq, rs)
	}
	// The bytes are in the peer's queue once the kernel has moved them;
	// poll the table for it rather than assume when.
	await := func(wantRq, wantRs int) {
		deadline := time.Now().Add(5 * time.Second)
		for {
			rq, rs := read()
			if rq == wantRq && rs == wantRs {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("counted %d unread requests and %d unread answers, want %d and %d", rq, rs, wantRq, wantRs)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	c.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	await(1, 0)
	s.Write([]byte("HTTP/1.1 200 OK\r\n\r\n"))
	await(1, 1)

}

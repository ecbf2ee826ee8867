package clustertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/coord"
)

// hostileRequest is one request a hostile client may send.
type hostileRequest struct {
	method, path string
	header       http.Header
	body         []byte
}

// The generator's vocabulary: pieces of valid requests and the classes of
// bad input the API must refuse without harm.
var (
	hostileMethods = []string{"GET", "HEAD", "PUT", "POST", "PATCH", "DELETE", "OPTIONS", "BREW"}
	hostileDBs     = []string{"demo", "demo", "demo", "sentinel", "nodb", "_txn", "%ZZ", "a%00b", strings.Repeat("d", 300)}
	hostileTables  = []string{"Profile", "Message", "MailboxStats", "T", "Nope", "_txn", ""}
	hostileKeys    = []string{"1", "2", "-5", "+1", "01", "0", "99999999999999999999", "%FF", "%2E%2E", "a%2Fb", "alice",
		"(1,2,3)", "(", "((1))", "(1,,2)", "%E2%80%A8", "%ED%A0%80", strings.Repeat("k", 2000), "x y", "1e3", "", "%2E"}
	hostileQueries = []string{"", "", "?fields=lastName", "?fields=positions.title,nosuch", "?fields=" + strings.Repeat("a.", 500),
		"?limit=-1", "?limit=99999", "?limit=2&next=!!", "?next=" + strings.Repeat("A", 3000), "?query=a:b",
		"?query=from:bob", "?query=hello%20AND%20isInbox:true&sort=-createdOn", "?query=%22big%20news%22&limit=2&next=AAAAAAAAAAAAAAAAAA",
		"?query=createdOn:[1%20TO%20*]&sort=subject", "?query=" + strings.Repeat("(", 40) + "a", "?query=" + strings.Repeat("a%20OR%20", 200) + "b",
		"?query=labels:%FF", "?query=NOT%20NOT%20-x", "?query=createdOn:>=99999999999999999999", "?query=%22unterminated", "?query=&sort=-",
		"?qeury=a", "?limit=1&limit=2", "?a;b", "?%zz", "?fields=a&fields=b", "?sort=-createdOn"}
	// Change-stream parameters (a stream that starts is left at once).
	hostileChangeQueries = []string{"", "?since=now", "?since=beginning", "?since=AQAAAAA", "?since=" + strings.Repeat("A", 200000), "?since=!!",
		"?tables=Profile,Nope", "?partitions=0,64", "?partitions=-1", "?fields=lastName", "?fields=nosuch", "?version=99", "?before=maybe",
		"?transactions=true&heartbeat=1ns", "?heartbeat=10h", "?bogus=1", "?tables=" + strings.Repeat("T,", 1000), "?since=now&since=beginning", "?tables=Profile&tables=Message"}
	// Backup parameters, and lines of restore bodies: a valid row and
	// mark of the demo database among bad ones (table T's rows never hold
	// a document T reads: the sentinels stay).
	hostileBackupQueries = []string{"", "?partitions=0,1", "?partitions=64", "?partitions=-1", "?partitions=x", "?partitions=1&partitions=2", "?since=now"}
	hostileRestoreLines  = []string{
		`{"type":"row","table":"Profile","key":[1],"version":1,"ts_ms":1,"avro":"AAAAAA=="}`,
		`{"type":"mark","table":"Message","key":["alice",9]}`,
		`{"type":"row","table":"T","key":["1"],"version":1,"avro":"/w=="}`,
		`{"type":"row","table":"T","key":["1"],"version":1,"avro":"AmE="}` + `,"x":1}`,
		`{"type":"row","table":"Profile","key":[1],"version":99,"avro":"AAAAAA=="}`,
		`{"type":"row","table":"Profile","key":["x"],"version":1,"avro":"AAAAAA=="}`,
		`{"type":"row","table":"Profile","key":[1,2],"version":1,"avro":"AAAAAA=="}`,
		`{"type":"row","table":"Profile","key":[1],"version":1,"avro":"!!"}`,
		`{"type":"row","table":"Profile","key":[1],"version":1,"avro":"AAAAAA==","avro":"AA=="}`,
		`{"type":"mark","table":"Profile","key":[1]}`,
		`{"type":"mark","table":"Message","key":["alice",9],"avro":"AA=="}`,
		`{"type":"mark","table":"Message","key":["alice",99999999999999999999]}`,
		`{"type":"row","table":"Nope","key":[1],"version":1,"avro":"AA=="}`,
		`{"type":"backup","format":1}`, `{"type":"partition","partition":0}`, `{"type":"row"}`, `{}`, "", "{", "ÿ",
		`{"type":"row","table":"Profile","key":[` + strings.Repeat("[", 200) + `1` + strings.Repeat("]", 200) + `],"version":1}`,
	}
	hostileHeaders = map[string][]string{
		"If-Match":          {"", "*", `"x"`, `W/"x"`, "garbage", `"a", b`, strings.Repeat(`"x",`, 500), `"1.1.0"`, `"1.2f.41d912ff+v2"`, `"ffffffff.ffffffffffffffff.ffffffff+v99999999999+f0"`, `"1.1"`},
		"If-None-Match":     {"", "*", `"x"`, "garbage", `"1.1.0+v1"`, `W/"1.2f.41d912ff+fdeadbeef"`, `"0.0.0"`},
		"Accept":            {"application/json", "avro/binary; version=0", "avro/binary; version=1", "avro/binary; version=99", "avro/binary; version=-1", "text/html", "*/*", ";;;", "application/x-ndjson", "application/x-ndjson, application/json"},
		"Content-Type":      {"application/json", "avro/binary; version=1", "avro/binary; version=0", "avro/binary", "text/plain", "application/json; charset=latin1", "application/json; charset=UTF-8", "application/merge-patch+json"},
		"Cache-Control":     {"max-stale", "max-stale=abc", "no-cache", "max-stale=-1"},
		"If-Modified-Since": {"yesterday", "Mon, 01 Jan 3000 00:00:00 GMT"},
		"Request-Timeout":   {"1", "0.001", "0", "-5", "1e9", "5ms", "never", "NaN", "1e-10"},
		"Content-Encoding":  {"gzip", "identity", "br, gzip", ""},
		"Prefer":            {"partial-ok", "partial-ok, x", "garbage"},
		"X-Cortado-Client":  {"", "app", strings.Repeat("c", 300), "\x7f"},
		"Last-Event-ID":     {"", "now", "AQAAAAA", "garbage", strings.Repeat("A", 100000)},
	}
	hostileBodies = []string{
		`{"firstName":{"en":"Ada"},"lastName":"L"}`,
		`{"from":"a","subject":"s"}`,
		`{"total":1}`,
		`{"increment":{"total":1}}`,
		`{"set":{"lastName":"M"}}`,
		`{"ops":[{"op":"put","table":"Profile","key":[1],"document":{"firstName":{},"lastName":"x"}}]}`,
		`{"key":[{"name":"k"}],"schema":{"type":"record","name":"N","fields":[{"name":"v","type":"int"},{"name":"next","type":["null","N"],"default":null}]}}`,
		`{"key":[{"name":"k"}],"schema":{"type":"record","name":"A","fields":[{"name":"a","type":"A"}]}}`,
		// Index annotations: valid, on a recursive type, nested, on the wrong type, with stop words.
		`{"key":[{"name":"k"}],"schema":{"type":"record","name":"I","fields":[{"name":"t","type":"string","index":"text","stopWords":true},{"name":"n","type":["null","long"],"default":null,"index":"attribute"}]}}`,
		`{"key":[{"name":"k"}],"schema":{"type":"record","name":"R","fields":[{"name":"next","type":["null","R"],"default":null},{"name":"v","type":"string","index":"attribute"}]}}`,
		`{"key":[{"name":"k"}],"schema":{"type":"record","name":"J","fields":[{"name":"r","type":{"type":"record","name":"K","fields":[{"name":"x","type":"string","index":"text"}]}}]}}`,
		`{"key":[{"name":"k"}],"schema":{"type":"record","name":"L","fields":[{"name":"m","type":{"type":"map","values":"string"},"index":"attribute","stopWords":"yes"}]}}`,
		`{"key":[{"name":"k"}],"schema":{"type":"record","name":"B","fields":[{"name":"n","type":"int","default":99999999999}]}}`,
		`{"key":[{"name":"k"}],"schema":{"type":"record","name":"F","fields":[{"name":"f","type":{"type":"fixed","name":"X","size":2147483647}}]}}`,
		`{"partitions":0}`, `{"retention":{"maxBytes":0}}`, `{"replicas":5}`, `{"compatibility":"NONE"}`,
		// Merge patches of a database's definition (PATCH /_schemata/{db}).
		`{"retention":{"maxAge":null,"maxBytes":2048}}`, `{"retention":null}`, `{"replicas":null}`, `{"name":"other"}`, `{"retention":{"maxAge":"-1h"}}`,
		`{"partitions":64,"replicas":1,"tables":[]}`, `{"retention":{"maxSlaveLag":"0s","x":1}}`, `{"minInSync":0}`, `{"replicas":1e400}`,
		`{"lastName":"L","lastName":"M","firstName":{}}`,
		"{\"lastName\":\"\xff\",\"firstName\":{}}",
		`{"lastName":"\ud800","firstName":{}}`,
		`{"score":1e400}`, `{"lastName":99999999999999999999999}`,
		strings.Repeat(`{"a":`, 5000) + "1" + strings.Repeat("}", 5000),
		strings.Repeat("[", 100000),
		`{"firstName":{"en":"` + strings.Repeat("x", 70000) + `"},"lastName":"L"}`,
		"\x02\x02\x02\x02\xff\xff\xff\xff\xff\x01",
		"", "null", "[]", `"x"`, "{", "}",
	}
)

func pick[T any](rng *rand.Rand, xs []T) T { return xs[rng.IntN(len(xs))] }

// nextHostile generates one request.
func nextHostile(rng *rand.Rand) hostileRequest {
	r := hostileRequest{method: pick(rng, hostileMethods), header: http.Header{}}
	switch rng.IntN(10) {
	case 0:
		r.path = "/_schemata/" + pick(rng, hostileDBs)
		if rng.IntN(2) == 0 {
			r.path += "/" + pick(rng, hostileTables)
			if rng.IntN(3) == 0 {
				r.path += "/" + pick(rng, []string{"1", "_config", "x", "-1", "99999999999999999999"})
			}
		}
	case 1:
		r.path = "/" + pick(rng, hostileDBs) + "/_txn/" + pick(rng, hostileKeys)
	case 2:
		r.path = pick(rng, []string{"/", "//", "/demo//Profile/1", "/demo/./Profile/1", "/demo/Profile/../Message/a/1", "/sentinel/T/1/", "/sentinel/T/%2E%2E/", "/demo/Message/alice/", "/healthz", "/metrics", "/_cluster", "/_admin", "/demo", "/_cluster/check?db=nosuch", "/_cluster/check?database=demo&db=a&db=b",
			"/_schemata", "/_schemata?limit=1&after=d", "/_schemata?limit=0", "/_schemata?limit=10001", "/_schemata?after=%FF%FE", "/_schemata?after=a&after=b", "/_schemata?next=x"})
	case 3:
		r.path = "/" + pick(rng, hostileDBs) + "/_changes" + pick(rng, hostileChangeQueries)
		r.header.Set("Accept", pick(rng, []string{"text/event-stream", "application/x-ndjson", "*/*"}))
		return r
	case 4:
		if rng.IntN(3) == 0 {
			r.path = "/" + pick(rng, hostileDBs) + "/_backup" + pick(rng, hostileBackupQueries)
			return r
		}
		r.method = pick(rng, []string{"POST", "POST", "POST", "PUT", "GET"})
		r.path = "/" + pick(rng, hostileDBs) + "/_restore" + pick(rng, []string{"", "", "?x=1"})
		r.header.Set("Content-Type", pick(rng, []string{"application/x-ndjson", "application/x-ndjson", "application/json", "application/x-ndjson; charset=latin1"}))
		var b []byte
		for range 1 + rng.IntN(4) {
			b = append(append(b, pick(rng, hostileRestoreLines)...), '\n')
		}
		if rng.IntN(3) == 0 {
			b[rng.IntN(len(b))] ^= byte(1 + rng.IntN(255))
		}
		r.body = b
		return r
	default:
		r.path = "/" + pick(rng, hostileDBs) + "/" + pick(rng, hostileTables)
		for range rng.IntN(4) {
			r.path += "/" + pick(rng, hostileKeys)
		}
	}
	r.path += pick(rng, hostileQueries)
	for name, values := range hostileHeaders {
		if rng.IntN(3) == 0 {
			r.header.Set(name, pick(rng, values))
		}
	}
	if r.method != "GET" && r.method != "HEAD" && r.method != "DELETE" || rng.IntN(8) == 0 {
		b := []byte(pick(rng, hostileBodies))
		if len(b) > 0 && rng.IntN(3) == 0 { // a few flipped, cut or repeated bytes
			switch rng.IntN(3) {
			case 0:
				b[rng.IntN(len(b))] ^= byte(1 + rng.IntN(255))
			case 1:
				b = b[:rng.IntN(len(b))]
			default:
				b = append(b, b...)
			}
		}
		r.body = b
		if r.header.Get("Content-Type") == "" {
			r.header.Set("Content-Type", "application/json")
		}
	}
	if strings.HasPrefix(r.path, "/sentinel/") && r.method == "DELETE" {
		r.header.Set("If-Match", "garbage") // must be refused, changing nothing
	}
	return r
}

// The 503s the API documents; any other 5xx is a failure.
var documented503 = []string{"unavailable", "not-replicated", "not-enough-replicas", "deadline-exceeded", "overloaded"}

// checkHostile sends r and returns what is wrong with the answer, if
// anything: a 5xx other than a documented 503, an error that is not
// problem+json, a problem without a type, a detail echoing the input.
func checkHostile(hc *http.Client, base string, r hostileRequest) string {
	req, err := http.NewRequest(r.method, base+r.path, bytes.NewReader(r.body))
	if err != nil {
		return "" // the client refuses to send it: nothing reached the server
	}
	req.Header = r.header.Clone()
	// A change stream never ends: leaving it cancels the request first,
	// so closing its body does not wait on it.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req = req.WithContext(ctx)
	resp, err := hc.Do(req)
	if err != nil && strings.Contains(err.Error(), "net/http: invalid") {
		return "" // the client would not send it (a bad header): nothing reached the server
	}
	if err != nil && (strings.Contains(err.Error(), "broken pipe") || strings.Contains(err.Error(), "connection reset")) {
		// The server refused the request line and closed the
		// connection while the body was still being sent; whether it
		// survived is what alive checks next.
		return ""
	}
	if err != nil {
		return fmt.Sprintf("%s %.80s: no answer: %v", r.method, r.path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 400 {
		cancel()
		return "" // not read: a change stream never ends
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	// What Go's HTTP server refuses before any handler runs (a malformed
	// request line, oversized headers) is a problem too (docs/api.md).
	if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
		return fmt.Sprintf("%s %.80s: %d with Content-Type %q: %.200s", r.method, r.path, resp.StatusCode, ct, b)
	}
	if r.method == "HEAD" {
		return ""
	}
	var p struct {
		Type   string
		Status int
		Detail string
	}
	if err := json.Unmarshal(b, &p); err != nil || p.Type == "" || p.Status != resp.StatusCode {
		return fmt.Sprintf("%s %.80s: %d, not a problem: %.200s", r.method, r.path, resp.StatusCode, b)
	}
	if resp.StatusCode >= 500 {
		typ := strings.TrimPrefix(p.Type, "urn:cortado:problem:")
		if resp.StatusCode != 503 || !slicesContains(documented503, typ) {
			return fmt.Sprintf("%s %.80s: %d %s: %.300s", r.method, r.path, resp.StatusCode, p.Type, p.Detail)
		}
	}
	if len(p.Detail) > 600 {
		return fmt.Sprintf("%s %.80s: a %d-byte detail", r.method, r.path, len(p.Detail))
	}
	return ""
}

func slicesContains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// hostileServer is a `cortado serve` with the demo database and a
// sentinel database whose documents no generated request may change.
type hostileServer struct {
	s         *Serve
	admin     string            // the operators' port (--admin-listen), hostile input's too
	sentinels map[string]string // path → body + ETag + SCN
}

// sentinelPaths are documents the generator only ever sends bad input to
// (database "sentinel" is never given a valid body: its table T has a
// field no generated body has).
var sentinelPaths = []string{"/sentinel/T/1", "/sentinel/T/2", "/sentinel/T/%2E%2E"}

func startHostileServer(t testing.TB) *hostileServer {
	admin, err := coord.FreeLoopbackURL()
	if err != nil {
		t.Fatal(err)
	}
	// The heap floor well under the memory bound alive checks: at the
	// default (1 GiB) the collector lets garbage reach the bound itself,
	// and a long fuzz run crossed it with nothing growing.
	s := StartServe(t, ServeOptions{Args: []string{"--demo", "--max-body-bytes", "131072", "--body-timeout", "2s",
		"--heap-floor", "268435456", "--admin-listen", strings.TrimPrefix(admin, "http://")}})
	hc := &http.Client{Timeout: 10 * time.Second}
	must := func(method, path, body string, want int) {
		req, _ := http.NewRequest(method, s.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil || resp.StatusCode != want {
			t.Fatalf("%s %s: %v %v", method, path, resp, err)
		}
		resp.Body.Close()
	}
	must("PUT", "/_schemata/sentinel", `{}`, 201)
	must("PUT", "/_schemata/sentinel/T", `{"key":[{"name":"k"}],"schema":{"type":"record","name":"T","fields":[{"name":"sentinelValue","type":"string"}]}}`, 201)
	hs := &hostileServer{s: s, admin: admin, sentinels: map[string]string{}}
	awaitHealthy(t, http.DefaultClient, admin)
	for i, p := range sentinelPaths {
		must("PUT", p, fmt.Sprintf(`{"sentinelValue":"value %d"}`, i), 201)
	}
	hs.sentinels = hs.read(t)
	return hs
}

func (hs *hostileServer) read(t testing.TB) map[string]string {
	out := map[string]string{}
	for _, p := range sentinelPaths {
		resp, err := http.Get(hs.s.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		out[p] = fmt.Sprintf("%d %s %s %s", resp.StatusCode, b, resp.Header.Get("ETag"), resp.Header.Get("X-Cortado-SCN"))
	}
	return out
}

// verify checks that the server is alive, within its memory bound, and
// that no sentinel changed.
func (hs *hostileServer) verify(t testing.TB) {
	hs.alive(t)
	for p, was := range hs.sentinels {
		if now := hs.read(t)[p]; now != was {
			t.Fatalf("sentinel %s changed:\n%s\n%s", p, was, now)
		}
	}
}

// alive checks that the server answers /healthz within its memory bound.
func (hs *hostileServer) alive(t testing.TB) {
	hc := &http.Client{Timeout: 2 * time.Second}
	resp, err := hc.Get(hs.s.URL + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the server is not healthy after hostile input: %v %v\n%s", resp, err, hs.s.Log())
	}
	resp.Body.Close()
	if rss := rssBytes(hs.s.Pid()); rss > 1<<30 {
		t.Fatalf("the server holds %d MB after hostile input", rss>>20)
	}
}

// rssBytes is a process's resident set size (0 where /proc has none).
func rssBytes(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// TestHTTPHostileRequests sends generated hostile requests (fixed seed,
// bounded count) to a real server, on its document port and its admin
// port (--admin-listen): none may get a 5xx other than a
// documented 503 or a non-problem error, and afterwards the server is
// alive, within a memory bound, and the sentinel documents are unchanged.
func TestHTTPHostileRequests(t *testing.T) {
	hs := startHostileServer(t)
	hc := &http.Client{Timeout: 15 * time.Second}
	rng := rand.New(rand.NewPCG(9, 9))
	n := 3000
	if testing.Short() {
		n = 300
	}
	for i := range n {
		r := nextHostile(rng)
		for _, base := range []string{hs.s.URL, hs.admin} {
			if bad := checkHostile(hc, base, r); bad != "" {
				t.Fatalf("request %d to %s: %s", i, base, bad)
			}
		}
	}
	hs.verify(t)
	t.Logf("%d hostile requests; RSS %d MB", n, rssBytes(hs.s.Pid())>>20)
}

// FuzzHTTPAPI is the same property under Go's fuzzer: method, path,
// headers ("Name: value" lines) and body are the fuzzer's. The seeds are
// generated requests. `scripts/test` runs it for a bounded time.
func FuzzHTTPAPI(f *testing.F) {
	rng := rand.New(rand.NewPCG(3, 3))
	for range 40 {
		r := nextHostile(rng)
		var hdr strings.Builder
		for k, vs := range r.header {
			fmt.Fprintf(&hdr, "%s: %s\n", k, vs[0])
		}
		f.Add(r.method, r.path, hdr.String(), r.body)
	}
	// Every input ends (request and liveness check) well inside the 10 s
	// after which Go's fuzz worker gives up on an input as hung.
	hc := &http.Client{Timeout: 6 * time.Second}
	fuzzServer := startHostileServer(f)
	f.Fuzz(func(t *testing.T, method, path, headers string, body []byte) {
		r := hostileRequest{method: method, path: path, header: http.Header{}, body: body}
		if !strings.HasPrefix(r.path, "/") {
			r.path = "/" + r.path
		}
		for _, line := range strings.Split(headers, "\n") {
			if k, v, ok := strings.Cut(line, ": "); ok && k != "" {
				r.header.Add(k, v)
			}
		}
		// Headers the transport interprets are not the API's input.
		for _, k := range []string{"Content-Length", "Transfer-Encoding", "Connection", "Host", "Expect", "Upgrade", "Te", "Trailer"} {
			r.header.Del(k)
		}
		for _, base := range []string{fuzzServer.s.URL, fuzzServer.admin} {
			if bad := checkHostile(hc, base, r); bad != "" {
				t.Fatal(base, bad)
			}
		}
		// The fuzzer may spell a valid write to a sentinel: only
		// liveness and memory are checked here (the generated test
		// checks the sentinels).
		fuzzServer.alive(t)
	})
}

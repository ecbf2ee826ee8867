package clustertest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

type httpCase struct {
	t    *testing.T
	base string
}

type resp struct {
	status int
	header http.Header
	body   []byte
}

func (h httpCase) do(method, path string, headers map[string]string, body string) resp {
	h.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, h.base+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return resp{r.StatusCode, r.Header, b}
}

func (h httpCase) want(r resp, status int) resp {
	h.t.Helper()
	if r.status != status {
		h.t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
	return r
}

// problem checks an RFC 9457 body and returns it.
func (h httpCase) problem(r resp, status int, typ string) map[string]any {
	h.t.Helper()
	h.want(r, status)
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		h.t.Fatalf("problem content type %q", ct)
	}
	var p map[string]any
	if err := json.Unmarshal(r.body, &p); err != nil {
		h.t.Fatalf("problem body: %v: %s", err, r.body)
	}
	if p["type"] != typ || int(p["status"].(float64)) != status || p["title"] == "" {
		h.t.Fatalf("problem %v, want type %s status %d", p, typ, status)
	}
	return p
}

// tagCRC is the CRC of the stored bytes a document's entity tag ends
// with (storage.Doc.ETag): equal for equal documents, whatever commit
// wrote them.
func tagCRC(tag string) string { return tag[strings.LastIndexByte(tag, '.')+1:] }

func TestHTTPAPI(t *testing.T) {
	s := StartServe(t, ServeOptions{Args: []string{"--demo", "--max-body-bytes", "4096", "--max-response-bytes", "4096"}})
	h := httpCase{t, s.URL}

	// Health and metrics.
	h.want(h.do("GET", "/healthz", nil, ""), 200)

	// Writes: 201 with Location, ETag, Last-Modified, SCN.
	r := h.want(h.do("PUT", "/demo/Profile/7", nil, `{"firstName":{"en":"Ada"},"lastName":"L","positions":{"p1":{"title":"Eng","company":"X"}}}`), 201)
	if r.header.Get("Location") != "/demo/Profile/7" || r.header.Get("ETag") == "" || r.header.Get("X-Cortado-SCN") != "1:1" || r.header.Get("Last-Modified") == "" {
		t.Fatalf("create headers %v", r.header)
	}
	etag := r.header.Get("ETag")
	// Replace: 204. A replace with the same content is a new version,
	// with a tag of its own: a writer that read the first one is told
	// the document changed since.
	r = h.want(h.do("PUT", "/demo/Profile/7", nil, `{"firstName":{"en":"Ada"},"lastName":"L","positions":{"p1":{"title":"Eng","company":"X"}}}`), 204)
	if r.header.Get("ETag") == etag || r.header.Get("ETag") == "" || r.header.Get("X-Cortado-SCN") != "1:2" {
		t.Fatalf("replace headers %v, the first version's tag %s", r.header, etag)
	}
	h.problem(h.do("PUT", "/demo/Profile/7", map[string]string{"If-Match": etag}, `{"firstName":{},"lastName":"lost update"}`), 412, "urn:cortado:problem:precondition-failed")
	etag = r.header.Get("ETag")

	// Reads carry ETag, Last-Modified, SCN, schema version.
	r = h.want(h.do("GET", "/demo/Profile/7", nil, ""), 200)
	for _, k := range []string{"ETag", "Last-Modified", "X-Cortado-SCN", "X-Cortado-Schema-Version"} {
		if r.header.Get(k) == "" {
			t.Fatalf("read lacks %s: %v", k, r.header)
		}
	}
	if r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("content type %q", r.header.Get("Content-Type"))
	}
	h.want(h.do("HEAD", "/demo/Profile/7", nil, ""), 200)
	h.want(h.do("GET", "/demo/Profile/7", map[string]string{"If-None-Match": etag}, ""), 304)
	h.want(h.do("GET", "/demo/Profile/7", map[string]string{"If-Modified-Since": time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)}, ""), 304)
	h.want(h.do("GET", "/demo/Profile/7", map[string]string{"If-Modified-Since": time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)}, ""), 200)
	h.problem(h.do("GET", "/demo/Profile/7", map[string]string{"If-Match": `"nope"`}, ""), 412, "urn:cortado:problem:precondition-failed")

	// Avro out, as written and as a version; Avro in.
	r = h.want(h.do("GET", "/demo/Profile/7", map[string]string{"Accept": "avro/binary; version=0"}, ""), 200)
	if r.header.Get("Content-Type") != "avro/binary; version=1" || len(r.body) == 0 {
		t.Fatalf("avro read %v %x", r.header, r.body)
	}
	avroDoc := r.body
	req, _ := http.NewRequest("PUT", s.URL+"/demo/Profile/8", bytes.NewReader(avroDoc))
	req.Header.Set("Content-Type", "avro/binary; version=1")
	ar, err := http.DefaultClient.Do(req)
	if err != nil || ar.StatusCode != 201 {
		t.Fatalf("avro put: %v %v", ar.StatusCode, err)
	}
	ar.Body.Close()
	r8 := h.want(h.do("GET", "/demo/Profile/8", nil, ""), 200)
	r7 := h.want(h.do("GET", "/demo/Profile/7", nil, ""), 200)
	if !bytes.Equal(r7.body, r8.body) {
		t.Fatalf("avro round trip differs:\n%s\n%s", r7.body, r8.body)
	}
	// The same document, written as JSON and as Avro, is stored as the
	// same bytes: the CRC its tag ends with is one (the tags' SCNs are
	// the two commits').
	if tagCRC(r7.header.Get("ETag")) != tagCRC(r8.header.Get("ETag")) || r7.header.Get("ETag") == r8.header.Get("ETag") || r7.header.Get("Vary") != "Accept" {
		t.Fatalf("ETags by input format: %s vs %s; Vary %q", r7.header.Get("ETag"), r8.header.Get("ETag"), r7.header.Get("Vary"))
	}
	// A projection is a representation of its own: its media type names
	// the fields, its ETag differs, and that ETag revalidates it.
	r = h.want(h.do("GET", "/demo/Profile/7?fields=lastName", map[string]string{"Accept": "avro/binary; version=1"}, ""), 200)
	if ct := r.header.Get("Content-Type"); ct != `avro/binary; version=1; fields="lastName"` {
		t.Fatalf("projected avro content type %q", ct)
	}
	pe := r.header.Get("ETag")
	if pe == r7.header.Get("ETag") || pe == "" {
		t.Fatalf("projected ETag %q equals the document's", pe)
	}
	h.want(h.do("GET", "/demo/Profile/7?fields=lastName", map[string]string{"If-None-Match": pe}, ""), 304)
	h.want(h.do("GET", "/demo/Profile/7?fields=lastName", map[string]string{"If-None-Match": r7.header.Get("ETag")}, ""), 200)
	h.want(h.do("GET", "/demo/Profile/7?fields=firstName", map[string]string{"If-None-Match": pe}, ""), 200)
	h.problem(h.do("GET", "/demo/Profile/7", map[string]string{"Accept": "text/html"}, ""), 406, "urn:cortado:problem:not-acceptable")

	// Bad input: the right status and problem type, and nothing changes.
	before := h.want(h.do("GET", "/demo/Profile/7", nil, ""), 200)
	big := `{"firstName":{"en":"` + strings.Repeat("x", 5000) + `"},"lastName":"L"}`
	cases := []struct {
		name, method, path, body string
		headers                  map[string]string
		status                   int
		typ, field               string
	}{
		{"malformed JSON", "PUT", "/demo/Profile/7", `{"firstName":`, nil, 400, "urn:cortado:problem:invalid-document", ""},
		{"wrong type", "PUT", "/demo/Profile/7", `{"firstName":{"en":"A"},"lastName":5}`, nil, 400, "urn:cortado:problem:invalid-document", "lastName"},
		{"missing required", "PUT", "/demo/Profile/7", `{"firstName":{"en":"A"}}`, nil, 400, "urn:cortado:problem:invalid-document", "lastName"},
		{"unknown field", "PUT", "/demo/Profile/7", `{"firstName":{},"lastName":"L","age":3}`, nil, 400, "urn:cortado:problem:invalid-document", "age"},
		{"nested wrong type", "PUT", "/demo/Profile/7", `{"firstName":{},"lastName":"L","positions":{"p":{"title":1,"company":"c"}}}`, nil, 400, "urn:cortado:problem:invalid-document", "positions.p.title"},
		{"unknown database", "PUT", "/nodb/Profile/7", `{}`, nil, 404, "urn:cortado:problem:no-such-database", ""},
		{"unknown table", "PUT", "/demo/Nope/7", `{}`, nil, 404, "urn:cortado:problem:no-such-table", ""},
		{"too many key parts", "PUT", "/demo/Profile/7/8", `{}`, nil, 400, "urn:cortado:problem:invalid-key", ""},
		{"key of wrong type", "PUT", "/demo/Profile/seven", `{}`, nil, 400, "urn:cortado:problem:invalid-key", ""},
		{"partial key put", "PUT", "/demo/Message/alice", `{"from":"a","subject":"s"}`, nil, 400, "urn:cortado:problem:invalid-key", ""},
		{"oversized body", "PUT", "/demo/Profile/7", big, nil, 413, "urn:cortado:problem:request-too-large", ""},
		{"bad projection path", "GET", "/demo/Profile/7?fields=positions.salary", "", nil, 400, "urn:cortado:problem:invalid-projection", "positions.salary"},
		{"wrong content type", "PUT", "/demo/Profile/7", `{}`, map[string]string{"Content-Type": "text/plain"}, 415, "urn:cortado:problem:unsupported-media-type", ""},
		{"malformed avro", "PUT", "/demo/Profile/7", "\xff\xff\xff", map[string]string{"Content-Type": "avro/binary; version=1"}, 400, "urn:cortado:problem:invalid-document", ""},
		{"bad patch", "PATCH", "/demo/Profile/7", `{"explode":1}`, nil, 400, "urn:cortado:problem:invalid-document", ""},
		{"patch to invalid", "PATCH", "/demo/Profile/7", `{"set":{"lastName":null}}`, nil, 400, "urn:cortado:problem:invalid-document", "lastName"},
		{"incompatible schema", "PUT", "/_schemata/demo/Profile", `{"schema":{"type":"record","name":"Profile","namespace":"demo","fields":[{"name":"lastName","type":"long"}]}}`, nil, 409, "urn:cortado:problem:incompatible-schema", "lastName"},
		{"invalid schema", "PUT", "/_schemata/demo/Other", `{"key":[{"name":"id"}],"schema":{"type":"record"}}`, nil, 400, "urn:cortado:problem:invalid-schema", ""},
		{"bad continuation token", "GET", "/demo/Message/alice?next=!!", "", nil, 400, "urn:cortado:problem:invalid-key", ""},
		{"method not allowed", "GET", "/demo/_txn/a", ``, nil, 405, "urn:cortado:problem:method-not-allowed", ""},
		{"not found", "GET", "/demo/Profile/99", "", nil, 404, "urn:cortado:problem:document-not-found", ""},
		{"empty If-Match", "PUT", "/demo/Profile/7", `{"firstName":{},"lastName":"X"}`, map[string]string{"If-Match": ""}, 400, "urn:cortado:problem:malformed-request", ""},
		{"malformed If-Match", "PUT", "/demo/Profile/7", `{"firstName":{},"lastName":"X"}`, map[string]string{"If-Match": "abc"}, 400, "urn:cortado:problem:malformed-request", ""},
		{"malformed If-None-Match", "PUT", "/demo/Profile/7", `{"firstName":{},"lastName":"X"}`, map[string]string{"If-None-Match": `"a", b`}, 400, "urn:cortado:problem:malformed-request", ""},
		{"non-canonical key +7", "PUT", "/demo/Profile/+7", `{"firstName":{},"lastName":"X"}`, nil, 400, "urn:cortado:problem:invalid-key", ""},
		{"non-canonical key 07", "PUT", "/demo/Profile/07", `{"firstName":{},"lastName":"X"}`, nil, 400, "urn:cortado:problem:invalid-key", ""},
		{"key not UTF-8", "PUT", "/demo/Message/%FF/1", `{"from":"a","subject":"s"}`, nil, 400, "urn:cortado:problem:invalid-key", ""},
		{"key part too long", "PUT", "/demo/Message/" + strings.Repeat("k", 1100) + "/1", `{"from":"a","subject":"s"}`, nil, 400, "urn:cortado:problem:invalid-key", ""},
		{"duplicate JSON key", "PUT", "/demo/Profile/7", `{"firstName":{},"lastName":"X","lastName":"Y"}`, nil, 400, "urn:cortado:problem:invalid-document", "lastName"},
		// A body is read as declared, or refused: never read as some
		// other thing (a patch sent as text, JSON in another charset,
		// coded bytes).
		{"patch as text", "PATCH", "/demo/Profile/7", `{"set":{"lastName":"Z"}}`, map[string]string{"Content-Type": "text/plain"}, 415, "urn:cortado:problem:unsupported-media-type", ""},
		{"transaction as text", "POST", "/demo/_txn/7", `{"ops":[{"op":"delete","table":"Profile","key":[7]}]}`, map[string]string{"Content-Type": "text/plain"}, 415, "urn:cortado:problem:unsupported-media-type", ""},
		{"JSON in latin1", "PUT", "/demo/Profile/7", "{\"firstName\":{},\"lastName\":\"\xc3\xa9\"}", map[string]string{"Content-Type": "application/json; charset=iso-8859-1"}, 415, "urn:cortado:problem:unsupported-media-type", ""},
		{"coded body", "PUT", "/demo/Profile/7", `{"firstName":{},"lastName":"Z"}`, map[string]string{"Content-Encoding": "gzip"}, 415, "urn:cortado:problem:unsupported-media-type", ""},
		// Conditions where they cannot apply are refused, not ignored
		// (the write would be taken for a conditional one).
		{"conditional insert", "POST", "/demo/Message/alice", `{"from":"a","subject":"s"}`, map[string]string{"If-Match": `"x"`}, 400, "urn:cortado:problem:malformed-request", ""},
		{"conditional header on a transaction", "POST", "/demo/_txn/7", `{"ops":[{"op":"delete","table":"Profile","key":[7]}]}`, map[string]string{"If-Match": `"x"`}, 400, "urn:cortado:problem:malformed-request", ""},
		// A trailing "/" is an empty key part, not nothing: trimmed, it
		// deleted the document (and /demo/Message/alice/ a collection).
		{"trailing slash", "DELETE", "/demo/Profile/7/", "", nil, 400, "urn:cortado:problem:malformed-request", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := httpCase{t, s.URL}
			r := h.do(c.method, c.path, c.headers, c.body)
			p := h.problem(r, c.status, c.typ)
			if c.field != "" && p["field"] != c.field {
				t.Fatalf("field %v, want %s", p["field"], c.field)
			}
			if len(r.body) > 1024 {
				t.Fatalf("a %d-byte problem echoes the input", len(r.body))
			}
			after := h.want(h.do("GET", "/demo/Profile/7", nil, ""), 200)
			if !bytes.Equal(after.body, before.body) || after.header.Get("X-Cortado-SCN") != before.header.Get("X-Cortado-SCN") {
				t.Fatal("bad input changed the document")
			}
		})
	}
	r = h.want(h.do("GET", "/_schemata/demo/Profile", nil, ""), 200)
	if !strings.Contains(string(r.body), `"latest":1`) {
		t.Fatalf("refused schema registered: %s", r.body)
	}
	h.problem(h.do("GET", "/_schemata/demo/Profile/9", nil, ""), 404, "urn:cortado:problem:no-such-schema-version")
	h.want(h.do("GET", "/_schemata/demo/Profile/1", nil, ""), 200)

	// A response over the limit is 413 and suggests projection; the
	// projected read fits.
	// U+2028 is three bytes in and six out (\u2028).
	long := strings.Repeat("\u2028", 800)
	h.want(h.do("PUT", "/demo/Profile/9", nil, `{"firstName":{"a":"`+long+`"},"lastName":"L"}`), 201)
	p := h.problem(h.do("GET", "/demo/Profile/9", nil, ""), 413, "urn:cortado:problem:response-too-large")
	if !strings.Contains(p["detail"].(string), "fields=") {
		t.Fatalf("413 does not suggest projection: %v", p)
	}
	h.want(h.do("GET", "/demo/Profile/9?fields=lastName", nil, ""), 200)

	// Collections and multi-gets.
	for _, m := range []string{`{"from":"a","subject":"1"}`, `{"from":"b","subject":"2"}`, `{"from":"c","subject":"3"}`} {
		r = h.want(h.do("POST", "/demo/Message/box", nil, m), 201)
	}
	if r.header.Get("Location") != "/demo/Message/box/3" || string(r.body) != `{"key":["box",3]}` {
		t.Fatalf("auto-increment: %v %s", r.header, r.body)
	}
	r = h.want(h.do("GET", "/demo/Message/box?limit=2&fields=subject", nil, ""), 200)
	var page struct {
		Documents []struct {
			Key      []any
			Document map[string]any
		}
		Next string
	}
	json.Unmarshal(r.body, &page)
	if len(page.Documents) != 2 || page.Next == "" || page.Documents[1].Document["subject"] != "2" || r.header.Get("ETag") == "" {
		t.Fatalf("collection page: %s", r.body)
	}
	h.want(h.do("GET", "/demo/Message/box?limit=2&fields=subject", map[string]string{"If-None-Match": r.header.Get("ETag")}, ""), 304)
	// A page's token continues its own collection only: in another, it
	// read from that one's start ("a" sorts before "box") or read
	// nothing ("c" after), as if at its end.
	for _, other := range []string{"a", "c"} {
		h.want(h.do("POST", "/demo/Message/"+other, nil, `{"from":"a","subject":"1"}`), 201)
		h.problem(h.do("GET", "/demo/Message/"+other+"?limit=2&next="+page.Next, nil, ""), 400, "urn:cortado:problem:invalid-key")
	}
	r = h.want(h.do("GET", "/demo/Message/box?limit=2&next="+page.Next, nil, ""), 200)
	page.Next = ""
	json.Unmarshal(r.body, &page)
	if len(page.Documents) != 1 || page.Next != "" {
		t.Fatalf("second page: %s", r.body)
	}
	r = h.want(h.do("GET", "/demo/Message/box/(3,1,5)?fields=from", nil, ""), 200)
	if string(r.body) == "" || !strings.Contains(string(r.body), `"missing":[["box",5]]`) {
		t.Fatalf("multi-get: %s", r.body)
	}
	h.problem(h.do("GET", "/demo/Message/box?limit=2", map[string]string{"Accept": "avro/binary"}, ""), 406, "urn:cortado:problem:not-acceptable")
	// A query parameter a request does not take is refused, not ignored,
	// and changes nothing: a DELETE of a collection "by query" would
	// otherwise delete all of it, a misspelt parameter read everything.
	for _, c := range []struct{ method, path, detail string }{
		{"DELETE", "/demo/Message/box?query=subject:1", `"query" is not a parameter of a write, which takes none`},
		{"PUT", "/demo/Message/box/1?fields=subject", `"fields" is not a parameter of a write, which takes none`},
		{"GET", "/demo/Message/box?qeury=subject:1", `"qeury" is not a parameter of a collection read, which takes fields, limit and next`},
		{"GET", "/demo/Message/box?sort=createdOn", `"sort" is not a parameter of a collection read`},
		{"GET", "/demo/Message/box/1?limit=1", `"limit" is not a parameter of a document read, which takes fields`},
		{"GET", "/demo/Message/box/(1,2)?next=x", `"next" is not a parameter of a multi-get`},
		{"GET", "/demo/Message/box?limit=1&limit=1000", `"limit" is given 2 times`},
		{"GET", "/demo/Message/box?query=subject:1&query=subject:2", `"query" is given 2 times`},
		{"POST", "/demo/_txn/box?dryRun=true", `"dryRun" is not a parameter of a transaction`},
		{"GET", "/_schemata/demo?pretty", `"pretty" is not a parameter of a schema request`},
		{"GET", "/demo/Message/box?limit=1;next=x", `invalid semicolon separator`},
		{"GET", "/demo/Message/box?limit=0", `limit must be a positive integer, not "0"`},
		{"GET", "/demo/Message/box?query=subject:1&limit=1e2", `limit must be a positive integer, not "1e2"`},
		{"GET", "/demo/Message/box?limit=1001", `limit 1001 is over the maximum 1000`},
	} {
		p := h.problem(h.do(c.method, c.path, nil, `{"subject":"x"}`), 400, "urn:cortado:problem:malformed-request")
		if d, _ := p["detail"].(string); !strings.Contains(d, c.detail) {
			t.Fatalf("%s %s: detail %q, want it to say %q", c.method, c.path, d, c.detail)
		}
	}
	r = h.want(h.do("GET", "/demo/Message/box?query=subject:1&sort=-createdOn&fields=subject&limit=5", nil, ""), 200)
	if !strings.Contains(string(r.body), `"subject":"1"`) {
		t.Fatalf("a query with every parameter it takes: %s", r.body)
	}
	r = h.want(h.do("DELETE", "/demo/Message/box", nil, ""), 200)
	if string(r.body) != `{"deleted":3}` {
		t.Fatalf("collection delete: %s", r.body)
	}
	h.want(h.do("DELETE", "/demo/Profile/8", nil, ""), 204)

	// Metrics count what was served.
	r = h.want(h.do("GET", "/metrics", nil, ""), 200)
	for _, m := range []string{`cortado_requests_total{code="201",method="PUT",route="document"}`, "cortado_request_duration_seconds_bucket", "cortado_pebble_disk_usage_bytes"} {
		if !strings.Contains(string(r.body), m) {
			t.Fatalf("metrics lack %s", m)
		}
	}
}

// rawHTTP sends a request as raw bytes (what a hostile client can send
// that net/http's client would not) and returns the status line and body.
func rawHTTP(t *testing.T, base, request string, pause time.Duration, rest string) (string, string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write([]byte(request))
	if pause > 0 {
		time.Sleep(pause)
		conn.Write([]byte(rest))
	}
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%q: %v", request[:min(len(request), 60)], err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.Status + " " + resp.Header.Get("Content-Type"), string(b)
}

// TestHTTPHostileTransport: what a hostile client does below the
// document level gets a problem with the right status, never a 500, a
// redirect or a hang: a malformed chunked body (400), a body that
// trickles (408 after --body-timeout), a client that leaves mid-body
// (counted as 499), a path with "//" or ".." (400, not a redirect to
// another document), explicit zero sizes and more replicas than nodes
// (400), a schema larger than etcd takes (413).
func TestHTTPHostileTransport(t *testing.T) {
	s := StartServe(t, ServeOptions{Args: []string{"--demo", "--body-timeout", "1s"}})
	h := httpCase{t, s.URL}
	put := "PUT /demo/Profile/7 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"

	status, body := rawHTTP(t, s.URL, put+"Transfer-Encoding: chunked\r\n\r\nZZ\r\nxx\r\n0\r\n\r\n", 0, "")
	if !strings.HasPrefix(status, "400") || !strings.Contains(status, "problem+json") {
		t.Fatalf("malformed chunked body: %s %s", status, body)
	}
	start := time.Now()
	status, body = rawHTTP(t, s.URL, put+"Content-Length: 100\r\n\r\n{\"lastName\"", 0, "")
	if !strings.HasPrefix(status, "408") || time.Since(start) > 10*time.Second {
		t.Fatalf("trickling body: %s %s after %v", status, body, time.Since(start))
	}
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	conn.Write([]byte(put + "Content-Length: 100\r\n\r\n{\"last"))
	time.Sleep(100 * time.Millisecond)
	conn.Close()
	await(t, 10*time.Second, "the aborted request counted as 499", func() bool {
		r := h.do("GET", "/metrics", nil, "")
		return strings.Contains(string(r.body), `code="499"`)
	})
	for _, path := range []string{"/demo//Profile/7", "/demo/Profile/../Message/x/1", "/demo/./Profile/7"} {
		status, body = rawHTTP(t, s.URL, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n", 0, "")
		if !strings.HasPrefix(status, "400") || !strings.Contains(status, "problem+json") {
			t.Fatalf("GET %s: %s %s", path, status, body)
		}
	}
	h.problem(h.do("PUT", "/_schemata/zero", nil, `{"partitions":0}`), 400, "urn:cortado:problem:invalid-schema")
	h.problem(h.do("PUT", "/_schemata/zero", nil, `{"replicas":0}`), 400, "urn:cortado:problem:invalid-schema")
	h.problem(h.do("PUT", "/_schemata/zero", nil, `{"retention":{"maxBytes":0}}`), 400, "urn:cortado:problem:invalid-schema")
	h.problem(h.do("PUT", "/_schemata/many", nil, `{"replicas":2}`), 400, "urn:cortado:problem:invalid-schema")
	h.want(h.do("GET", "/_schemata/zero", nil, ""), 404)
	fields := make([]string, 6000)
	for i := range fields {
		fields[i] = fmt.Sprintf(`{"name":"field_number_%d","type":"string","default":""}`, i)
	}
	big := `{"key":[{"name":"k"}],"schema":{"type":"record","name":"Big","fields":[` + strings.Join(fields, ",") + `]}}`
	h.problem(h.do("PUT", "/_schemata/demo/Big", nil, big), 413, "urn:cortado:problem:request-too-large")
	h.want(h.do("GET", "/_schemata/demo/Big", nil, ""), 404)
}

// TestSchemaCompatibilityLevels: a table's level is set with
// PUT /_schemata/{db}/{table}/_config and shown on GET; a rename by alias
// is refused under FULL (old readers cannot read it) and accepted under
// BACKWARD, and the refusal says which version cannot read which.
func TestSchemaCompatibilityLevels(t *testing.T) {
	s := StartServe(t, ServeOptions{})
	h := httpCase{t, s.URL}
	h.want(h.do("PUT", "/_schemata/c", nil, `{}`), 201)
	h.want(h.do("PUT", "/_schemata/c/T", nil, `{"key":[{"name":"k"}],"schema":{"type":"record","name":"T","fields":[{"name":"a","type":"string"}]}}`), 201)
	h.want(h.do("PUT", "/c/T/1", nil, `{"a":"x"}`), 201)
	r := h.want(h.do("GET", "/_schemata/c/T", nil, ""), 200)
	if !strings.Contains(string(r.body), `"compatibility":"FULL"`) {
		t.Fatalf("default level: %s", r.body)
	}
	rename := `{"schema":{"type":"record","name":"T","fields":[{"name":"b","type":"string","aliases":["a"]}]}}`
	p := h.problem(h.do("PUT", "/_schemata/c/T", nil, rename), 409, "urn:cortado:problem:incompatible-schema")
	if !strings.Contains(p["detail"].(string), "version 1 cannot read documents of version 2") {
		t.Fatalf("refusal detail: %v", p["detail"])
	}
	h.problem(h.do("PUT", "/_schemata/c/T/_config", nil, `{"compatibility":"SOMETIMES"}`), 400, "urn:cortado:problem:invalid-schema")
	h.problem(h.do("PUT", "/_schemata/c/Nope/_config", nil, `{"compatibility":"BACKWARD"}`), 404, "urn:cortado:problem:no-such-table")
	r = h.want(h.do("PUT", "/_schemata/c/T/_config", nil, `{"compatibility":"BACKWARD"}`), 200)
	if !strings.Contains(string(r.body), `"compatibility":"BACKWARD"`) {
		t.Fatalf("set level: %s", r.body)
	}
	h.want(h.do("PUT", "/_schemata/c/T", nil, rename), 201)
	// The old document reads as the new version through the alias.
	r = h.want(h.do("GET", "/c/T/1", nil, ""), 200)
	if string(r.body) != `{"b":"x"}` {
		t.Fatalf("old document as version 2: %s", r.body)
	}
}

// A representation read at a schema version other than the one its
// document was written with has an ETag of its own: registering a
// version that adds a field changes what a read gives back, so a cache
// revalidating what it read before must not be told 304. Writes compare
// the document, whatever version the writer read it at.
func TestETagFollowsSchemaVersion(t *testing.T) {
	s := StartServe(t, ServeOptions{Args: []string{"--demo"}})
	h := httpCase{t, s.URL}
	h.want(h.do("PUT", "/demo/MailboxStats/a", nil, `{"total":1}`), 201)
	v1 := h.want(h.do("GET", "/demo/MailboxStats/a", nil, ""), 200)
	e1 := v1.header.Get("ETag")
	h.want(h.do("GET", "/demo/MailboxStats/a", map[string]string{"If-None-Match": e1}, ""), 304)
	projected1 := h.want(h.do("GET", "/demo/MailboxStats/a?fields=total", nil, ""), 200).header.Get("ETag")

	h.want(h.do("PUT", "/_schemata/demo/MailboxStats", nil, `{"schema":{"type":"record","name":"MailboxStats","namespace":"demo","fields":[
	  {"name":"total","type":"long","default":0},{"name":"unread","type":"long","default":0},{"name":"flagged","type":"long","default":0}]}}`), 201)

	// The old ETag no longer names what a read gives: 200 with the new field.
	v2 := h.want(h.do("GET", "/demo/MailboxStats/a", map[string]string{"If-None-Match": e1}, ""), 200)
	wantJSON(t, v2.body, `{"total":1,"unread":0,"flagged":0}`)
	e2 := v2.header.Get("ETag")
	if e2 == e1 || e2 == "" || v2.header.Get("X-Cortado-Schema-Version") != "2" {
		t.Fatalf("after version 2: ETag %s (before %s), version %s", e2, e1, v2.header.Get("X-Cortado-Schema-Version"))
	}
	if r := h.want(h.do("GET", "/demo/MailboxStats/a", map[string]string{"If-None-Match": e2}, ""), 304); r.header.Get("ETag") != e2 {
		t.Fatalf("304 names %s, the read %s", r.header.Get("ETag"), e2)
	}
	// Last-Modified is the document's; the representation changed later,
	// so If-Modified-Since does not make it 304.
	future := time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)
	h.want(h.do("GET", "/demo/MailboxStats/a", map[string]string{"If-Modified-Since": future}, ""), 200)
	// A projection of the new shape: its own ETag again, which revalidates.
	p2 := h.want(h.do("GET", "/demo/MailboxStats/a?fields=total", map[string]string{"If-None-Match": projected1}, ""), 200).header.Get("ETag")
	if p2 == projected1 || p2 == e2 {
		t.Fatalf("projected ETag %s (before %s, unprojected %s)", p2, projected1, e2)
	}
	h.want(h.do("GET", "/demo/MailboxStats/a?fields=total", map[string]string{"If-None-Match": p2}, ""), 304)
	// As written, the bytes and their ETag did not change.
	asWritten := h.want(h.do("GET", "/demo/MailboxStats/a", map[string]string{"Accept": "avro/binary; version=0", "If-None-Match": e1}, ""), 304)
	if asWritten.header.Get("ETag") != e1 {
		t.Fatalf("as written: ETag %s, want %s", asWritten.header.Get("ETag"), e1)
	}
	// A multi-get's documents carry the same ETag as a read of each.
	var page struct{ Documents []struct{ ETag string } }
	if err := json.Unmarshal(h.want(h.do("GET", "/demo/MailboxStats/(a)", nil, ""), 200).body, &page); err != nil || len(page.Documents) != 1 || page.Documents[0].ETag != e2 {
		t.Fatalf("multi-get ETags %+v (%v), want %s", page, err, e2)
	}

	// Writes: the ETag of either read names the unchanged document.
	h.want(h.do("PATCH", "/demo/MailboxStats/a", map[string]string{"If-Match": e2}, `{"increment":{"total":1}}`), 204)
	h.problem(h.do("PATCH", "/demo/MailboxStats/a", map[string]string{"If-Match": e2}, `{"increment":{"total":1}}`), 412, "urn:cortado:problem:precondition-failed")
	v3 := h.want(h.do("GET", "/demo/MailboxStats/a", nil, ""), 200)
	wantJSON(t, v3.body, `{"total":2,"unread":0,"flagged":0}`)
	h.want(h.do("PUT", "/demo/MailboxStats/b", nil, `{"total":1}`), 201)
	h.want(h.do("PUT", "/_schemata/demo/MailboxStats", nil, `{"schema":{"type":"record","name":"MailboxStats","namespace":"demo","fields":[
	  {"name":"total","type":"long","default":0},{"name":"unread","type":"long","default":0},{"name":"flagged","type":"long","default":0},{"name":"muted","type":"boolean","default":false}]}}`), 201)
	old := h.want(h.do("GET", "/demo/MailboxStats/b", map[string]string{"Accept": "avro/binary; version=0"}, ""), 200).header.Get("ETag")
	cur := h.want(h.do("GET", "/demo/MailboxStats/b", nil, ""), 200).header.Get("ETag")
	if old == cur {
		t.Fatalf("version 3 read of a version 2 document: ETag %s as written too", cur)
	}
	w := h.want(h.do("PUT", "/demo/MailboxStats/b", map[string]string{"If-Match": old}, `{"total":5}`), 204)
	// A document written at the latest version reads with the write's ETag.
	if got := h.want(h.do("GET", "/demo/MailboxStats/b", nil, ""), 200).header.Get("ETag"); got != w.header.Get("ETag") {
		t.Fatalf("read ETag %s, the write's %s", got, w.header.Get("ETag"))
	}
	h.problem(h.do("PUT", "/demo/MailboxStats/b", map[string]string{"If-Match": cur}, `{"total":6}`), 412, "urn:cortado:problem:precondition-failed")
}

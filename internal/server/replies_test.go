package server

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/problem"
	"github.com/cortado-db/cortado/internal/wire"
)

// TestNetHTTPRefusalsAreProblems: requests Go's HTTP server refuses
// before any handler runs (headers over the bound, a malformed header,
// no Host, an unknown transfer coding) are answered as problem+json
// with a stable type, on a real port; and a response whose body holds
// the very bytes of such a refusal, written on its own, goes out as the
// handler wrote it.
func TestNetHTTPRefusalsAreProblems(t *testing.T) {
	lookalike := "HTTP/1.1 400 Bad Request" + netHTTPErrorHeaders + "400 Bad Request"
	h := &http.Server{MaxHeaderBytes: maxHeaderBytes, ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Length", strconv.Itoa(len(lookalike)))
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			io.WriteString(w, lookalike) // the connection's next write is exactly these bytes
			w.(http.Flusher).Flush()
		})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := wire.Serve(ln, h, problemReplies(h), nil)
	defer l.Shutdown(context.Background())

	// ask sends raw on a new connection, or on c, and reads one response.
	dial := func() net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(30 * time.Second))
		return c
	}
	read := func(c net.Conn, br *bufio.Reader) (*http.Response, string) {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, string(body)
	}
	wantProblem := func(what string, resp *http.Response, body string, status int, typ, detail string) {
		t.Helper()
		var p problem.Problem
		if err := json.Unmarshal([]byte(body), &p); err != nil || resp.StatusCode != status ||
			resp.Header.Get("Content-Type") != problem.ContentType || p.Type != typ || p.Status != status ||
			!strings.Contains(p.Detail, detail) || resp.Header.Get("Content-Length") != strconv.Itoa(len(body)) {
			t.Fatalf("%s: %d %v %q (%v); want %d %s with %q", what, resp.StatusCode, resp.Header, body, err, status, typ, detail)
		}
	}

	// One keep-alive connection: a response, then headers over the bound.
	c := dial()
	defer c.Close()
	br := bufio.NewReader(c)
	io.WriteString(c, "GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, body := read(c, br)
	if resp.StatusCode != http.StatusOK || body != lookalike {
		t.Fatalf("a response holding a refusal's bytes: %d %q, want 200 %q", resp.StatusCode, body, lookalike)
	}
	go io.WriteString(c, "GET /b HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", maxHeaderBytes+8192)+"\r\n\r\n")
	resp, body = read(c, br)
	wantProblem("headers over 1 MiB", resp, body, http.StatusRequestHeaderFieldsTooLarge, problem.TypeHeadersTooLarge, "over 1 MiB")

	// Pipelined: the refused request arrives with the one before it,
	// so net/http reads no new bytes before refusing it.
	c2 := dial()
	defer c2.Close()
	br2 := bufio.NewReader(c2)
	io.WriteString(c2, "GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\n\r\n")
	if resp, body := read(c2, br2); resp.StatusCode != http.StatusOK || body != lookalike {
		t.Fatalf("pipelined, the first: %d %q", resp.StatusCode, body)
	}
	resp, body = read(c2, br2)
	wantProblem("pipelined, no Host", resp, body, http.StatusBadRequest, problem.TypeMalformed, "missing required Host header")

	// Go's client on a kept-alive connection: net/http reads the next
	// request ahead, before it would report the connection active.
	hc := &http.Client{}
	defer hc.CloseIdleConnections()
	for i, path := range []string{"/a", "/1?1 "} { // the second's request line ends "?1  HTTP/1.1"
		resp, err := hc.Post("http://"+ln.Addr().String()+path, "application/json", strings.NewReader("0"))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if i == 0 && (resp.StatusCode != http.StatusOK || string(body) != lookalike) {
			t.Fatalf("kept alive, the first: %d %q", resp.StatusCode, body)
		}
		if i == 1 {
			wantProblem("kept alive, a malformed version", resp, string(body), http.StatusBadRequest, problem.TypeMalformed, "could not be read")
		}
	}

	for _, tc := range []struct {
		what, req string
		status    int
		detail    string
	}{
		{"no Host", "GET / HTTP/1.1\r\n\r\n", http.StatusBadRequest, "missing required Host header"},
		{"a malformed header", "GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", http.StatusBadRequest, "could not be read"},
		{"a bad escape in the path", "GET /%zz HTTP/1.1\r\nHost: x\r\n\r\n", http.StatusBadRequest, "could not be read"},
		{"an unknown transfer coding", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", http.StatusNotImplemented, "unsupported transfer encoding"},
		{"a protocol of its own", "GET / HTTP/9.1\r\nHost: x\r\n\r\n", http.StatusHTTPVersionNotSupported, "unsupported protocol version"},
	} {
		c := dial()
		io.WriteString(c, tc.req)
		resp, body := read(c, bufio.NewReader(c))
		wantProblem(tc.what, resp, body, tc.status, problem.TypeMalformed, tc.detail)
		c.Close()
	}
}

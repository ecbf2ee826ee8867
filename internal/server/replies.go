package server

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/cortado-db/cortado/internal/problem"
)

// maxHeaderBytes bounds a request's line and headers together.
const maxHeaderBytes = 1 << 20

// netHTTPErrorHeaders follow the status line of an answer Go's HTTP
// server makes itself. It answers a request it cannot read (headers over
// MaxHeaderBytes, a malformed request line or header, an unknown
// transfer coding) itself, before any handler runs, in plain text. The
// API answers every error as problem+json, so a port's connections
// turn those answers into problems. The first bytes written on a new
// connection, after its last response was flushed (http.StateIdle), or
// after bytes of a request were read (http.StateActive, which net/http
// skips when the request was read ahead, as a kept-alive connection's
// next one is) are either a handler's response or such an answer,
// which net/http writes in one call, shaped as
//
//	HTTP/1.1 <code> <text>\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n<text>
//
// A handler's response never starts so: net/http writes the Date
// header before Content-Type, and a handler's own headers before both.
// Only that first write of each response is looked at, so no bytes of
// a response (a document's, say) are ever taken for such an answer.
const netHTTPErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// problemReplies returns a listener wrapper for h's connections that
// answers net/http's own refusals as problems (above), and sets h's
// ConnState hook that arms them.
func problemReplies(h *http.Server) func(net.Listener) net.Listener {
	prev := h.ConnState
	h.ConnState = func(c net.Conn, st http.ConnState) {
		if rc, ok := c.(*replyConn); ok && (st == http.StateNew || st == http.StateActive || st == http.StateIdle) {
			rc.armed.Store(true)
		}
		if prev != nil {
			prev(c, st)
		}
	}
	return func(ln net.Listener) net.Listener { return replyListener{ln} }
}

type replyListener struct{ net.Listener }

func (l replyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &replyConn{Conn: c}, nil
}

// replyConn is a connection of the HTTP API (problemReplies).
type replyConn struct {
	net.Conn
	armed atomic.Bool // the next write starts a response
}

func (c *replyConn) Write(p []byte) (int, error) {
	if !c.armed.Load() || !c.armed.Swap(false) {
		return c.Conn.Write(p)
	}
	reply, ok := problemReply(p)
	if !ok {
		return c.Conn.Write(p)
	}
	if _, err := c.Conn.Write(reply); err != nil {
		return 0, err
	}
	return len(p), nil
}

// problemReply returns the problem+json answer for net/http's plain
// one in p, or false if p is not one.
func problemReply(p []byte) ([]byte, bool) {
	const proto = "HTTP/1.1 "
	if !bytes.HasPrefix(p, []byte(proto)) {
		return nil, false
	}
	end := bytes.Index(p, []byte("\r\n"))
	if end < 0 || !bytes.HasPrefix(p[end:], []byte(netHTTPErrorHeaders)) {
		return nil, false
	}
	line := string(p[len(proto):end]) // "431 Request Header Fields Too Large", "400 Bad Request: malformed Host header"
	if len(line) < 4 || line[3] != ' ' {
		return nil, false
	}
	code, err := strconv.Atoi(line[:3])
	if err != nil || code < 400 || code > 599 {
		return nil, false
	}
	var prob *problem.Problem
	switch code {
	case http.StatusRequestHeaderFieldsTooLarge:
		prob = problem.New(code, problem.TypeHeadersTooLarge, "Request headers too large",
			"the request line and headers together are over "+strconv.Itoa(maxHeaderBytes>>20)+" MiB")
	case http.StatusNotImplemented:
		prob = problem.New(code, problem.TypeMalformed, "Malformed request", "unsupported transfer encoding")
	default:
		detail := "the request could not be read as HTTP/1.1"
		if _, text, ok := strings.Cut(line[4:], ": "); ok {
			detail = text // net/http's reason: "malformed Host header", "invalid header name", …
		}
		prob = problem.New(code, problem.TypeMalformed, "Malformed request", detail)
	}
	body, _ := json.Marshal(prob)
	var b bytes.Buffer
	b.WriteString(proto + line[:3] + " " + http.StatusText(code) + "\r\nContent-Type: " + problem.ContentType +
		"\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\nConnection: close\r\n\r\n")
	b.Write(body)
	return b.Bytes(), true
}

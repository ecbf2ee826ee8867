package wire

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestShutdownEndsStreams: a handler that streams until Stopping says so
// (a change stream) learns of a shutdown from its request's context, so
// that Shutdown returns without waiting out its deadline; and a server's
// own BaseContext still reaches the request.
func TestShutdownEndsStreams(t *testing.T) {
	type key struct{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	streaming := make(chan struct{})
	hs := &http.Server{
		BaseContext: func(net.Listener) context.Context { return context.WithValue(context.Background(), key{}, "base") },
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Context().Value(key{}) != "base" {
				t.Error("the server's BaseContext does not reach the request")
			}
			stopping := Stopping(r.Context())
			if stopping == nil {
				t.Error("a request has no Stopping channel")
				return
			}
			w.Write([]byte("streaming\n"))
			w.(http.Flusher).Flush()
			close(streaming)
			<-stopping
		}),
	}
	l := Serve(ln, hs, nil, nil)
	res, err := http.Get("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	<-streaming
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := l.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatalf("shutdown waited %v, until its deadline: the stream was not told", time.Since(start))
	}
	if b, _ := io.ReadAll(res.Body); string(b) != "streaming\n" {
		t.Fatalf("the stream sent %q", b)
	}
}

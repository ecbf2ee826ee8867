package wire

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/soheilhy/cmux"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
)

// MaxMessageBytes bounds one message either way: a write carries at most
// a transaction of documents the router accepted (bodies of a few MiB),
// a log batch at most MaxLogBytes of commits.
const MaxMessageBytes = 64 << 20

// Flow-control windows: large enough that a log stream of 1 KiB commits
// is not held back on loopback or a LAN, bounded so that a slow reader
// costs the sender at most this much per stream and connection.
const (
	streamWindow = 4 << 20
	connWindow   = 16 << 20
)

// Dial returns a connection to the role at base ("http://host:port", the
// URL it registered), made lazily: one HTTP/2 connection that every call
// to that host shares (a few connections per host pair, never one per
// request). Keep-alive pings find a peer that stopped answering (paused,
// cut off) within about 15 s even on an idle connection.
func Dial(base string) (*grpc.ClientConn, error) {
	u, err := url.Parse(base)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("bad address %q: want http://host:port", base)
	}
	return grpc.NewClient("passthrough:///"+u.Host,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes)),
		grpc.WithInitialWindowSize(streamWindow),
		grpc.WithInitialConnWindowSize(connWindow),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		// A restarted peer is found again within a second: the default
		// backoff grows to two minutes, longer than any failover.
		grpc.WithConnectParams(grpc.ConnectParams{MinConnectTimeout: 2 * time.Second, Backoff: backoff.Config{
			BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}}),
		// An unused connection (a node that went away) is closed after a
		// while instead of being redialled forever.
		grpc.WithIdleTimeout(time.Minute),
	)
}

// Server is a gRPC server with the protocol's bounds, and the signal its
// long-running streams stop on when it shuts down.
type Server struct {
	GRPC     *grpc.Server
	stopping chan struct{}
	once     sync.Once
	detached sync.WaitGroup
}

// NewServer returns a server whose handlers have all returned when
// Shutdown does; extra options (interceptors) are added to the defaults.
func NewServer(extra ...grpc.ServerOption) *Server {
	opts := append([]grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxMessageBytes),
		grpc.MaxSendMsgSize(MaxMessageBytes),
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.WaitForHandlers(true),
	}, extra...)
	return &Server{GRPC: grpc.NewServer(opts...), stopping: make(chan struct{})}
}

// Stopping is closed when the server begins to shut down: streams end.
func (s *Server) Stopping() <-chan struct{} { return s.stopping }

// Go runs f for a handler that may return before f does: a stream's
// Send that waits on a reader who reads nothing returns only once its
// handler has returned (grpc-go ends the stream then). The listener's
// Shutdown and Abort wait for f after the server has stopped, so that
// nothing f reads is closed under it.
func (s *Server) Go(f func()) { s.detached.Go(f) }

// Listener serves HTTP and the internal protocol on one port: a
// connection that opens with the HTTP/2 preface (every gRPC client;
// Cortado's HTTP API is HTTP/1.1) goes to gRPC, any other to HTTP. So a
// role registers one URL for both. A listener of one protocol serves it
// directly.
type Listener struct {
	HTTP *http.Server
	RPC  *Server
	ln   net.Listener
	mux  cmux.CMux
	wg   sync.WaitGroup
	done chan struct{}
	// stopping is closed when Shutdown starts.
	stopping chan struct{}
	stopOnce sync.Once
}

type stoppingKey struct{}

// Stopping returns a channel closed when the listener serving the request
// whose context ctx is starts shutting down (nil outside one): a handler
// that streams until its client goes ends then, so that the shutdown
// does not wait for it.
func Stopping(ctx context.Context) <-chan struct{} {
	c, _ := ctx.Value(stoppingKey{}).(chan struct{})
	return c
}

// Serve starts serving ln; h or rpc may be nil. httpConns, if set, wraps
// the listener h serves (its connections only). Call Shutdown to stop.
func Serve(ln net.Listener, h *http.Server, httpConns func(net.Listener) net.Listener, rpc *Server) *Listener {
	l := &Listener{HTTP: h, RPC: rpc, ln: ln, done: make(chan struct{}), stopping: make(chan struct{})}
	if h != nil {
		// Long-lived HTTP handlers (change streams) learn of a shutdown
		// from their request's context (see Stopping), which every
		// request's derives from (a copy of each request with a context
		// of its own would cost an allocation of 330 bytes a request).
		base := h.BaseContext
		h.BaseContext = func(ln net.Listener) context.Context {
			ctx := context.Background()
			if base != nil {
				ctx = base(ln)
			}
			return context.WithValue(ctx, stoppingKey{}, l.stopping)
		}
	}
	run := func(f func()) {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			f()
		}()
	}
	if rpc == nil || h == nil {
		// One protocol: no sniffing of connections (a router's HTTP, an
		// in-process node's gRPC).
		run(func() {
			defer close(l.done)
			if rpc != nil {
				rpc.GRPC.Serve(ln)
			} else {
				h.Serve(wrapHTTP(ln, httpConns))
			}
		})
		return l
	}
	l.mux = cmux.New(ln)
	// A connection that sends nothing is not held in matching forever.
	l.mux.SetReadTimeout(10 * time.Second)
	grpcL := l.mux.Match(cmux.HTTP2())
	httpL := l.mux.Match(cmux.Any())
	run(func() { rpc.GRPC.Serve(grpcL) })
	run(func() { h.Serve(wrapHTTP(httpL, httpConns)) })
	run(func() {
		defer close(l.done)
		l.mux.Serve()
	})
	return l
}

func wrapHTTP(ln net.Listener, wrap func(net.Listener) net.Listener) net.Listener {
	if wrap == nil {
		return ln
	}
	return wrap(ln)
}

// Done is closed when the listener has stopped accepting (Shutdown, Abort,
// or a failed listener).
func (l *Listener) Done() <-chan struct{} { return l.done }

// Shutdown stops accepting, ends streams, lets unary calls and HTTP
// handlers finish (until ctx ends, then cuts them off), and returns once
// every handler has returned: only then may the engines they read be
// closed.
func (l *Listener) Shutdown(ctx context.Context) error {
	var errs []error
	l.stopOnce.Do(func() { close(l.stopping) })
	if l.RPC != nil {
		l.RPC.once.Do(func() { close(l.RPC.stopping) })
	}
	if l.HTTP != nil {
		if err := l.HTTP.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
			l.HTTP.Close() // handlers that did not finish in time are cut off
		}
	}
	if l.RPC != nil {
		done := make(chan struct{})
		go func() {
			l.RPC.GRPC.GracefulStop()
			close(done)
		}()
		select {
		case <-done:
		case <-ctx.Done():
			l.RPC.GRPC.Stop()
			<-done
		}
		l.RPC.detached.Wait()
	}
	if l.mux != nil {
		l.mux.Close()
	}
	l.ln.Close()
	l.wg.Wait()
	return errors.Join(errs...)
}

// Abort stops at once, as a crash would look to peers: every connection
// is cut and every call in flight fails. It returns when the handlers
// have returned.
func (l *Listener) Abort() {
	l.stopOnce.Do(func() { close(l.stopping) })
	if l.RPC != nil {
		l.RPC.once.Do(func() { close(l.RPC.stopping) })
		l.RPC.GRPC.Stop()
		l.RPC.detached.Wait()
	}
	if l.HTTP != nil {
		l.HTTP.Close()
	}
	if l.mux != nil {
		l.mux.Close()
	}
	l.ln.Close()
	l.wg.Wait()
}

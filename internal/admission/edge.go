package admission

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cortado-db/cortado/internal/problem"
)

// Deadlines say how long a request may take.
type Deadlines struct {
	// Default is an interactive request's deadline when it names none
	// (default 30s; negative: none). Streams get none by default.
	Default time.Duration
	// Max caps a Request-Timeout (default 5 minutes).
	Max time.Duration
}

// DefaultRequestTimeout is Deadlines.Default's default.
const DefaultRequestTimeout = 30 * time.Second

// HeaderRequestTimeout names a request's deadline: seconds ("2.5") or a
// Go duration ("2500ms").
const HeaderRequestTimeout = "Request-Timeout"

// ParseTimeout reads a Request-Timeout header value.
func ParseTimeout(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return d, nil
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil && f > 0 && f < 1e6 {
		// At least a nanosecond: a positive timeout that rounds to
		// zero is a deadline already passed, not none at all.
		return max(time.Duration(f*float64(time.Second)), 1), nil
	}
	return 0, fmt.Errorf("%s must be a positive number of seconds or a duration like 500ms, not %q", HeaderRequestTimeout, v)
}

// Middleware admits the requests of h: it sets a request's deadline
// (Request-Timeout, capped; else the default for its class), takes a slot
// for its class from l, and answers 503 overloaded with Retry-After when
// there is none — before h reads anything of the request. A stream's slot
// is given back once it is admitted (a stream lives long; its own
// throttles bound it): admission only decides whether it may start.
//
// With quotas (nil: none), a client over its quota (X-Cortado-Client) is
// answered 429 quota-exceeded with Retry-After, before it takes a slot.
func Middleware(l *Limiter, d Deadlines, q *Quotas, classify func(*http.Request) Class, h http.Handler) http.Handler {
	if d.Default == 0 {
		d.Default = DefaultRequestTimeout
	}
	if d.Max == 0 {
		d.Max = 5 * time.Minute
	}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if q != nil {
			client := req.Header.Get(HeaderClient)
			if len(client) > MaxClientID {
				problem.Write(w, problem.New(http.StatusBadRequest, problem.TypeMalformed, "Malformed "+HeaderClient, fmt.Sprintf("a client name is at most %d bytes", MaxClientID)))
				return
			}
			if ok, wait := q.Take(client, time.Now()); !ok {
				p := problem.New(http.StatusTooManyRequests, problem.TypeQuotaExceeded, "Quota exceeded", "this client's requests per second are over its quota; retry after Retry-After seconds")
				p.RetryAfter = max(1, int(math.Ceil(wait.Seconds())))
				problem.Write(w, p)
				return
			}
		}
		c := classify(req)
		timeout := time.Duration(0)
		if c == Interactive && d.Default > 0 {
			timeout = d.Default
		}
		if v := req.Header.Get(HeaderRequestTimeout); v != "" {
			t, err := ParseTimeout(v)
			if err != nil {
				problem.Write(w, problem.New(http.StatusBadRequest, problem.TypeMalformed, "Malformed Request-Timeout", err.Error()))
				return
			}
			timeout = min(t, d.Max)
		}
		ctx := req.Context()
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = WithDeadline(ctx, time.Now().Add(timeout))
			defer cancel()
			req = req.WithContext(ctx)
		}
		release, err := l.Acquire(ctx, c)
		if err != nil {
			p := problem.New(http.StatusServiceUnavailable, problem.TypeOverloaded, "Overloaded",
				fmt.Sprintf("the server is at its limit of requests in progress and queued (%s traffic is shed first from the lowest priority); retry after a pause", c))
			if ctx.Err() != nil {
				p = problem.New(http.StatusServiceUnavailable, problem.TypeTimeout, "Deadline exceeded", "the request's deadline passed while it waited for a slot")
			}
			p.RetryAfter = 1
			problem.Write(w, p)
			return
		}
		if c == Stream {
			release()
			release = func() {}
		}
		defer release()
		h.ServeHTTP(w, req)
	})
}

// UnaryInterceptor guards a storage node's internal API: a call whose
// deadline passed before it starts is dropped (counted in expired: its
// caller has given up), and document calls (reads, scans, writes) take a
// slot of l as interactive requests, refused as codes.ResourceExhausted
// when there is none. Replication's calls (acknowledgements, status,
// checksums) are not admitted through l: holding them back would stall
// the writes waiting for them. A call waiting on replicas may give its
// slot back (Park).
func UnaryInterceptor(l *Limiter, expired *atomic.Uint64) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if ctx.Err() != nil {
			expired.Add(1)
			return nil, status.Error(codes.DeadlineExceeded, "the call's deadline passed before it started: dropped")
		}
		if !admitted(info.FullMethod) {
			return handler(ctx, req) // replication's own calls (acks, status) are never held back
		}
		release, err := l.Acquire(ctx, Interactive)
		if err != nil {
			if ctx.Err() != nil {
				expired.Add(1)
				return nil, status.Error(codes.DeadlineExceeded, "the call's deadline passed while it waited for a slot")
			}
			return nil, status.Error(codes.ResourceExhausted, "storage node overloaded: at its limit of calls in progress and queued")
		}
		ctx, end := l.Hold(ctx, release)
		defer end()
		return handler(ctx, req)
	}
}

// admitted reports whether an internal method is document traffic.
func admitted(method string) bool {
	i := strings.LastIndexByte(method, '/')
	switch method[i+1:] {
	case "Get", "MultiGet", "Scan", "Write":
		return true
	}
	return false
}

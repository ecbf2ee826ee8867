package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// A stall guard is a caller's bulkhead against one storage node that
// stops answering (a stopped or frozen process, a cut-off host) while its
// connection stays open: without it, every call to that node waits out
// its caller's deadline, and a router's bounded slots fill with them
// until the router refuses everything else too.
//
// A node that has answered none of at least Calls document calls (reads
// and writes) for After, nor a ping (its protocol's Hello, which no
// admission holds back) sent a quarter of After before, is stalled: the
// calls waiting on it end as unavailable (a write's outcome unknown), new
// ones fail at once as not delivered, and one call an After is let
// through as a probe; any answer ends the stall. A node
// that answers the ping is alive and its calls wait on something else —
// a master's semi-sync writes and fresh reads wait for its replicas'
// acknowledgements, for 1.5 s when its relay falls silent — and ending
// them would only turn writes about to succeed into unknown outcomes.
//
// The guard also bounds the calls in flight to one node (MaxCalls): a
// call beyond it is refused at once as overloaded, not delivered. A
// router's slots are shared by every node it calls; without the bound, a
// node that slows down without stopping — or stops, until the guard
// above sees it — takes them all, and requests for healthy nodes are
// refused with it (the FollowFeed lesson: one sick host must not take
// its callers down).

// StallOptions configure a stall guard; zero values take the defaults.
type StallOptions struct {
	// Calls is how many unanswered calls (default 8; -1: the guard only
	// watches, see Remote.Quiet), for After (default 1 s), make a node
	// stalled.
	Calls int
	After time.Duration
	// MaxCalls bounds the document calls in flight to one node (default
	// DefaultMaxCalls; -1: no bound): a call beyond it fails at once as
	// overloaded, not delivered.
	MaxCalls int
}

// Defaults of the stall guard.
const (
	DefaultStallCalls = 8
	DefaultStallAfter = time.Second
	// DefaultMaxCalls is half of a router's default slots
	// (admission.DefaultRouterMaxInFlight; a server sizes it from its
	// own): one node may hold half of them, whatever becomes of it, and
	// the other half stays for the others.
	DefaultMaxCalls = 256
)

var (
	errStalled = errors.New("storage node stalled")
	errLeft    = errors.New("storage node left the cluster")
)

type stallGuard struct {
	calls    int
	after    time.Duration
	maxCalls int

	// ping asks the node whether it is alive (nil: the silence of its
	// calls alone stalls it); pings holds the one in flight.
	ping  func(context.Context) error
	pings sync.WaitGroup

	mu      sync.Mutex
	waiting map[uint64]context.CancelCauseFunc
	next    uint64
	since   time.Time // the last answer, or when the oldest waiting call began
	stalled bool
	probeAt time.Time
	pinging bool
	// unanswered is when the last ping that went unanswered was sent
	// (zero once one is answered): after since, the node has been silent
	// to it too.
	unanswered time.Time
	closed     bool // no more pings
}

func newStallGuard(o StallOptions) *stallGuard {
	if o.Calls == 0 {
		o.Calls = DefaultStallCalls
	}
	if o.After == 0 {
		o.After = DefaultStallAfter
	}
	if o.MaxCalls == 0 {
		o.MaxCalls = DefaultMaxCalls
	}
	return &stallGuard{calls: o.Calls, after: o.After, maxCalls: o.MaxCalls, waiting: map[uint64]context.CancelCauseFunc{}}
}

// silentLocked reports whether the node has answered none of at least
// calls calls for d, and is not stalled yet.
func (g *stallGuard) silentLocked(now time.Time, d time.Duration) bool {
	return !g.stalled && g.calls > 0 && len(g.waiting) >= g.calls && now.Sub(g.since) > d
}

// pingWait is how long a ping may go unanswered: a quarter of after. The
// ping goes out that long before after has passed, so that a frozen node
// is stalled after after, as without pings.
func (g *stallGuard) pingWait() time.Duration { return max(g.after/4, 50*time.Millisecond) }

// checkLocked stalls the node, or pings it, when it has been silent for
// long enough.
func (g *stallGuard) checkLocked(now time.Time) {
	if g.ping == nil {
		if g.silentLocked(now, g.after) {
			g.stallLocked(now)
		}
		return
	}
	if g.silentLocked(now, g.after) && g.unanswered.After(g.since) {
		g.stallLocked(now) // silent to its calls and to a ping
		return
	}
	if g.silentLocked(now, g.after-g.pingWait()) && !g.pinging && !g.closed && !g.unanswered.After(g.since) {
		g.pinging = true
		g.pings.Go(g.pingNode)
	}
}

// stallLocked makes the node stalled: the calls waiting on it end.
func (g *stallGuard) stallLocked(now time.Time) {
	g.stalled, g.probeAt = true, now.Add(g.after)
	for _, cancel := range g.waiting {
		cancel(errStalled)
	}
}

// leave ends the calls waiting on the node as unavailable (a write's
// outcome unknown): it left the cluster (its registration is gone from
// the routing table), so nothing it does now can be acknowledged — it
// holds no lease — and a call hanging there (a write in an fsync of a
// stalled disk, which the node answers pings through) would otherwise
// wait out its caller's deadline. New calls are not refused: the node may
// come back.
func (g *stallGuard) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, cancel := range g.waiting {
		cancel(errLeft)
	}
}

// pingNode pings a silent node: an answer counts as one (the node is
// alive); none within pingWait stalls it once it has been silent for
// after (at once, or at the next call after that).
func (g *stallGuard) pingNode() {
	sent := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), g.pingWait())
	err := g.ping(ctx)
	cancel()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pinging = false
	if err == nil {
		g.since, g.unanswered = time.Now(), time.Time{}
		return
	}
	g.unanswered = sent
	g.checkLocked(time.Now())
}

// close starts no more pings and waits for the one in flight.
func (g *stallGuard) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.pings.Wait()
}

// quiet is how long the node has answered none of the calls waiting on it
// (0 while none waits), whether or not the guard acts on it.
func (g *stallGuard) quiet() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.waiting) == 0 {
		return 0
	}
	return time.Since(g.since)
}

// begin admits a call to the node at base, or refuses it while the node
// is stalled; end must follow an admitted call with its error and
// returns the error to report.
func (g *stallGuard) begin(ctx context.Context, base string) (context.Context, func(error) error, error) {
	now := time.Now()
	g.mu.Lock()
	g.checkLocked(now)
	if g.maxCalls > 0 && len(g.waiting) >= g.maxCalls {
		g.mu.Unlock()
		return nil, nil, fmt.Errorf("storage node %s: %w (%w): %d calls to it are in flight already", base, ErrOverloaded, ErrNotDelivered, g.maxCalls)
	}
	if g.stalled {
		if now.Before(g.probeAt) {
			quiet := now.Sub(g.since).Round(time.Millisecond)
			g.mu.Unlock()
			return nil, nil, fmt.Errorf("storage node %s: %w (%w): it has answered nothing for %v", base, ErrUnavailable, ErrNotDelivered, quiet)
		}
		g.probeAt = now.Add(g.after)
	}
	if len(g.waiting) == 0 && !g.stalled {
		g.since = now // a busy period begins: nothing was unanswered
	}
	id := g.next
	g.next++
	cctx, cancel := context.WithCancelCause(ctx)
	g.waiting[id] = cancel
	g.mu.Unlock()
	return cctx, func(err error) error {
		g.mu.Lock()
		delete(g.waiting, id)
		if cctx.Err() == nil {
			g.since, g.stalled = time.Now(), false // an answer
		}
		g.mu.Unlock()
		cancel(nil)
		if errors.Is(context.Cause(cctx), errStalled) && ctx.Err() == nil {
			return fmt.Errorf("storage node %s: %w: it stopped answering (%d or more calls unanswered for %v)", base, ErrUnavailable, g.calls, g.after)
		}
		if errors.Is(context.Cause(cctx), errLeft) && ctx.Err() == nil {
			return fmt.Errorf("storage node %s: %w: it left the cluster while the call waited", base, ErrUnavailable)
		}
		return err
	}, nil
}

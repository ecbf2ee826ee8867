package admission

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// waitQueued waits until n requests wait in l's queue.
func waitQueued(t *testing.T, l *Limiter, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for l.Stats().Queued != n {
		if time.Now().After(deadline) {
			t.Fatalf("queued %d, want %d", l.Stats().Queued, n)
		}
		runtime.Gosched()
	}
}

func TestLimiterBoundsAndSheds(t *testing.T) {
	l := New(Options{MaxInFlight: 2, MaxQueue: 4, QueueTimeout: time.Minute})
	ctx := context.Background()
	var held []func()
	for range 2 {
		r, err := l.Acquire(ctx, Interactive)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, r)
	}
	// Two interactive requests wait: the queue is half full, so the
	// change stream (half the queue) is shed and bulk (a quarter) too,
	// while interactive requests still queue.
	got := make(chan Class, 8)
	var wg sync.WaitGroup
	acquire := func(c Class) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := l.Acquire(ctx, c)
			if err != nil {
				t.Errorf("%s: %v", c, err)
				return
			}
			got <- c
			r()
		}()
	}
	acquire(Interactive)
	acquire(Interactive)
	waitQueued(t, l, 2)
	for _, c := range []Class{Stream, Bulk} {
		if _, err := l.Acquire(ctx, c); !errors.Is(err, ErrOverloaded) {
			t.Fatalf("%s with the queue half full: %v, want overloaded", c, err)
		}
	}
	// A stream request queued before an interactive one is still served
	// after it: a freed slot goes to the most important waiter.
	l2 := New(Options{MaxInFlight: 1, MaxQueue: 8, QueueTimeout: time.Minute})
	r, _ := l2.Acquire(ctx, Interactive)
	order := make(chan Class, 2)
	for i, c := range []Class{Stream, Interactive} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := l2.Acquire(ctx, c)
			if err != nil {
				t.Error(err)
				return
			}
			order <- c
			r()
		}()
		waitQueued(t, l2, i+1)
	}
	r()
	if first := <-order; first != Interactive {
		t.Fatalf("a freed slot went to %s before interactive", first)
	}
	<-order

	// Over the queue: refused at once.
	acquire(Interactive)
	acquire(Interactive)
	waitQueued(t, l, 4)
	start := time.Now()
	if _, err := l.Acquire(ctx, Interactive); !errors.Is(err, ErrOverloaded) || time.Since(start) > time.Second {
		t.Fatalf("with the queue full: %v after %v", err, time.Since(start))
	}
	for _, r := range held {
		r()
	}
	wg.Wait()
	close(got)
	n := 0
	for range got {
		n++
	}
	s := l.Stats()
	if n != 4 || s.InFlight != 0 || s.Queued != 0 || s.Rejected["stream"] != 1 || s.Rejected["bulk"] != 1 || s.Rejected["interactive"] != 1 {
		t.Fatalf("served %d queued requests; stats %+v", n, s)
	}
}

func TestLimiterQueueTimeoutAndDeadline(t *testing.T) {
	l := New(Options{MaxInFlight: 1, MaxQueue: 4, QueueTimeout: 30 * time.Millisecond})
	r, _ := l.Acquire(context.Background(), Interactive)
	defer r()
	if _, err := l.Acquire(context.Background(), Interactive); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("after the queue timeout: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Acquire(ctx, Interactive); !errors.Is(err, context.Canceled) {
		t.Fatalf("a request whose caller left: %v", err)
	}
	if s := l.Stats(); s.Queued != 0 || s.InFlight != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestLimiterOff(t *testing.T) {
	l := New(Options{MaxInFlight: -1})
	for range 10000 {
		if _, err := l.Acquire(context.Background(), Bulk); err != nil {
			t.Fatal(err)
		}
	}
}

// A call whose deadline passed before it started does no work.
func TestInterceptorDropsExpiredCalls(t *testing.T) {
	var expired atomic.Uint64
	ic := UnaryInterceptor(New(Options{}), &expired)
	ran := 0
	handler := func(ctx context.Context, req any) (any, error) { ran++; return "ok", nil }
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel()
	_, err := ic(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/x/Get"}, handler)
	if status.Code(err) != codes.DeadlineExceeded || ran != 0 || expired.Load() != 1 {
		t.Fatalf("expired call: %v, handler ran %d times, expired %d", err, ran, expired.Load())
	}
	if res, err := ic(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x/Get"}, handler); err != nil || res != "ok" || ran != 1 {
		t.Fatalf("live call: %v %v", res, err)
	}
	// With every slot taken, document calls are refused; replication's
	// acknowledgements are not.
	full := New(Options{MaxInFlight: 1, MaxQueue: 1, QueueTimeout: time.Millisecond})
	r, _ := full.Acquire(context.Background(), Interactive)
	defer r()
	ic = UnaryInterceptor(full, &expired)
	if _, err := ic(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/cortado.wire.Node/Write"}, handler); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a write over the limit: %v", err)
	}
	if _, err := ic(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/cortado.wire.Node/Ack"}, handler); err != nil {
		t.Fatalf("an acknowledgement over the limit: %v", err)
	}
}

func TestParseTimeout(t *testing.T) {
	for in, want := range map[string]time.Duration{"2": 2 * time.Second, "0.25": 250 * time.Millisecond, "1500ms": 1500 * time.Millisecond,
		"1e-10": time.Nanosecond, "0.0000000001": time.Nanosecond} { // a deadline that has passed, not none
		if d, err := ParseTimeout(in); err != nil || d != want {
			t.Errorf("%q: %v %v", in, d, err)
		}
	}
	for _, in := range []string{"", "0", "-1", "abc", "1e300", "NaN"} {
		if _, err := ParseTimeout(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

func TestQuotas(t *testing.T) {
	q := NewQuotas(QuotaOptions{Rate: 10, Burst: 3, MaxClients: 2})
	now := time.Unix(1000, 0)
	for i := range 3 {
		if ok, _ := q.Take("a", now); !ok {
			t.Fatalf("request %d within the burst refused", i)
		}
	}
	ok, wait := q.Take("a", now)
	if ok || wait != 100*time.Millisecond {
		t.Fatalf("over the burst: %v, retry after %v", ok, wait)
	}
	if ok, _ := q.Take("b", now); !ok {
		t.Fatal("another client was refused for a's use")
	}
	if ok, _ := q.Take("a", now.Add(100*time.Millisecond)); !ok {
		t.Fatal("not refilled after 100 ms at 10/s")
	}
	// A third client, with two tracked and none idle, shares the
	// overflow bucket: clients cannot grow the map past MaxClients.
	for i := range 3 {
		q.Take(fmt.Sprintf("c%d", i), now)
	}
	if len(q.m) > 3 {
		t.Fatalf("%d buckets for at most 2 clients and the overflow", len(q.m))
	}
	if NewQuotas(QuotaOptions{}) != nil {
		t.Fatal("a zero rate is not off")
	}
}

// TestQuotasForgetIdleClientsOnceASecond: with MaxClients tracked, idle
// clients are looked for (a walk of every client) at most once a second,
// however many new names come: until then a new client shares the
// overflow bucket.
func TestQuotasForgetIdleClientsOnceASecond(t *testing.T) {
	q := NewQuotas(QuotaOptions{Rate: 1, Burst: 1, MaxClients: 100})
	t0 := time.Unix(1000, 0)
	for i := range 100 {
		q.Take(fmt.Sprintf("c%d", i), t0)
	}
	// Idle for two minutes: the first new name has them forgotten.
	t1 := t0.Add(2 * time.Minute)
	if ok, _ := q.Take("new", t1); !ok || q.m["new"] == nil || len(q.m) != 1 {
		t.Fatalf("after the idle clients were forgotten: ok %v, %d buckets, own bucket %v", ok, len(q.m), q.m["new"] != nil)
	}
	for i := range 99 {
		q.Take(fmt.Sprintf("d%d", i), t1)
	}
	// A new name finds none idle for a minute yet; the next, half a
	// second later, would (the others are now idle past the minute), but
	// the last look was under a second ago: both share the overflow
	// bucket (its one token, then refused).
	first, _ := q.Take("e0", t1.Add(59600*time.Millisecond))
	second, _ := q.Take("e1", t1.Add(60100*time.Millisecond))
	if !first || second || q.m["e0"] != nil || q.m["e1"] != nil {
		t.Fatalf("within a second of the last look: e0 %v, e1 %v, buckets of their own %v %v", first, second, q.m["e0"] != nil, q.m["e1"] != nil)
	}
	// A second after it: forgotten.
	if ok, _ := q.Take("e2", t1.Add(60600*time.Millisecond)); !ok || q.m["e2"] == nil || len(q.m) > 3 {
		t.Fatalf("a second after the last look: ok %v, own bucket %v", ok, q.m["e2"] != nil)
	}
}

// The adaptive limit grows while latency stays at its floor and settles
// near what the node serves without queueing once latency grows with
// concurrency.
func TestGradientLimit(t *testing.T) {
	g := gradient{limit: 8}
	for range 200 * gradientWindow {
		g.observe(time.Millisecond, int(g.limit), 8, 512)
	}
	if g.limit != 512 {
		t.Fatalf("with a flat latency the limit is %.0f, want the maximum", g.limit)
	}
	// A node that serves 20 at once: more queue, and latency grows in
	// proportion.
	const capacity = 20
	g = gradient{limit: 512}
	for range 3 * gradientProbe * gradientWindow / 2 {
		in := int(g.limit)
		g.observe(time.Duration(max(1, float64(in)/capacity)*float64(time.Millisecond)), in, 8, 512)
	}
	if g.limit < capacity || g.limit > 4*capacity {
		t.Fatalf("with latency growing past %d in progress the limit settled at %.0f", capacity, g.limit)
	}
	t.Logf("settled at %.0f for a capacity of %d", g.limit, capacity)
}

// A limit not in use stays where it is, however the latency of the work
// varies: a lightly loaded storage node (a few requests in progress, some
// fast reads and some fsynced writes) keeps its limit for the next burst.
// Once the requests in progress reach half of it, latency moves it again.
func TestGradientLimitNotInUse(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	g := gradient{limit: 64}
	for range 4 * gradientProbe * gradientWindow {
		d := 50 * time.Microsecond
		if rnd.IntN(2) == 0 {
			d = time.Duration(1+rnd.IntN(20)) * time.Millisecond // a write, waiting on its fsync
		}
		g.observe(d, 1+rnd.IntN(4), 8, 64)
	}
	if g.limit != 64 {
		t.Fatalf("a limit of 64 with at most 4 in progress went to %.0f", g.limit)
	}
	// Now in use, and slower the more in progress: it shrinks.
	for range 50 * gradientWindow {
		in := int(g.limit)
		g.observe(time.Duration(in)*time.Millisecond, in, 8, 64)
	}
	if g.limit > 32 {
		t.Fatalf("in use, with latency growing with it, the limit stayed at %.0f", g.limit)
	}
}

// TestQueueSizedFromThroughput: without a fixed MaxQueue the queue holds
// what the limiter can serve within the queue timeout — the most requests
// completed in one second of the last ten, times the timeout — never less
// than MinQueue, and forgets a peak older than ten seconds.
func TestQueueSizedFromThroughput(t *testing.T) {
	clock := time.Unix(1_000_000, 0)
	l := New(Options{MaxInFlight: 4, MinQueue: 10, QueueTimeout: 100 * time.Millisecond})
	l.now = func() time.Time { return clock }
	if got := l.Stats().QueueLimit; got != 10 {
		t.Fatalf("idle limiter's queue limit %d, want the minimum 10", got)
	}
	serve := func(n int) {
		for range n {
			r, err := l.Acquire(context.Background(), Interactive)
			if err != nil {
				t.Fatal(err)
			}
			r()
		}
	}
	serve(3000) // 3,000 in one second: 300 can be served in 100 ms
	if got := l.Stats().QueueLimit; got != 300 {
		t.Fatalf("after 3,000 requests in a second: queue limit %d, want 300", got)
	}
	clock = clock.Add(5 * time.Second)
	serve(1000) // a slower second does not lower the peak
	if got := l.Stats().QueueLimit; got != 300 {
		t.Fatalf("5 s later: queue limit %d, want 300 (the peak of the last 10 s)", got)
	}
	clock = clock.Add(6 * time.Second)
	if got := l.Stats().QueueLimit; got != 100 {
		t.Fatalf("11 s after the peak: queue limit %d, want 100", got)
	}
	clock = clock.Add(time.Hour)
	serve(100_000)
	if got := l.Stats().QueueLimit; got != maxQueueCap {
		t.Fatalf("queue limit %d, want the cap %d", got, maxQueueCap)
	}

	// The limit bounds waiting: with the slots held, MinQueue requests
	// wait and the next is refused.
	small := New(Options{MaxInFlight: 1, MinQueue: 2, QueueTimeout: time.Minute})
	hold, err := small.Acquire(context.Background(), Interactive)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r, err := small.Acquire(context.Background(), Interactive); err == nil {
				r()
			} else {
				t.Error(err)
			}
		}()
	}
	waitQueued(t, small, 2)
	if _, err := small.Acquire(context.Background(), Interactive); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("third waiter: %v, want overloaded", err)
	}
	hold()
	wg.Wait()
}

// TestStandingQueue: while the queue keeps emptying, a request waits up
// to the queue timeout (a burst is absorbed) and slots go to the oldest
// waiter; once the queue has not emptied for longer than the queue
// timeout, or a request was refused, a new request waits only the
// standing timeout, and slots go to the newest waiter (CoDel with
// adaptive LIFO), for ten queue timeouts.
func TestStandingQueue(t *testing.T) {
	clock := time.Unix(1_000_000, 0)
	var mu sync.Mutex
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }

	// order runs three waiters behind a held slot, advancing the clock
	// by gap after the first has queued, and returns the order in which
	// they got the slot.
	order := func(gap time.Duration) []string {
		l := New(Options{MaxInFlight: 1, MaxQueue: 8, QueueTimeout: time.Minute, StandingTimeout: time.Minute})
		l.now = now
		hold, err := l.Acquire(context.Background(), Interactive)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan string, 3)
		var wg sync.WaitGroup
		for i, name := range []string{"first", "second", "third"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := l.Acquire(context.Background(), Interactive)
				if err != nil {
					t.Error(name, err)
					return
				}
				got <- name
				r()
			}()
			waitQueued(t, l, i+1)
			if i == 0 {
				advance(gap)
			}
		}
		hold()
		wg.Wait()
		close(got)
		var names []string
		for n := range got {
			names = append(names, n)
		}
		return names
	}
	if got := fmt.Sprint(order(time.Second)); got != "[first second third]" {
		t.Errorf("a queue that emptied within the queue timeout served %s, want oldest first", got)
	}
	if got := fmt.Sprint(order(2 * time.Minute)); got != "[third second first]" {
		t.Errorf("a standing queue served %s, want newest first", got)
	}

	// The wait: a minute while the queue is young, 20 ms once it stands;
	// and young again once it has emptied.
	l := New(Options{MaxInFlight: 1, MaxQueue: 8, QueueTimeout: time.Minute, StandingTimeout: 20 * time.Millisecond})
	l.now = now
	hold, _ := l.Acquire(context.Background(), Interactive)
	old := make(chan error, 1)
	go func() {
		r, err := l.Acquire(context.Background(), Interactive)
		if err == nil {
			r()
		}
		old <- err
	}()
	waitQueued(t, l, 1)
	advance(2 * time.Minute)
	start := time.Now()
	if _, err := l.Acquire(context.Background(), Interactive); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("a request behind a standing queue: %v, want overloaded", err)
	}
	if waited := time.Since(start); waited > 10*time.Second {
		t.Fatalf("a request behind a standing queue waited %v, want about the standing timeout", waited)
	}
	if s := l.Stats(); s.Queued != 1 || s.QueueAge != 2*time.Minute {
		t.Fatalf("the first waiter should still wait (its minute is not up), in a queue 2 minutes old: %+v", s)
	}
	hold() // the first waiter takes the slot and gives it back: the queue emptied
	if err := <-old; err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.Queued != 0 || s.QueueAge != 0 {
		t.Fatalf("an empty queue: %+v", s)
	}
	// A request was refused just now: the limiter stays overloaded for
	// ten queue timeouts though its queue emptied, then waits long again.
	hold, _ = l.Acquire(context.Background(), Interactive)
	defer hold()
	if _, err := l.Acquire(context.Background(), Interactive); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("a request right after a refusal: %v, want overloaded after the standing timeout", err)
	}
	advance(overloadHold*time.Minute + time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := l.Acquire(ctx, Interactive); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a request behind a queue that emptied, long after the last refusal: %v, want to wait out its own 200 ms deadline", err)
	}
}

// BenchmarkQuotasNewNames: a request naming a client never seen, with
// the default 10,000 tracked and none idle (a caller rotating names).
func BenchmarkQuotasNewNames(b *testing.B) {
	q := NewQuotas(QuotaOptions{Rate: 1000})
	now := time.Unix(1000, 0)
	for i := range 10000 {
		q.Take(fmt.Sprintf("c%d", i), now)
	}
	names := make([]string, 1024)
	for i := range names {
		names[i] = fmt.Sprintf("new%d", i)
	}
	b.ResetTimer()
	for i := range b.N {
		q.Take(names[i%len(names)], now.Add(time.Duration(i)*time.Microsecond))
	}
}

package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cortado-db/cortado/client"
)

// The pieces scripts/bench-changes runs: change-stream consumers that
// count events and measure their lag, over Cortado's /_changes or over
// PostgreSQL's logical decoding (wal2json lines from pg_recvlogical), and
// an open-loop insert writer.

// Consumed is what one or more consumers received.
type Consumed struct {
	Consumers int
	Events    int
	Bytes     int64
	Elapsed   time.Duration // first event to last, the longest consumer
	// Lag is, per event, from the commit time the event carries to its
	// receipt (millisecond resolution: Debezium's ts_ms).
	LagP50, LagP99 time.Duration
}

// EventsPerSecond is the aggregate rate.
func (c Consumed) EventsPerSecond() float64 {
	if c.Elapsed <= 0 {
		return 0
	}
	return float64(c.Events) / c.Elapsed.Seconds()
}

func (c Consumed) String() string {
	return fmt.Sprintf("consumers %d events %d elapsed %.3fs events/s %.0f MB/s %.1f lag_p50_ms %.1f lag_p99_ms %.1f",
		c.Consumers, c.Events, c.Elapsed.Seconds(), c.EventsPerSecond(), float64(c.Bytes)/1e6/max(c.Elapsed.Seconds(), 1e-9),
		float64(c.LagP50)/1e6, float64(c.LagP99)/1e6)
}

// counter counts one consumer's events.
type counter struct {
	events      int
	bytes       int64
	first, last time.Time
	lags        []time.Duration
}

func (c *counter) add(n int, commit time.Time) {
	now := time.Now()
	if c.events == 0 {
		c.first = now
	}
	c.events++
	c.bytes += int64(n)
	c.last = now
	if !commit.IsZero() {
		c.lags = append(c.lags, now.Sub(commit))
	}
}

func merge(cs []*counter) Consumed {
	out := Consumed{Consumers: len(cs)}
	var lags []time.Duration
	for _, c := range cs {
		out.Events += c.events
		out.Bytes += c.bytes
		out.Elapsed = max(out.Elapsed, c.last.Sub(c.first))
		lags = append(lags, c.lags...)
	}
	if len(lags) > 0 {
		slices.Sort(lags)
		out.LagP50, out.LagP99 = lags[len(lags)/2], lags[len(lags)*99/100]
	}
	return out
}

// ConsumeCortado runs n consumers of db's change stream at url, each
// until it received expect change events (ops c, u, d or r) or, when
// quiet is set, none for quiet; it reports them together.
func ConsumeCortado(ctx context.Context, url, db, since string, n, expect int, quiet time.Duration) (Consumed, error) {
	cs := make([]*counter, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var last atomic.Int64 // when a change event last arrived, Unix ns
	last.Store(time.Now().UnixNano())
	var quieted atomic.Bool
	if quiet > 0 {
		stop := make(chan struct{})
		var watch sync.WaitGroup
		defer func() { close(stop); watch.Wait() }()
		watch.Go(func() {
			tick := time.NewTicker(quiet / 10)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case now := <-tick.C:
					if now.Sub(time.Unix(0, last.Load())) > quiet {
						quieted.Store(true)
						cancel()
						return
					}
				}
			}
		})
	}
	for i := range n {
		cs[i] = &counter{}
		wg.Go(func() {
			cl := client.New(url)
			defer cl.Close()
			for e, err := range cl.Changes(ctx, db, &client.ChangeOptions{Since: since}) {
				if err != nil {
					errs[i] = err
					return
				}
				if e.Type != "change" {
					continue
				}
				last.Store(time.Now().UnixNano())
				cs[i].add(len(e.Raw), time.UnixMilli(e.Source.TsMs))
				if cs[i].events >= expect {
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil && !quieted.Load() {
			return merge(cs), err
		}
	}
	return merge(cs), nil
}

// ConsumeWal2JSON counts the changes in wal2json (format-version 2,
// include-timestamp) lines read from r, as pg_recvlogical writes them,
// until expect changes arrived.
func ConsumeWal2JSON(r io.Reader, expect int) (Consumed, error) {
	c := &counter{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for sc.Scan() {
		var m struct {
			Action    string `json:"action"`
			Timestamp string `json:"timestamp"`
		}
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			continue
		}
		if m.Action != "I" && m.Action != "U" && m.Action != "D" {
			continue
		}
		ts, _ := time.Parse("2006-01-02 15:04:05.999999-07", m.Timestamp)
		// The same resolution as Cortado's ts_ms.
		c.add(len(sc.Bytes()), ts.Truncate(time.Millisecond))
		if c.events >= expect {
			return merge([]*counter{c}), nil
		}
	}
	if err := sc.Err(); err != nil {
		return merge([]*counter{c}), err
	}
	return merge([]*counter{c}), fmt.Errorf("the stream ended after %d of %d changes", c.events, expect)
}

// paced calls send(i) for i = 0, 1, … at rate a second, each at its due
// time, for duration: an open loop, whose schedule a slow send delays but
// does not thin. It stops early when ctx ends.
func paced(ctx context.Context, rate float64, duration time.Duration, send func(i int)) error {
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	for i := 0; time.Since(start) < duration; i++ {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(d):
			}
		}
		send(i)
	}
	return nil
}

// Insert writes new documents (ids from first on) at rate a second for
// duration, open loop, and returns how many were acknowledged; acked, if
// set, is told each acknowledged id and when its acknowledgement came.
func Insert(ctx context.Context, o Options, first int, rate float64, duration time.Duration, acked func(id int, at time.Time)) (int, error) {
	o.fill()
	cl := client.New(o.URL)
	defer cl.Close()
	payload := strings.Repeat("x", o.DocBytes)
	var wg sync.WaitGroup
	var mu sync.Mutex
	nAcked, failed := 0, 0
	sem := make(chan struct{}, 256)
	err := paced(ctx, rate, duration, func(i int) {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			id := first + i
			_, err := cl.Put(ctx, o.DB, "Doc", client.Key{id}, map[string]any{"n": id, "payload": payload}, nil)
			if err == nil && acked != nil {
				acked(id, time.Now())
			}
			mu.Lock()
			if err != nil {
				failed++
			} else {
				nAcked++
			}
			mu.Unlock()
		})
	})
	wg.Wait()
	if err != nil {
		return nAcked, err
	}
	if failed > 0 {
		return nAcked, fmt.Errorf("%d of %d inserts failed", failed, nAcked+failed)
	}
	return nAcked, nil
}

// AckLag inserts as Insert does while one consumer follows the stream from
// now, and measures, for each acknowledged insert, from its
// acknowledgement to its event's receipt: the change stream's own delay,
// without the write's (which the commit time an event carries includes).
// An event may arrive before its acknowledgement does; it counts as 0.
func AckLag(ctx context.Context, o Options, first int, rate float64, duration time.Duration) (string, error) {
	o.fill()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	ackAt, seenAt := map[int]time.Time{}, map[int]time.Time{}
	ready := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		cl := client.New(o.URL)
		defer cl.Close()
		for e, err := range cl.Changes(ctx, o.DB, &client.ChangeOptions{Since: "now", Heartbeat: 100 * time.Millisecond}) {
			if err != nil {
				return
			}
			select {
			case <-ready:
			default:
				close(ready) // the stream is open: its first event came
			}
			if e.Type != "change" || len(e.Source.Key) != 1 {
				continue
			}
			if id, ok := e.Source.Key[0].(float64); ok {
				mu.Lock()
				seenAt[int(id)] = time.Now()
				mu.Unlock()
			}
		}
	})
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		return "", fmt.Errorf("the change stream did not open")
	}
	n, err := Insert(ctx, o, first, rate, duration, func(id int, at time.Time) {
		mu.Lock()
		ackAt[id] = at
		mu.Unlock()
	})
	awaitStragglers(&mu, ackAt, seenAt)
	cancel()
	mu.Lock()
	defer mu.Unlock()
	res, lerr := ackLags(ackAt, seenAt)
	if lerr != nil {
		return "", fmt.Errorf("%w (%d inserts acknowledged)", lerr, n)
	}
	return res, err
}

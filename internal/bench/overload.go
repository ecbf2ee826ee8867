package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The overload test (`cortado bench overload`): the capacity C of a
// server for 95 % reads and 5 % writes, then an open-loop load (requests
// sent at a fixed rate, whatever the answers) at multiples of C, against
// two servers side by side — one with the overload protections, one
// without — interleaved step by step. Each step reports goodput
// (successful requests a second), the error rate, the p50 and p99 of
// successes measured from when each request was due (so a queue in the
// client counts), and the servers' peak heap and goroutines.

// OverloadOptions configure the overload test.
type OverloadOptions struct {
	Options
	// Servers are the servers to compare, by name (e.g. "protected":
	// URL, "unprotected": URL); each has the bench database loaded.
	Servers map[string]string
	// Multiples of the capacity to offer (default 0.8 1 1.05 1.2 1.5 2 5).
	Multiples []float64
	// Timeout is each request's client timeout (default 1s): a request
	// answered later is a failure, as for a user who gave up.
	Timeout time.Duration
	// Capacity, when set, is C; otherwise it is measured (closed loop,
	// 64 workers, on the first server in name order).
	Capacity float64
}

// Step is one offered load against one server.
type Step struct {
	Server            string
	Multiple, Offered float64
	Goodput           float64 // successful requests per second
	ErrorRate         float64 // failed / sent
	P50, P99          time.Duration
	HeapMiB           float64 // the server's peak heap in use
	Goroutines        float64 // the server's peak goroutines
}

func (o *OverloadOptions) fill() {
	o.Options.fill()
	if len(o.Multiples) == 0 {
		o.Multiples = []float64{0.8, 1, 1.05, 1.2, 1.5, 2, 5}
	}
	if o.Timeout == 0 {
		o.Timeout = time.Second
	}
}

// Overload runs the test; progress gets a line per step.
func Overload(ctx context.Context, o OverloadOptions, progress io.Writer) (capacity float64, steps []Step, err error) {
	o.fill()
	names := make([]string, 0, len(o.Servers))
	for n := range o.Servers {
		names = append(names, n)
	}
	slices.Sort(names)
	capacity = o.Capacity
	if capacity == 0 {
		oc := o.Options
		oc.URL, oc.Workers = o.Servers[names[0]], 64
		capacity, err = closedLoopMix(ctx, oc)
		if err != nil {
			return 0, nil, err
		}
		fmt.Fprintf(progress, "capacity of %s: %.0f requests/s (95%% GET, 5%% PUT)\n", names[0], capacity)
	}
	for _, m := range o.Multiples {
		for _, n := range names {
			s, err := openLoopMix(ctx, o, o.Servers[n], m*capacity)
			if err != nil {
				return capacity, steps, err
			}
			s.Server, s.Multiple = n, m
			steps = append(steps, s)
			fmt.Fprintf(progress, "%-12s %4.2fC = %6.0f/s: goodput %6.0f/s (%.2fC), errors %5.1f%%, p50 %v p99 %v, heap %.0f MiB, goroutines %.0f\n",
				n, m, s.Offered, s.Goodput, s.Goodput/capacity, 100*s.ErrorRate, s.P50.Round(10*time.Microsecond), s.P99.Round(10*time.Microsecond), s.HeapMiB, s.Goroutines)
		}
	}
	return capacity, steps, nil
}

// request makes one request of the 95/5 mix.
func mixRequest(r *rand.Rand, o Options, base, payload string) (*http.Request, error) {
	id := r.IntN(o.Keys)
	url := fmt.Sprintf("%s/%s/Doc/%d", base, o.DB, id)
	if r.IntN(100) < 5 {
		req, err := http.NewRequest(http.MethodPut, url, strings.NewReader(fmt.Sprintf(`{"n":%d,"payload":"%s"}`, id, payload)))
		if err == nil {
			req.Header.Set("Content-Type", "application/json")
		}
		return req, err
	}
	return http.NewRequest(http.MethodGet, url, nil)
}

func success(resp *http.Response, err error) bool {
	if err != nil {
		return false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode < 300 || resp.StatusCode == http.StatusNotFound
}

// closedLoopMix measures the mix's throughput with o.Workers workers.
func closedLoopMix(ctx context.Context, o Options) (float64, error) {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.Workers}, Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	payload := strings.Repeat("x", o.DocBytes)
	var ok atomic.Int64
	deadline := time.Now().Add(o.Duration)
	var wg sync.WaitGroup
	for w := range o.Workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 5))
			for time.Now().Before(deadline) && ctx.Err() == nil {
				req, err := mixRequest(r, o, o.URL, payload)
				if err != nil {
					return
				}
				if success(hc.Do(req.WithContext(ctx))) {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return float64(ok.Load()) / o.Duration.Seconds(), nil
}

// openLoopMix sends the mix at rate for o.Duration and measures it.
func openLoopMix(ctx context.Context, o OverloadOptions, base string, rate float64) (Step, error) {
	// The client's own bounds: a few hundred connections, and at most
	// what could be in flight within the timeout (the rest counts as
	// failed: a user's request that never left).
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512, MaxConnsPerHost: 512}, Timeout: o.Timeout}
	defer hc.CloseIdleConnections()
	maxOutstanding := int64(rate*o.Timeout.Seconds()) + 512
	payload := strings.Repeat("x", o.DocBytes)
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	n := int(o.Duration / interval)
	var (
		mu          sync.Mutex
		lat         []time.Duration
		failed      int
		outstanding atomic.Int64
		wg          sync.WaitGroup
	)
	peak := watchServer(base, o.Duration)
	r := rand.New(rand.NewPCG(9, uint64(rate)))
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		if err := waitUntil(ctx, at); err != nil {
			wg.Wait()
			return Step{}, err
		}
		req, err := mixRequest(r, o.Options, base, payload)
		if err != nil {
			return Step{}, err
		}
		if outstanding.Load() >= maxOutstanding {
			mu.Lock()
			failed++
			mu.Unlock()
			continue
		}
		outstanding.Add(1)
		wg.Go(func() {
			defer outstanding.Add(-1)
			ok := success(hc.Do(req.WithContext(ctx)))
			took := time.Since(at)
			mu.Lock()
			defer mu.Unlock()
			if ok && took <= o.Timeout {
				lat = append(lat, took)
			} else {
				failed++
			}
		})
	}
	wg.Wait()
	heap, goroutines := peak()
	slices.Sort(lat)
	s := Step{Offered: rate, Goodput: float64(len(lat)) / o.Duration.Seconds(), HeapMiB: heap / (1 << 20), Goroutines: goroutines}
	if sent := len(lat) + failed; sent > 0 {
		s.ErrorRate = float64(failed) / float64(sent)
	}
	if len(lat) > 0 {
		s.P50, s.P99 = lat[len(lat)/2], lat[len(lat)*99/100]
	}
	return s, nil
}

// watchServer samples a server's heap and goroutines (its /metrics) for
// d; the returned function waits for the end and returns the peaks.
func watchServer(base string, d time.Duration) func() (heap, goroutines float64) {
	hc := &http.Client{Timeout: 2 * time.Second}
	var heap, goroutines float64
	done := make(chan struct{})
	go func() {
		defer close(done)
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			h, g := scrape(hc, base)
			heap, goroutines = max(heap, h), max(goroutines, g)
			time.Sleep(250 * time.Millisecond)
		}
	}()
	return func() (float64, float64) {
		<-done
		return heap, goroutines
	}
}

func scrape(hc *http.Client, base string) (heap, goroutines float64) {
	return metricSum(hc, base, "go_memstats_heap_inuse_bytes", ""), metricSum(hc, base, "go_goroutines", "")
}

// OverloadTable writes the steps as a Markdown table.
func OverloadTable(w io.Writer, capacity float64, steps []Step) {
	fmt.Fprintf(w, "Capacity C = %.0f requests/s (95 %% GET, 5 %% PUT, closed loop).\n\n", capacity)
	fmt.Fprintf(w, "| offered | server | goodput | errors | p50 | p99 | heap peak | goroutines peak |\n|---|---|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range steps {
		fmt.Fprintf(w, "| %.2fC (%.0f/s) | %s | %.0f/s (%.2fC) | %.1f %% | %v | %v | %.0f MiB | %.0f |\n", s.Multiple, s.Offered, s.Server,
			s.Goodput, s.Goodput/capacity, 100*s.ErrorRate, s.P50.Round(10*time.Microsecond), s.P99.Round(10*time.Microsecond), s.HeapMiB, s.Goroutines)
	}
}

package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The overload test (`cortado bench overload`): the capacity C of a
// server for 95 % reads and 5 % writes, then an open-loop load (requests
// sent at a fixed rate, whatever the answers) at multiples of C, against
// two servers side by side — one with the overload protections, one
// without — interleaved step by step. Each step reports goodput
// (successful requests a second), the error rate, the p50 and p99 of
// successes measured from when each request was due (so a queue in the
// client counts), and the servers' peak heap (whole, and besides
// Pebble's caches and memtables) and goroutines.

// OverloadOptions configure the overload test.
type OverloadOptions struct {
	Options
	// Servers are the servers to compare, by name (e.g. "protected":
	// URL, "unprotected": URL); each has the bench database loaded.
	Servers map[string]string
	// Metrics is where each server's /metrics is read, by name (default
	// its URL in Servers): a port of its own (serve --admin-listen) is
	// not refused when the server's port is full.
	Metrics map[string]string
	// Multiples of the capacity to offer (default 0.8 1 1.05 1.2 1.5 2 5).
	Multiples []float64
	// Timeout is each request's client timeout (default 1s): a request
	// answered later is a failure, as for a user who gave up.
	Timeout time.Duration
	// Capacity, when set, is C; otherwise it is measured on the first
	// server in name order (Capacity below).
	Capacity float64
}

// Step is one offered load against one server.
type Step struct {
	Server            string
	Multiple, Offered float64
	Goodput           float64 // successful requests per second
	ErrorRate         float64 // failed / sent
	P50, P99          time.Duration
	// P99Reads and P99Writes split P99 by the mix's GETs and PUTs.
	P99Reads, P99Writes time.Duration
	// CPU used during the step, in cores: the server's (its
	// process_cpu_seconds_total) and this load generator's own.
	ServerCPU, GeneratorCPU float64
	HeapMiB                 float64 // the server's peak heap in use
	// OtherHeapMiB is the peak of the live heap (as the last collection
	// found it; the heap in use counts garbage too) besides Pebble's
	// block caches and memtables (on the heap in a build without cgo)
	// and the relay's buffers, which fill with the data whatever the
	// load: what overload could grow.
	OtherHeapMiB float64
	Goroutines   float64 // the server's peak goroutines
	// SendLateP99 is the 99th percentile of how late the generator sent
	// its requests (after their due time; for the first on a new
	// connection, after the dial): delay of this machine's making, not
	// the server's queues, though the latencies count it. Dials is how
	// many connections the generator opened in the step.
	SendLateP99 time.Duration
	Dials       int
	// ServerP99 is the p99 of the successful requests' time in the
	// server (its router's cortado_request_duration_seconds, from the
	// handler's start: admission's queue included, the kernel's and the
	// scheduler's delays before it not), as the upper bound of the
	// histogram's bucket (buckets double from 0.1 ms).
	ServerP99 time.Duration
	// ServerP99Reads and ServerP99Writes split it by GET and PUT.
	ServerP99Reads, ServerP99Writes time.Duration
	// UnreadRequests is the most connections to the server's port seen
	// at once holding bytes the server had not read (a request waiting
	// in the kernel, before any admission can see it), UnreadResponses
	// the most of the generator's connections holding an answer it had
	// not read (its own delay); -1 where the kernel cannot be asked
	// (socketQueues).
	UnreadRequests, UnreadResponses int
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
		if capacity, err = Capacity(ctx, o, o.Servers[names[0]], progress); err != nil {
			return 0, nil, err
		}
		fmt.Fprintf(progress, "capacity of %s: %.0f requests/s (95%% GET, 5%% PUT, open loop)\n", names[0], capacity)
	}
	for _, m := range o.Multiples {
		for _, n := range names {
			if d := settle(ctx); d >= time.Second {
				fmt.Fprintf(progress, "waited %v for the cores to settle\n", d.Round(time.Second))
			}
			s, err := openLoopMix(ctx, o, o.Servers[n], o.metricsOf(n), m*capacity)
			if err != nil {
				return capacity, steps, err
			}
			s.Server, s.Multiple = n, m
			steps = append(steps, s)
			fmt.Fprintf(progress, "%-12s %4.2fC = %6.0f/s: goodput %6.0f/s (%.2fC), errors %5.1f%%, p50 %v p99 %v, heap %.0f MiB (live besides caches %.0f), goroutines %.0f, cores: server %.2f generator %.2f\n",
				n, m, s.Offered, s.Goodput, s.Goodput/capacity, 100*s.ErrorRate, s.P50.Round(10*time.Microsecond), s.P99.Round(10*time.Microsecond), s.HeapMiB, s.OtherHeapMiB, s.Goroutines, s.ServerCPU, s.GeneratorCPU)
		}
	}
	return capacity, steps, nil
}

// metricsOf is the base URL of server name's /metrics.
func (o *OverloadOptions) metricsOf(name string) string {
	if u, ok := o.Metrics[name]; ok {
		return u
	}
	return o.Servers[name]
}

// Capacity finds the highest rate of the mix that base serves in open
// loop, as the steps offer it: with at most 1 % of requests failed (not
// answered within the client timeout, or refused). A closed loop of 64
// connections gives the upper end; a binary search below it, in probes of
// a third of o.Duration (at least 3 s, or o.Duration if shorter), ends
// within 5 % of it; then the rate found is offered for a whole step,
// 5 % less each time it is not served (confirmCapacity).
func Capacity(ctx context.Context, o OverloadOptions, base string, progress io.Writer) (float64, error) {
	o.fill()
	oc := o.Options
	oc.URL, oc.Workers = base, 64
	closed, err := closedLoop(ctx, oc)
	if err != nil {
		return 0, err
	}
	fmt.Fprintf(progress, "capacity: closed loop %.0f requests/s\n", closed)
	servesFor := func(d time.Duration) func(rate float64) (bool, error) {
		step := o
		step.Duration = d
		return func(rate float64) (bool, error) {
			// A probe after one that overloaded the server must not
			// pay for the queues that one left (a run at 03a63d5 found
			// C at 0.6 of what the server then served: the probe right
			// after the closed-loop rate's failed).
			if d := settle(ctx); d >= time.Second {
				fmt.Fprintf(progress, "capacity: waited %v for the cores to settle\n", d.Round(time.Second))
			}
			s, err := openLoopMix(ctx, step, base, base, rate)
			if err != nil {
				return false, err
			}
			ok := s.ErrorRate <= 0.01
			fmt.Fprintf(progress, "capacity: open loop %6.0f/s for %v: goodput %6.0f/s, errors %5.1f%%, p99 %v: %v\n", rate, d, s.Goodput, 100*s.ErrorRate, s.P99.Round(10*time.Microsecond), ok)
			return ok, nil
		}
	}
	probe := max(o.Duration/3, min(o.Duration, 3*time.Second))
	c, err := searchCapacity(closed, servesFor(probe))
	if err != nil {
		return 0, err
	}
	if probe == o.Duration {
		return c, nil // the search's probes were whole steps already
	}
	return confirmCapacity(c, servesFor(o.Duration))
}

// confirmCapacity returns the highest of c, 0.95c, 0.95²c, … (at most
// confirmTries rates) that serves says is served, or the last of them.
// A rate the short probes of the search served is not always served for
// a whole step: flushes, compactions and collections come at their own
// pace (a run at 0667449 found C = 15,805/s in probes of 10 s, then
// failed 7 % at 1.0C and 12.5 % at 1.05C in steps of 30 s).
func confirmCapacity(c float64, serves func(rate float64) (bool, error)) (float64, error) {
	for range confirmTries - 1 {
		ok, err := serves(c)
		if err != nil || ok {
			return c, err
		}
		c *= 0.95
	}
	return c, nil
}

const confirmTries = 4

// searchCapacity returns the highest rate up to hi that serves says is
// served, within 5 % of hi, by binary search.
func searchCapacity(hi float64, serves func(rate float64) (bool, error)) (float64, error) {
	lo, top := 0.0, hi
	if ok, err := serves(hi); err != nil || ok {
		return hi, err
	}
	for hi-lo > 0.05*top {
		mid := (lo + hi) / 2
		ok, err := serves(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	if lo == 0 {
		return 0, fmt.Errorf("no rate above %.0f/s was served with at most 1 %% failed", hi)
	}
	return lo, nil
}

func success(resp *http.Response, err error) bool {
	if err != nil {
		return false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return succeeded(resp.StatusCode)
}

// succeeded reports whether an answer of the mix counts as served: a
// read of a key not loaded is a 404, an answer all the same.
func succeeded(status int) bool {
	return status > 0 && status < 300 || status == http.StatusNotFound
}

// openLoopMix sends the mix at rate to base for o.Duration and measures
// it, reading the server's /metrics at metrics.
func openLoopMix(ctx context.Context, o OverloadOptions, base, metrics string, rate float64) (Step, error) {
	hc := &http.Client{Timeout: 2 * time.Second}
	m0 := fetchMetrics(hc, metrics)
	cpu0, self0, t0 := m0.sum("process_cpu_seconds_total", ""), selfCPU(), time.Now()
	peak := watchServer(metrics, o.Duration)
	unread := watchSockets(base, o.Duration)
	res, err := openLoop(ctx, o.Options, base, rate, o.Duration, o.Timeout)
	heap, other, goroutines := peak()
	requests, responses := unread()
	if err != nil {
		return Step{}, err
	}
	lat, late, failed, dials := res.lat, res.late, res.failed, res.dials
	secs := time.Since(t0).Seconds()
	m1 := fetchMetrics(hc, metrics)
	serverCPU := (m1.sum("process_cpu_seconds_total", "") - cpu0) / secs
	generatorCPU := (selfCPU() - self0).Seconds() / secs
	slices.Sort(lat)
	s := Step{Offered: rate, Goodput: float64(len(lat)) / o.Duration.Seconds(), HeapMiB: heap / (1 << 20), OtherHeapMiB: other / (1 << 20), Goroutines: goroutines,
		ServerCPU: serverCPU, GeneratorCPU: generatorCPU, Dials: dials, ServerP99: successP99(m0, m1, ""),
		ServerP99Reads: successP99(m0, m1, "GET"), ServerP99Writes: successP99(m0, m1, "PUT"),
		P99Reads: p99(res.reads), P99Writes: p99(res.writes), UnreadRequests: requests, UnreadResponses: responses}
	s.SendLateP99 = p99(late)
	if sent := len(lat) + failed; sent > 0 {
		s.ErrorRate = float64(failed) / float64(sent)
	}
	if len(lat) > 0 {
		s.P50, s.P99 = lat[len(lat)/2], lat[len(lat)*99/100]
	}
	return s, nil
}

// p99 is the 99th percentile of lat (0 when empty); it sorts lat.
func p99(lat []time.Duration) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	slices.Sort(lat)
	return lat[len(lat)*99/100]
}

// successP99 is the upper bound of the router's latency bucket holding
// the 99th percentile of the successful requests (2xx, 404) served
// between two readings of its /metrics, of those with the given method
// if one is given; 0 without any.
func successP99(before, after metricsPage, method string) time.Duration {
	counts := func(m metricsPage) map[float64]float64 {
		c := map[float64]float64{}
		for _, line := range m {
			rest, ok := strings.CutPrefix(line, "cortado_request_duration_seconds_bucket{")
			if !ok {
				continue
			}
			labels, value, ok := strings.Cut(rest, "} ")
			if !ok || !(strings.Contains(labels, `code="2`) || strings.Contains(labels, `code="404"`)) {
				continue
			}
			if method != "" && !strings.Contains(labels, `method="`+method+`"`) {
				continue
			}
			_, le, _ := strings.Cut(labels, `le="`)
			le, _, _ = strings.Cut(le, `"`)
			bound, err1 := strconv.ParseFloat(le, 64)
			n, err2 := strconv.ParseFloat(value, 64)
			if err1 == nil && err2 == nil {
				c[bound] += n
			}
		}
		return c
	}
	b, a := counts(before), counts(after)
	var bounds []float64
	for le := range a {
		bounds = append(bounds, le)
	}
	slices.Sort(bounds)
	if len(bounds) == 0 {
		return 0
	}
	total := a[bounds[len(bounds)-1]] - b[bounds[len(bounds)-1]] // +Inf: every request
	if total <= 0 {
		return 0
	}
	for _, le := range bounds {
		if a[le]-b[le] >= 0.99*total {
			if math.IsInf(le, 1) {
				return time.Duration(math.MaxInt64)
			}
			return time.Duration(le * float64(time.Second))
		}
	}
	return 0
}

// watchServer samples a server's heap, its live heap besides Pebble's
// caches and memtables and the relay's buffers, and its goroutines (its
// /metrics) for d; the returned function waits for the end and returns
// the peaks.
func watchServer(base string, d time.Duration) func() (heap, other, goroutines float64) {
	hc := &http.Client{Timeout: 2 * time.Second}
	var heap, other, goroutines float64
	wait := sampleFor(d, func() {
		h, o, g := scrape(hc, base)
		heap, other, goroutines = max(heap, h), max(other, o), max(goroutines, g)
	})
	return func() (float64, float64, float64) {
		wait()
		return heap, other, goroutines
	}
}

// sampleFor calls sample every 250 ms for d, from a goroutine of its
// own; the returned function waits for the last call to end.
func sampleFor(d time.Duration, sample func()) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
			sample()
		}
	}()
	return func() { <-done }
}

// watchSockets samples, for d, the connections to base's port that hold
// unread bytes on either side (Step.UnreadRequests and UnreadResponses);
// the returned function waits for the end and returns the peaks, -1
// each where the kernel's socket tables cannot be read.
func watchSockets(base string, d time.Duration) func() (requests, responses int) {
	u, err := url.Parse(base)
	port, _ := strconv.Atoi(u.Port())
	if err != nil || port == 0 {
		return func() (int, int) { return -1, -1 }
	}
	requests, responses := -1, -1
	wait := sampleFor(d, func() {
		if rq, rs, err := socketQueues(port); err == nil {
			requests, responses = max(requests, rq), max(responses, rs)
		}
	})
	return func() (int, int) {
		wait()
		return requests, responses
	}
}

// selfCPU is the CPU time this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// scrape reads a server's heap in use; its live heap (as its last
// collection found it) besides its Pebble block caches and memtables
// (every node's: current, waiting for a flush, and kept for reuse), its
// row caches and its relay's buffers, which fill with the data whatever
// the load; and its goroutines.
func scrape(hc *http.Client, base string) (heap, other, goroutines float64) {
	m := fetchMetrics(hc, base)
	caches := m.sum("cortado_pebble_block_cache_bytes", "") + m.sum("cortado_pebble_memtable_bytes", "") +
		m.sum("cortado_pebble_memtable_zombie_bytes", "") + m.sum("cortado_row_cache_bytes", "") +
		m.sum("cortado_relay_buffer_bytes", "")
	return m.sum("go_memstats_heap_inuse_bytes", ""), m.sum("go_gc_heap_live_bytes", "") - caches, m.sum("go_goroutines", "")
}

// OverloadTable writes the steps as a Markdown table.
func OverloadTable(w io.Writer, capacity float64, steps []Step) {
	fmt.Fprintf(w, "Capacity C = %.0f requests/s (95 %% GET, 5 %% PUT): the highest rate served in open loop with at most 1 %% failed, for a whole step.\n\n", capacity)
	fmt.Fprintf(w, "| offered | server | goodput | errors | p50 | p99 | p99 GET / PUT | heap peak | live besides caches | goroutines peak | cores: server / generator | sent late p99 | dials | p99 in the server | in the server GET / PUT | unread in sockets: requests / answers |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n")
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	for _, s := range steps {
		fmt.Fprintf(w, "| %.2fC (%.0f/s) | %s | %.0f/s (%.2fC) | %.1f %% | %v | %v | %v / %v | %.0f MiB | %.0f MiB | %.0f | %.2f / %.2f | %v | %d | ≤ %v | ≤ %v / ≤ %v | %d / %d |\n", s.Multiple, s.Offered, s.Server,
			s.Goodput, s.Goodput/capacity, 100*s.ErrorRate, r(s.P50), r(s.P99), r(s.P99Reads), r(s.P99Writes), s.HeapMiB, s.OtherHeapMiB, s.Goroutines, s.ServerCPU, s.GeneratorCPU,
			r(s.SendLateP99), s.Dials, s.ServerP99, s.ServerP99Reads, s.ServerP99Writes, s.UnreadRequests, s.UnreadResponses)
	}
}

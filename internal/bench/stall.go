package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The stall test (`cortado bench stall`): reads that accept a slave's
// answer (`Cache-Control: max-stale`) sent open loop at a fixed rate,
// by the overload test's generator (a pool of connections, not a
// goroutine and a new connection per request as net/http's client
// makes them when the answers slow down),
// through each of several routers in turn (one hedging, one not), the
// same requests in the same order; during each run one storage process
// is stopped (SIGSTOP) for a while, then continued. It reports the p50
// and p99 of reads due outside the stall ("normal") and while the node
// was stopped, the hedges the router sent and its per-host budgets
// denied, and the other storage nodes' peak calls in progress against
// their limits and the calls they refused.

// StallOptions configure the stall test.
type StallOptions struct {
	Options
	// Routers to compare, by name → URL, each in front of the same
	// storage nodes with the bench database loaded.
	Routers map[string]string
	// Rate is the reads a second offered; when 0, Multiple (default
	// 0.8) of the capacity C of the 95 % GET / 5 % PUT mix through the
	// first router, found open loop as the overload test finds it
	// (Capacity; reads alone cost less: the load is at most that
	// multiple of their capacity). The closed loop's figure, used before
	// 2026-11-25, was above what the cluster serves open loop: 0.8 of it
	// overloaded the first router measured, and its reads failed for
	// whole runs, stall or not.
	Rate, Multiple float64
	// Multi, when more than 1, makes each read a multi-get of that many
	// random keys (a page, with max-stale as the others), and divides
	// the default rate by it: a multi-get reads that many documents,
	// mostly of different partitions.
	Multi int
	// PID is the storage process stopped; it is stopped StopAt into each
	// run for StopFor (defaults 5 s and 2 s).
	PID             int
	StopAt, StopFor time.Duration
	// Watch are the other storage nodes' URLs by node id: their
	// admission metrics (edge rpc:ID) are sampled during each run.
	Watch map[string]string
	// Rounds of runs, the routers interleaved (default 2); Timeout is
	// each read's client timeout (default 1 s).
	Rounds  int
	Timeout time.Duration
}

// StallRun is one run through one router.
type StallRun struct {
	Router                 string
	Round                  int
	Reads, Failed          int
	NormalP50, NormalP99   time.Duration
	StalledP50, StalledP99 time.Duration
	StalledFailed          int
	HedgesSent, Denied     float64
	// By watched node: peak calls in progress, the limit at that
	// moment, and calls refused during the run.
	PeakInFlight, LimitAtPeak, Refused map[string]float64
	// Why reads due in the stall failed: status code or "timeout".
	Why map[string]int
	// Failures per 250 ms, from 0.5 s before the stop to 1.5 s after
	// the continue, by when the reads were due.
	Timeline []int
}

func (o *StallOptions) fill() {
	o.Options.fill()
	if o.StopAt == 0 {
		o.StopAt = 5 * time.Second
	}
	if o.StopFor == 0 {
		o.StopFor = 2 * time.Second
	}
	if o.Rounds == 0 {
		o.Rounds = 2
	}
	if o.Timeout == 0 {
		o.Timeout = time.Second
	}
	if o.Multiple == 0 {
		o.Multiple = 0.8
	}
}

// Stall runs the test (filling o's defaults and rate in); progress gets
// a line per run.
func Stall(ctx context.Context, o *StallOptions, progress io.Writer) ([]StallRun, error) {
	o.fill()
	if o.PID <= 0 || len(o.Routers) == 0 || o.Duration <= o.StopAt+o.StopFor {
		return nil, fmt.Errorf("stall: needs a pid, routers, and a duration longer than stop-at + stop-for")
	}
	names := slices.Sorted(maps.Keys(o.Routers))
	if o.Rate <= 0 {
		c, err := Capacity(ctx, OverloadOptions{Options: o.Options, Timeout: o.Timeout}, o.Routers[names[0]], progress)
		if err != nil {
			return nil, err
		}
		o.Rate = o.Multiple * c / float64(max(1, o.Multi))
		fmt.Fprintf(progress, "capacity C through %s: %.0f requests/s (95%% GET, 5%% PUT, open loop); offering %.0f reads/s\n", names[0], c, o.Rate)
	}
	var runs []StallRun
	for round := range o.Rounds {
		for _, n := range names {
			r, err := stallRun(ctx, *o, o.Routers[n])
			if err != nil {
				return runs, err
			}
			r.Router, r.Round = n, round+1
			runs = append(runs, r)
			fmt.Fprintf(progress, "%-10s round %d: normal p50 %v p99 %v; stalled p50 %v p99 %v (%d failed: %v, per 250 ms from 0.5 s before the stop: %v); hedges %.0f, denied %.0f; peaks %v of %v, refused %v\n",
				n, r.Round, r.NormalP50, r.NormalP99, r.StalledP50, r.StalledP99, r.StalledFailed, r.Why, r.Timeline, r.HedgesSent, r.Denied, r.PeakInFlight, r.LimitAtPeak, r.Refused)
		}
	}
	return runs, nil
}

func stallRun(ctx context.Context, o StallOptions, base string) (StallRun, error) {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2048}, Timeout: o.Timeout}
	defer hc.CloseIdleConnections()
	mc := &http.Client{Timeout: 2 * time.Second}
	sentBefore, deniedBefore := hedgeCounts(mc, base)
	refusedBefore := map[string]float64{}
	for id, u := range o.Watch {
		refusedBefore[id] = metricSum(mc, u, "cortado_admission_rejected_total", `edge="rpc:`+id+`"`)
	}
	// The other nodes' calls in progress, sampled every 50 ms.
	run := StallRun{PeakInFlight: map[string]float64{}, LimitAtPeak: map[string]float64{}, Refused: map[string]float64{}, Why: map[string]int{}}
	sampleCtx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	var sampling sync.WaitGroup
	var smu sync.Mutex
	for id, u := range o.Watch {
		sampling.Go(func() {
			for sampleCtx.Err() == nil {
				m := fetchMetrics(mc, u)
				in, limit := m.sum("cortado_admission_in_flight", `edge="rpc:`+id+`"`), m.sum("cortado_admission_limit", `edge="rpc:`+id+`"`)
				smu.Lock()
				if in >= run.PeakInFlight[id] {
					run.PeakInFlight[id], run.LimitAtPeak[id] = in, limit
				}
				smu.Unlock()
				select {
				case <-sampleCtx.Done():
				case <-time.After(50 * time.Millisecond):
				}
			}
		})
	}
	// The stall.
	start := time.Now()
	stopAt, contAt := start.Add(o.StopAt), start.Add(o.StopAt+o.StopFor)
	var stalling sync.WaitGroup
	stalling.Go(func() {
		if waitUntil(ctx, stopAt) != nil {
			return
		}
		syscall.Kill(o.PID, syscall.SIGSTOP)
		waitUntil(context.Background(), contAt)
		syscall.Kill(o.PID, syscall.SIGCONT)
	})
	defer stalling.Wait()

	type result struct {
		due  time.Time
		took time.Duration
		ok   bool
		why  string // of a failure: the status and problem type, or "timeout"
	}
	var (
		rmu     sync.Mutex
		results []result
	)
	err := offer(ctx, base, o.Rate, o.Duration, o.Timeout, openLoad{
		write: func(bw *bufio.Writer, r *rand.Rand, host string) bool {
			if o.Multi <= 1 {
				fmt.Fprintf(bw, "GET /%s/Doc/%d HTTP/1.1\r\nHost: %s\r\nCache-Control: max-stale=10\r\n\r\n", o.DB, r.IntN(o.Keys), host)
				return false
			}
			fmt.Fprintf(bw, "GET /%s/Doc/(", o.DB)
			for i := range o.Multi {
				if i > 0 {
					bw.WriteByte(',')
				}
				bw.WriteString(strconv.Itoa(r.IntN(o.Keys)))
			}
			fmt.Fprintf(bw, ") HTTP/1.1\r\nHost: %s\r\nCache-Control: max-stale=10\r\n\r\n", host)
			return false
		},
		answer: func(due time.Time, took time.Duration, a answer) {
			why := strings.TrimSpace(strconv.Itoa(a.status) + " " + a.problem)
			if a.status == 0 {
				why = a.problem
			}
			rmu.Lock()
			results = append(results, result{due: due, took: took, ok: succeeded(a.status) && took <= o.Timeout, why: why})
			rmu.Unlock()
		},
	})
	stopSampling()
	sampling.Wait()
	if err != nil {
		return run, err
	}
	// A read due while the node was stopped, or just after (its queue
	// drains), counts as stalled.
	var normal, stalled []time.Duration
	const bucket = 250 * time.Millisecond
	from := stopAt.Add(-500 * time.Millisecond)
	run.Timeline = make([]int, int((o.StopFor+2*time.Second)/bucket))
	for _, res := range results {
		if b := int(res.due.Sub(from) / bucket); (!res.ok || res.took > o.Timeout) && res.due.After(from) && b < len(run.Timeline) {
			run.Timeline[b]++
		}
		in := !res.due.Before(stopAt) && res.due.Before(contAt.Add(500*time.Millisecond))
		run.Reads++
		if !res.ok || res.took > o.Timeout {
			run.Failed++
			if in {
				run.StalledFailed++
				run.Why[res.why]++
			}
			continue
		}
		if in {
			stalled = append(stalled, res.took)
		} else {
			normal = append(normal, res.took)
		}
	}
	run.NormalP50, run.NormalP99 = percentiles(normal)
	run.StalledP50, run.StalledP99 = percentiles(stalled)
	sent, denied := hedgeCounts(mc, base)
	run.HedgesSent, run.Denied = sent-sentBefore, denied-deniedBefore
	for id, u := range o.Watch {
		run.Refused[id] = metricSum(mc, u, "cortado_admission_rejected_total", `edge="rpc:`+id+`"`) - refusedBefore[id]
	}
	return run, nil
}

func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	if len(d) == 0 {
		return 0, 0
	}
	slices.Sort(d)
	return d[len(d)/2], d[len(d)*99/100]
}

func hedgeCounts(hc *http.Client, base string) (sent, denied float64) {
	m := fetchMetrics(hc, base)
	return m.sum("cortado_hedged_reads_total", `result="sent"`), m.sum("cortado_hedged_reads_total", `result="denied"`)
}

// metricSum sums the samples of a metric whose labels contain label (""
// for every sample) on a server's /metrics.
// metricSum is the sum of a server's metric name over the series whose
// labels contain label (see metricsPage.sum).
func metricSum(hc *http.Client, base, name, label string) float64 {
	return fetchMetrics(hc, base).sum(name, label)
}

// metricsPage is a server's /metrics, one line a series.
type metricsPage []string

// fetchMetrics reads a server's /metrics once (nothing when it fails), for
// reading several metrics of the same moment without asking again.
func fetchMetrics(hc *http.Client, base string) metricsPage {
	resp, err := hc.Get(base + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var m metricsPage
	for sc.Scan() {
		m = append(m, sc.Text())
	}
	return m
}

// sum adds up metric name over its series whose labels contain label.
func (m metricsPage) sum(name, label string) float64 {
	var sum float64
	for _, line := range m {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		sp := strings.LastIndexByte(rest, ' ')
		if sp < 0 || !strings.Contains(rest[:sp], label) {
			continue
		}
		if v, err := strconv.ParseFloat(rest[sp+1:], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// StallTable writes the runs as a Markdown table.
func StallTable(w io.Writer, o StallOptions, runs []StallRun) {
	what := "reads"
	if o.Multi > 1 {
		what = fmt.Sprintf("multi-gets of %d random keys", o.Multi)
	}
	fmt.Fprintf(w, "%.0f %s a second (Cache-Control: max-stale=10), one storage process stopped %v into each %v run for %v.\n\n", o.Rate, what, o.StopAt, o.Duration, o.StopFor)
	fmt.Fprintf(w, "| router | round | normal p50 | normal p99 | stalled p50 | stalled p99 | stalled p99 / normal p99 | failed (stalled) | hedges sent | denied | other nodes: peak in progress / limit | refused |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, r := range runs {
		ratio := 0.0
		if r.NormalP99 > 0 {
			ratio = float64(r.StalledP99) / float64(r.NormalP99)
		}
		var peaks, refused []string
		for _, id := range slices.Sorted(maps.Keys(r.PeakInFlight)) {
			peaks = append(peaks, fmt.Sprintf("%s %.0f/%.0f", id, r.PeakInFlight[id], r.LimitAtPeak[id]))
			refused = append(refused, fmt.Sprintf("%s %.0f", id, r.Refused[id]))
		}
		fmt.Fprintf(w, "| %s | %d | %v | %v | %v | %v | %.1f× | %d (%d) | %.0f | %.0f | %s | %s |\n", r.Router, r.Round,
			r.NormalP50.Round(10*time.Microsecond), r.NormalP99.Round(10*time.Microsecond), r.StalledP50.Round(10*time.Microsecond), r.StalledP99.Round(10*time.Microsecond),
			ratio, r.Failed, r.StalledFailed, r.HedgesSent, r.Denied, strings.Join(peaks, ", "), strings.Join(refused, ", "))
	}
}

package jepsen

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/cortado-db/cortado/internal/clustertest"
	"github.com/cortado-db/cortado/internal/controller"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/topo"
)

// Result is what a run found.
type Result struct {
	Ops       int
	Acked     int
	Maybe     int
	Lost      []Anomaly // acknowledged writes or increments not in the final state
	Anomalies []Anomaly // everything else: reads back in time, missing keys, duplicates, non-linearizable registers, replicas apart
	Faults    []Fault
	// Linearizable is porcupine's verdict on the registers.
	Linearizable string
	// Rows is the result table, one row per fault kind and a total.
	Rows []Row
}

// Row is one line of the result table.
type Row struct {
	Fault                  string
	Cycles                 int
	Ops, Acked, Maybe      int
	Lost, Anomalies        int
	MaxUnavail, P50Unavail time.Duration // per-partition write unavailability during the fault
	// Why counts the unknown outcomes by operation kind and cause
	// ("probe: 503 Write not confirmed by a replica").
	Why map[string]int
	// Worst is the longest unavailability's partition, when it began
	// (its last probe acknowledged before, or the fault's start) and
	// ended, and what the probes of that partition met in between.
	Worst Gap
}

// Gap is a partition's time without an acknowledged probe write.
type Gap struct {
	Partition  string
	From, To   time.Time
	FaultStart time.Time
	Met        map[string]int // the probes' answers in the gap, by cause
}

// Failed reports whether anything was lost or anomalous.
func (r *Result) Failed() bool { return len(r.Lost) > 0 || len(r.Anomalies) > 0 }

// Check reads the final state through the routers (after the cluster
// has healed) and checks the history against it.
func Check(c *Cluster, h *History, faults []Fault) *Result {
	res := &Result{Faults: faults, Anomalies: slices.Clone(h.anomalies)}
	hc := newHTTP(c.routerURLs()...)
	read := func(path string) (int64, bool, error) { return readWith(hc, path) }
	// Unique keys: every acknowledged one holds its value.
	type kv struct {
		v   int64
		at  time.Time
		scn string
	}
	acked := map[string]kv{}
	incAcked, incMaybe := map[string]int64{}, map[string]int64{}
	casAcked := map[string][]Op{}
	for _, op := range h.ops {
		res.Ops++
		switch op.Outcome {
		case Ok:
			res.Acked++
		case Maybe:
			res.Maybe++
		}
		switch {
		case op.Kind == "put" && op.Outcome == Ok:
			acked[op.Key] = kv{op.Value, op.End, op.SCN}
		case op.Kind == "inc" && op.Outcome == Ok:
			incAcked[op.Key]++
		case op.Kind == "inc" && op.Outcome == Maybe:
			incMaybe[op.Key]++
		case op.Kind == "cas" && op.Outcome == Ok:
			casAcked[op.Key] = append(casAcked[op.Key], op)
		}
	}
	keys := make([]string, 0, len(acked))
	for k := range acked {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	readEach(c.routerURLs(), len(keys), func(i int) string { return "/d/U/" + keys[i] }, func(i int, v int64, found bool, err error) {
		k := keys[i]
		switch {
		case err != nil:
			res.Anomalies = append(res.Anomalies, Anomaly{time.Now(), "unreadable", err.Error()})
		case !found || v != acked[k].v:
			res.Lost = append(res.Lost, Anomaly{acked[k].at, "lost put", fmt.Sprintf("U/%s=%d acknowledged at %s (scn %s); now found=%v value %d", k, acked[k].v, acked[k].at.Format(stamp), acked[k].scn, found, v)})
		}
	})
	for j := range counters {
		key := fmt.Sprintf("C/inc%d", j)
		n, _, err := read("/d/" + key)
		if err != nil {
			res.Anomalies = append(res.Anomalies, Anomaly{time.Now(), "unreadable", err.Error()})
			continue
		}
		if n < incAcked[key] {
			res.Lost = append(res.Lost, Anomaly{time.Now(), "lost increment", fmt.Sprintf("%s = %d, but %d increments were acknowledged", key, n, incAcked[key])})
		}
		if n > incAcked[key]+incMaybe[key] {
			res.Anomalies = append(res.Anomalies, Anomaly{time.Now(), "duplicated increment", fmt.Sprintf("%s = %d, but only %d acknowledged + %d unknown increments were sent", key, n, incAcked[key], incMaybe[key])})
		}
		key = fmt.Sprintf("C/cas%d", j)
		n, _, err = read("/d/" + key)
		if err != nil {
			res.Anomalies = append(res.Anomalies, Anomaly{time.Now(), "unreadable", err.Error()})
			continue
		}
		ops := slices.Clone(casAcked[key])
		slices.SortFunc(ops, func(a, b Op) int { return cmp.Compare(a.Value, b.Value) })
		for i := 1; i < len(ops); i++ {
			if a, b := ops[i-1], ops[i]; a.Value == b.Value {
				res.Anomalies = append(res.Anomalies, Anomaly{later(a.End, b.End), "duplicate CAS", fmt.Sprintf("%s: two If-Match writes of %d acknowledged (both based on the same version): client %d %s–%s (scn %s) and client %d %s–%s (scn %s)",
					key, a.Value, a.Client, a.Start.Format(stamp), a.End.Format(stamp), a.SCN, b.Client, b.Start.Format(stamp), b.End.Format(stamp), b.SCN)})
			}
		}
		if len(ops) > 0 && n < ops[len(ops)-1].Value {
			res.Lost = append(res.Lost, Anomaly{time.Now(), "lost CAS", fmt.Sprintf("%s = %d, but %d was acknowledged", key, n, ops[len(ops)-1].Value)})
		}
	}
	res.Anomalies = append(res.Anomalies, checkBanks(hc, h.ops, res)...)
	var illegal bool
	if res.Linearizable, illegal = checkRegisters(h.ops, time.Minute); illegal {
		res.Anomalies = append(res.Anomalies, Anomaly{time.Now(), "not linearizable", "registers C/reg*: " + res.Linearizable})
	}
	res.Anomalies = append(res.Anomalies, checkReplicas(c)...)
	res.Anomalies = append(res.Anomalies, checkAlarms(c)...)
	res.Rows = table(h, res, faults)
	return res
}

// checkBanks checks the banks' final balances, and finds every
// acknowledged transfer's receipt (a lost one goes to res.Lost).
func checkBanks(hc *httpClient, ops []Op, res *Result) (anomalies []Anomaly) {
	for g := range banks {
		bank := fmt.Sprintf("bank%d", g)
		var r response
		for deadline := time.Now().Add(time.Minute); ; {
			if r = hc.send("GET", "/d/B/"+bank, "", ""); r.err == nil && r.status == 200 || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if r.err != nil || r.status != 200 {
			anomalies = append(anomalies, Anomaly{time.Now(), "unreadable", fmt.Sprintf("B/%s: %d %s %v", bank, r.status, r.body, r.err)})
			continue
		}
		if n, sum, ok := balances(r.body); !ok {
			anomalies = append(anomalies, Anomaly{time.Now(), "transaction torn", fmt.Sprintf("%s at the end: %d accounts holding %d, want %d holding %d", bank, n, sum, accounts, accounts*balance)})
		}
	}
	// The receipts' indexes find what their collections hold.
	for g := range banks {
		base := fmt.Sprintf("/d/R/bank%d?limit=1000", g)
		held, err := pagedKeys(hc, base)
		if err != nil {
			anomalies = append(anomalies, Anomaly{time.Now(), "unreadable", err.Error()})
			continue
		}
		for _, q := range []string{"n:[1 TO 10]", "memo:transfer"} {
			found, err := pagedKeys(hc, base+"&query="+url.QueryEscape(q))
			switch {
			case err != nil:
				anomalies = append(anomalies, Anomaly{time.Now(), "unreadable", err.Error()})
			case !slices.Equal(found, held):
				anomalies = append(anomalies, Anomaly{time.Now(), "index", fmt.Sprintf("R/bank%d?query=%s finds %d receipts, the collection holds %d", g, q, len(found), len(held))})
			}
		}
	}
	var receipts []Op
	for _, op := range ops {
		if op.Kind == "transfer" && op.Outcome == Ok {
			receipts = append(receipts, op)
		}
	}
	readEach(hc.bases, len(receipts), func(i int) string { return "/d/R/" + receipts[i].Key }, func(i int, v int64, found bool, err error) {
		op := receipts[i]
		switch {
		case err != nil:
			anomalies = append(anomalies, Anomaly{time.Now(), "unreadable", err.Error()})
		case !found || v != op.Value:
			res.Lost = append(res.Lost, Anomaly{op.End, "lost transaction", fmt.Sprintf("receipt R/%s=%d acknowledged at %s (scn %s); now found=%v value %d", op.Key, op.Value, op.End.Format(stamp), op.SCN, found, v)})
		}
	})
	return anomalies
}

// pagedKeys reads every page of a collection or query (path holds its
// query string), retrying answers that say nothing for up to a minute,
// and returns the documents' keys, sorted.
func pagedKeys(hc *httpClient, path string) ([]string, error) {
	var out []string
	next := ""
	for deadline := time.Now().Add(time.Minute); ; {
		p := path
		if next != "" {
			p += "&next=" + url.QueryEscape(next)
		}
		r := hc.send("GET", p, "", "")
		if r.err != nil || r.status != 200 {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("GET %s: %d %s %v", p, r.status, r.body, r.err)
			}
			time.Sleep(200 * time.Millisecond)
			continue
		}
		var page struct {
			Documents []struct{ Key []any }
			Next      string
		}
		if err := json.Unmarshal(r.body, &page); err != nil {
			return nil, fmt.Errorf("GET %s: %v", p, err)
		}
		for _, d := range page.Documents {
			out = append(out, fmt.Sprint(d.Key...))
		}
		if next = page.Next; next == "" {
			slices.Sort(out)
			return out, nil
		}
	}
}

// readEach reads the number of n documents (path(i) names the i-th)
// through the routers at bases, 16 at once, each reader with its own
// connections and retrying as readWith does, and hands each result to
// got, one call at a time.
func readEach(bases []string, n int, path func(i int) string, got func(i int, v int64, found bool, err error)) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	work := make(chan int)
	for range 16 {
		wg.Go(func() {
			hc := newHTTP(bases...)
			for i := range work {
				v, found, err := readWith(hc, path(i))
				mu.Lock()
				got(i, v, found, err)
				mu.Unlock()
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
}

// readWith reads a document's number through the routers, retrying
// answers that say nothing (503, no connection) for up to a minute.
func readWith(hc *httpClient, path string) (int64, bool, error) {
	deadline := time.Now().Add(60 * time.Second)
	for {
		r := hc.send("GET", path, "", "")
		if r.err == nil && (r.status == 200 || r.status == 404) {
			v, _ := readValue(r.body)
			return v, r.status == 200, nil
		}
		if time.Now().After(deadline) {
			return 0, false, fmt.Errorf("GET %s: %d %s %v", path, r.status, r.body, r.err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkReplicas waits until every replica matches its master (the
// consistency check at one SCN) and every replica's commit log holds the
// same sequence of SCNs as its master's.
func checkReplicas(c *Cluster) []Anomaly {
	ctx := context.Background()
	deadline := time.Now().Add(90 * time.Second)
	var last string
	for {
		res, err := controller.Check(ctx, c.cli, prefix, "d")
		settled := err == nil
		for _, pc := range res {
			if len(pc.Replicas) != 2 {
				settled, last = false, fmt.Sprintf("partition %d has %d slaves", pc.Partition, len(pc.Replicas))
			}
			for _, r := range pc.Replicas {
				if r.Result == controller.CheckDiffers {
					return []Anomaly{{time.Now(), "replicas differ", fmt.Sprintf("partition %d: replica %s differs from master %s at %s in %v (sums %s, master's %s); %s",
						pc.Partition, r.Node, pc.Master, pc.SCN, r.Tables, r.Sum, pc.Sum, describeReplicas(c, pc.Partition, pc.Master, r.Node))}}
				}
				if r.Result != controller.CheckEqual {
					settled, last = false, fmt.Sprintf("partition %d replica %s: %s", pc.Partition, r.Node, r.Result)
				}
			}
		}
		if settled {
			break
		}
		if time.Now().After(deadline) {
			return []Anomaly{{time.Now(), "replicas unsettled", fmt.Sprintf("after 90s: %v %s", err, last)}}
		}
		time.Sleep(500 * time.Millisecond)
	}
	rt, err := topo.LoadRoutingTable(ctx, c.cli, prefix, "d")
	if err != nil {
		return []Anomaly{{time.Now(), "replicas unsettled", err.Error()}}
	}
	var out []Anomaly
	for p, r := range rt.Partitions {
		var want clustertest.Log
		for i, id := range r.Replicas {
			got, err := clustertest.Timeline(rt.Nodes[id], "d", p)
			if err != nil {
				out = append(out, Anomaly{time.Now(), "replicas unsettled", err.Error()})
				continue
			}
			if i == 0 {
				want = got
			} else if !got.Agrees(want) {
				out = append(out, Anomaly{time.Now(), "timelines differ", fmt.Sprintf("partition %d: %s's commit log (%s) differs from master %s's (%s) where both hold it", p, id, got, r.Replicas[0], want)})
			}
		}
	}
	return append(out, checkCopies(ctx, c)...)
}

// alarmLine is what a storage process logs when its replica refused to
// truncate acknowledged commits (server.Cluster's alarm): a source in
// force said its timeline lacks commits that were acknowledged, so
// either an acknowledged write is gone from the master, or the source
// was wrong to say so. A node's alarm may never reach the final checks
// (the node stopped, as a joined one does, or the alarm cleared), so
// every storage process's log is read.
const alarmLine = "replica refused to truncate acknowledged commits"

// checkAlarms reports, per storage node, the truncation alarms its log
// holds (every storage process the run started, a removed one too):
// how many, and the first.
func checkAlarms(c *Cluster) []Anomaly {
	var out []Anomaly
	for _, id := range slices.Sorted(maps.Keys(c.everStorage)) {
		n, first := 0, ""
		for line := range strings.Lines(c.everStorage[id].Log()) {
			if strings.Contains(line, alarmLine) {
				if n == 0 {
					first = strings.TrimSpace(line)
				}
				n++
			}
		}
		if n > 0 {
			out = append(out, Anomaly{time.Now(), "truncation alarm", fmt.Sprintf("%s logged %d truncation alarms, the first: %s", id, n, first)})
		}
	}
	return out
}

// describeReplicas says where two replicas of a partition stand: role,
// SCN, generation and retained log, for an anomaly's message.
func describeReplicas(c *Cluster, p int, ids ...string) string {
	rt, err := topo.LoadRoutingTable(context.Background(), c.cli, prefix, "d")
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, id := range ids {
		url, ok := rt.Nodes[id]
		if !ok {
			out = append(out, id+": not a live node")
			continue
		}
		r := node.NewRemote(url)
		st, err := r.Status(context.Background(), node.StatusRequest{DB: "d"})
		r.Close()
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", id, err))
			continue
		}
		for _, ps := range st {
			if ps.Partition == p {
				l, err := clustertest.Timeline(url, "d", p)
				out = append(out, fmt.Sprintf("%s: role %v at %s, generation %d, log %s %v", id, ps.Role, ps.SCN, ps.Generation, l, err))
			}
		}
	}
	return strings.Join(out, "; ")
}

// checkCopies waits until no live node keeps a copy of a partition it is
// no replica of: with every replica settled, each such copy is redundant
// and the controller has it deleted (placement.DecideCopies).
func checkCopies(ctx context.Context, c *Cluster) []Anomaly {
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := controller.ClusterStatus(ctx, c.cli, prefix)
		if err != nil {
			st = &controller.Status{}
		}
		var kept []string
		for _, d := range st.Databases {
			for _, p := range d.Partitions {
				for _, cp := range p.Copies {
					kept = append(kept, fmt.Sprintf("%s/%d on %s at %s", d.Name, p.Partition, cp.Node, cp.SCN))
				}
			}
		}
		if err == nil && len(kept) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return []Anomaly{{time.Now(), "copies kept", fmt.Sprintf("30 s after the replicas settled (%v): %s", err, strings.Join(kept, ", "))}}
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// table sums the history by the fault in force when each operation ended
// ("none" between faults), with each fault's per-partition write
// unavailability (the longest gap between successful probe writes).
func table(h *History, res *Result, faults []Fault) []Row {
	rows := map[string]*Row{}
	row := func(k string) *Row {
		if rows[k] == nil {
			rows[k] = &Row{Fault: k}
		}
		return rows[k]
	}
	during := func(t time.Time) string {
		for _, f := range faults {
			if !t.Before(f.Start) && !t.After(f.Done) {
				return f.Kind
			}
		}
		return "none"
	}
	for _, f := range faults {
		row(f.Kind).Cycles++
	}
	for _, op := range h.ops {
		r := row(during(op.End))
		r.Ops++
		switch op.Outcome {
		case Ok:
			r.Acked++
		case Maybe:
			r.Maybe++
			if r.Why == nil {
				r.Why = map[string]int{}
			}
			r.Why[op.Kind+": "+op.Why]++
		}
	}
	for _, a := range res.Lost {
		row(during(a.At)).Lost++
	}
	for _, a := range res.Anomalies {
		row(during(a.At)).Anomalies++
	}
	// Probe successes per partition, in time order.
	ok := map[string][]time.Time{}
	for _, op := range h.ops {
		if op.Kind == "probe" && op.Outcome == Ok {
			ok[op.Key] = append(ok[op.Key], op.End)
		}
	}
	gaps := map[string][]time.Duration{}
	worst := map[string]Gap{}
	for _, f := range faults {
		// A gap that outlasts the fault is its own until the next fault
		// starts: from then on that one is to blame (a kill-router right
		// before a kill-two was charged the kill-two's 16 s).
		until := time.Time{}
		for _, g := range faults {
			if !g.Start.Before(f.Done) && (until.IsZero() || g.Start.Before(until)) {
				until = g.Start
			}
		}
		for key, ts := range ok {
			slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
			var longest Gap
			prev := f.Start
			for _, t := range ts {
				if t.Before(f.Start) {
					continue
				}
				last := t.After(f.Done)
				if last && !until.IsZero() && t.After(until) {
					t = until
				}
				if t.Sub(prev) > longest.To.Sub(longest.From) {
					longest = Gap{Partition: key, From: prev, To: t, FaultStart: f.Start}
				}
				if last {
					break
				}
				prev = t
			}
			d := longest.To.Sub(longest.From)
			gaps[f.Kind] = append(gaps[f.Kind], d)
			if w := worst[f.Kind]; d > w.To.Sub(w.From) {
				worst[f.Kind] = longest
			}
		}
	}
	for k, g := range worst {
		g.Met = map[string]int{}
		for _, op := range h.ops {
			if op.Kind == "probe" && op.Key == g.Partition && op.Outcome != Ok && op.End.After(g.From) && !op.End.After(g.To) {
				g.Met[op.Why]++
			}
		}
		row(k).Worst = g
	}
	var out []Row
	total := Row{Fault: "total"}
	for _, k := range append(slices.Clone(Faults), "none") {
		r := rows[k]
		if r == nil {
			continue
		}
		if g := gaps[k]; len(g) > 0 {
			slices.Sort(g)
			r.MaxUnavail, r.P50Unavail = g[len(g)-1], g[len(g)/2]
		}
		out = append(out, *r)
		total.Cycles += r.Cycles
		total.Ops += r.Ops
		total.Acked += r.Acked
		total.Maybe += r.Maybe
		total.Lost += r.Lost
		total.Anomalies += r.Anomalies
	}
	return append(out, total)
}

// Markdown renders the result table.
func (r *Result) Markdown() string {
	var b strings.Builder
	b.WriteString("| fault | cycles | operations | acknowledged | unknown outcome | lost | anomalies | partition unavailability p50 / max |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---|\n")
	for _, row := range r.Rows {
		unavail := "—"
		if row.MaxUnavail > 0 {
			unavail = fmt.Sprintf("%.1f s / %.1f s", row.P50Unavail.Seconds(), row.MaxUnavail.Seconds())
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d | %s |\n", row.Fault, row.Cycles, row.Ops, row.Acked, row.Maybe, row.Lost, row.Anomalies, unavail)
	}
	b.WriteString("\nUnknown outcomes by operation and cause (the three most frequent of each fault):\n")
	for _, row := range r.Rows {
		if len(row.Why) == 0 || row.Fault == "total" {
			continue
		}
		fmt.Fprintf(&b, "- %s: %s\n", row.Fault, mostFrequent(row.Why, 3))
	}
	b.WriteString("\nThe longest unavailability of each fault (the partition's probes write every 250 ms, each waiting up to 2 s):\n")
	for _, row := range r.Rows {
		g := row.Worst
		if g.Partition == "" {
			continue
		}
		fmt.Fprintf(&b, "- %s: partition %s, %.1f s from %s (%.1f s after the fault began)", row.Fault, g.Partition,
			g.To.Sub(g.From).Seconds(), g.From.UTC().Format("15:04:05.000"), g.From.Sub(g.FaultStart).Seconds())
		if len(g.Met) > 0 {
			b.WriteString("; its probes met " + mostFrequent(g.Met, 4))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// mostFrequent renders the n most frequent of counts, the most frequent
// first: "a ×3, b ×1".
func mostFrequent(counts map[string]int, n int) string {
	keys := slices.Collect(maps.Keys(counts))
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(counts[b]-counts[a], strings.Compare(a, b)) })
	parts := make([]string, 0, n)
	for _, k := range keys[:min(n, len(keys))] {
		parts = append(parts, fmt.Sprintf("%s ×%d", k, counts[k]))
	}
	return strings.Join(parts, ", ")
}

// checkRegisters runs porcupine over the history's register operations,
// register by register, within timeout, and says what it found; illegal
// if some register's history has no linearization.
func checkRegisters(ops []Op, timeout time.Duration) (verdict string, illegal bool) {
	var regs []porcupine.Operation
	names := map[string]bool{}
	for _, op := range ops {
		switch {
		case op.Kind == "reg-put" && op.Outcome != Fail:
			end := op.End.UnixNano()
			if op.Outcome == Maybe {
				end = math.MaxInt64 // may take effect at any later time
			}
			regs = append(regs, porcupine.Operation{ClientId: op.Client, Input: regIn{op.Key, true, op.Value}, Call: op.Start.UnixNano(), Return: end})
		case op.Kind == "reg-get":
			regs = append(regs, porcupine.Operation{ClientId: op.Client, Input: regIn{op.Key, false, 0}, Output: op.Value, Call: op.Start.UnixNano(), Return: op.End.UnixNano()})
		default:
			continue
		}
		names[op.Key] = true
	}
	n := fmt.Sprintf("%d operations on %d registers", len(regs), len(names))
	switch porcupine.CheckOperationsTimeout(registerModel, regs, timeout) {
	case porcupine.Ok:
		return "linearizable (" + n + ")", false
	case porcupine.Illegal:
		return "NOT linearizable (" + n + ")", true
	default:
		return fmt.Sprintf("not decided within %s (%s)", timeout, n), false
	}
}

// regIn is one register operation for porcupine.
type regIn struct {
	key   string
	write bool
	value int64
}

// registerModel is a map of independent registers, checked key by key;
// every register starts at 0 (a read of one nobody wrote answers 404,
// recorded as 0).
var registerModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(regIn).key
			byKey[k] = append(byKey[k], op)
		}
		var out [][]porcupine.Operation
		for _, ops := range byKey {
			out = append(out, ops)
		}
		return out
	},
	Init: func() any { return int64(0) },
	Step: func(state, input, output any) (bool, any) {
		in := input.(regIn)
		if in.write {
			return true, in.value
		}
		return output.(int64) == state.(int64), state
	},
	DescribeOperation: func(input, output any) string {
		in := input.(regIn)
		if in.write {
			return fmt.Sprintf("put %s=%d", in.key, in.value)
		}
		return fmt.Sprintf("get %s → %v", in.key, output)
	},
}

// stamp is how anomalies print times: to the millisecond, to match with
// the processes' logs.
const stamp = "15:04:05.000"

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

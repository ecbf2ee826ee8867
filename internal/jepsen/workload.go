package jepsen

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cortado-db/cortado/internal/clustertest"
	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/problem"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
)

// The workload, through both routers at once (each client alternates):
//
//   - unique-key writers PUT U/u-<writer>-<i> = i, each key once;
//   - CAS incrementers GET C/cas<j> and PUT it back with n+1 under
//     If-Match, over 8 shared counters;
//   - PATCH incrementers send {"increment":{"n":1}} to C/inc<j>, over 8
//     shared counters;
//   - readers read counters and acknowledged unique keys and check, as
//     they go, that no read returns less than what was already known
//     (acknowledged, or read) when it started, and no acknowledged key is
//     missing;
//   - stale readers read counters accepting a second's staleness
//     (Cache-Control: max-stale=1: a router's hot-key cache, a slave or
//     the master answers) and check that no read returns less than what
//     was known a second (and a tenth) before it started;
//   - register clients put and get C/reg<j>-<period> for porcupine: three
//     registers at a time, new ones every registerPeriod, so that each
//     register's history stays short enough to decide (Jepsen's
//     "independent" keys);
//   - transferrers move amounts between the accounts B/bank<g>/a<i> of a
//     bank (a document group) in transactions of three operations: two
//     PATCH increments and a receipt R/bank<g>/r-<client>-<i> created
//     with ifNoneMatch "*"; a bank reader reads a bank's accounts as one
//     collection, whose balances must always add up to what the bank
//     started with (a transaction is applied whole or not at all, the
//     outcome known or not), and every acknowledged receipt must be
//     found at the end, and found by the receipts' indexes (attribute
//     and text) as the collection holds them;
//   - a probe writer per partition every 250 ms measures unavailability.
const counters = 8

// The banks of the transfer clients: each holds accounts accounts of
// balance at the start.
const banks, accounts, balance = 4, 5, 100

// Outcome is what a client learned of an operation.
type Outcome int

const (
	// Ok is acknowledged.
	Ok Outcome = iota
	// Fail is certainly not done (refused before anything was written).
	Fail
	// Maybe is unknown: it may or may not have taken effect.
	Maybe
)

// Op is one operation in the history.
type Op struct {
	Kind       string // put, cas, inc, read, reg-put, reg-get, probe
	Key        string
	Value      int64 // written (put, cas: the new value, reg-put) or read
	Found      bool  // for reads
	Outcome    Outcome
	Start, End time.Time
	Client     int
	// SCN is the commit a write made or a read saw, as the router said.
	SCN string
	// Why says what a write that was not acknowledged met (its outcome
	// Fail or Maybe): the answer's status and title, or the client's
	// error.
	Why string
}

// History is every operation, appended as they complete.
type History struct {
	mu  sync.Mutex
	ops []Op
	// anomalies found while running (reads going back, missing keys).
	anomalies []Anomaly
	// floor: per counter key, the greatest value read or written by a
	// CAS so far; incs: acknowledged PATCH increments so far. A read
	// starting now must see at least both.
	floor, incs map[string]int64
	// acked unique keys, for readers to pick from.
	ackedKeys []string
	ackedAt   map[string]time.Time
	// floors: per counter key, when each rise of its floor was known
	// (staleReader checks a stale read against the floor of a moment).
	floors map[string][]floorAt[int64]
	// bankFloors: per bank, when each rise of the SCN a read of its
	// accounts must be at or past was known: an acknowledged transfer's,
	// or a read's (bankReader checks a stale read against the floor of a
	// moment, as staleReader does).
	bankFloors map[string][]floorAt[storage.SCN]
}

// floorAt is a floor (a counter's value, a bank's SCN) from a moment on.
type floorAt[T any] struct {
	at time.Time
	v  T
}

// risen is fs with the floor risen to v, known from at on (or from the
// last rise's moment, if later: operations are added as they complete,
// not quite in the order of their ends; a later moment only makes the
// floor of a moment lower); fs itself when v is not above the last
// floor (less orders the values).
func risen[T any](fs []floorAt[T], at time.Time, v T, less func(a, b T) bool) []floorAt[T] {
	if n := len(fs); n > 0 {
		if !less(fs[n-1].v, v) {
			return fs
		}
		at = later(at, fs[n-1].at)
	}
	return append(fs, floorAt[T]{at, v})
}

// floorAtTime is the floor of fs as known at t: the zero value before
// its first rise.
func floorAtTime[T any](fs []floorAt[T], t time.Time) T {
	i := sort.Search(len(fs), func(i int) bool { return fs[i].at.After(t) })
	if i == 0 {
		var zero T
		return zero
	}
	return fs[i-1].v
}

// Anomaly is one violation found.
type Anomaly struct {
	At     time.Time
	Kind   string
	Detail string
}

func newHistory() *History {
	return &History{floor: map[string]int64{}, incs: map[string]int64{}, ackedAt: map[string]time.Time{}, floors: map[string][]floorAt[int64]{},
		bankFloors: map[string][]floorAt[storage.SCN]{}}
}

func (h *History) add(op Op) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, op)
	if op.Outcome != Ok {
		return
	}
	switch op.Kind {
	case "put":
		h.ackedKeys = append(h.ackedKeys, op.Key)
		h.ackedAt[op.Key] = op.End
	case "cas", "read":
		if op.Kind == "read" && !strings.HasPrefix(op.Key, "C/") {
			return
		}
		h.floor[op.Key] = max(h.floor[op.Key], op.Value)
		h.floorRose(op.Key, op.End)
	case "inc":
		h.incs[op.Key]++
		h.floorRose(op.Key, op.End)
	case "transfer", "bank-read":
		bank, _, _ := strings.Cut(op.Key, "/")
		scn, err := storage.ParseSCN(strings.Fields(op.SCN + " ")[0])
		if err != nil {
			return
		}
		h.bankFloors[bank] = risen(h.bankFloors[bank], op.End, scn, storage.SCN.Less)
	}
}

// bankFloorBefore is the SCN a read of bank's accounts that accepts
// staleness back to t is at or past.
func (h *History) bankFloorBefore(bank string, t time.Time) storage.SCN {
	h.mu.Lock()
	defer h.mu.Unlock()
	return floorAtTime(h.bankFloors[bank], t)
}

// floorRose records key's floor as known from at on (risen).
func (h *History) floorRose(key string, at time.Time) {
	h.floors[key] = risen(h.floors[key], at, max(h.floor[key], h.incs[key]), cmp.Less[int64])
}

// floorBefore is key's floor as known at t: every value a read that
// accepts staleness back to t may return is at least it.
func (h *History) floorBefore(key string, t time.Time) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return floorAtTime(h.floors[key], t)
}

func (h *History) anomaly(kind, format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.anomalies = append(h.anomalies, Anomaly{At: time.Now(), Kind: kind, Detail: fmt.Sprintf(format, args...)})
}

func (h *History) floorOf(key string) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return max(h.floor[key], h.incs[key])
}

// pickAcked returns an acknowledged unique key, if any.
func (h *History) pickAcked(rng *rand.Rand) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.ackedKeys) == 0 {
		return "", false
	}
	return h.ackedKeys[rng.IntN(len(h.ackedKeys))], true
}

// httpClient talks to the routers.
type httpClient struct {
	bases []string
	hc    *http.Client
	n     int
}

func newHTTP(bases ...string) *httpClient {
	return &httpClient{bases: bases, hc: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4}}}
}

// response is one answer: status, body, ETag, and whether the request
// reached a server at all.
type response struct {
	status int
	body   []byte
	etag   string
	scn    string // X-Cortado-SCN: the commit written, or read
	base   string // the router that answered
	err    error
	// by says who answered a read, and age how old it said the answer
	// may be.
	by  answerer
	age string
}

// answerer is who answered a read: a router's hot-key cache, a slave, or
// the master.
type answerer int

const (
	byCache answerer = iota
	bySlave
	byMaster
	byTier
)

func (a answerer) String() string {
	return [...]string{"a router's cache", "a slave", "the master", "the Redis cache tier"}[a]
}

func (c *httpClient) send(method, path, body, ifMatch string) response {
	var h http.Header
	if ifMatch != "" {
		h = http.Header{"If-Match": {ifMatch}}
	}
	return c.sendWith(method, path, body, h)
}

// sendWith sends a request with more headers, through the next router.
func (c *httpClient) sendWith(method, path, body string, h http.Header) response {
	c.n++
	base := c.bases[c.n%len(c.bases)]
	req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
	for k, v := range h {
		req.Header[k] = v
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return response{err: err, base: base}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	by := byMaster
	if c := resp.Header.Get("X-Cortado-Cache"); c == "hit" {
		by = byCache
	} else if c == "redis" {
		by = byTier
	} else if resp.Header.Get("X-Cortado-Replica") == "slave" {
		by = bySlave
	}
	return response{status: resp.StatusCode, body: b, etag: resp.Header.Get("ETag"), scn: resp.Header.Get("X-Cortado-SCN"), base: base,
		by: by, age: resp.Header.Get("Age")}
}

func (c *httpClient) do(method, path, body, ifMatch string) (int, []byte) {
	r := c.send(method, path, body, ifMatch)
	if r.err != nil {
		return 0, []byte(r.err.Error())
	}
	return r.status, r.body
}

// writeOutcome classifies a write's answer. A refusal that says nothing
// was done is Fail; anything else that is not a success may have taken
// effect.
func writeOutcome(r response) Outcome {
	switch {
	case r.err != nil:
		if strings.Contains(r.err.Error(), "connection refused") {
			return Fail
		}
		return Maybe
	case r.status < 300:
		return Ok
	case r.status == 412 || r.status == 404 || r.status == 400 || r.status == 409:
		return Fail
	case r.status == 503 && clustertest.RefusedNothingDone(problemOf(r)):
		// No master there, never delivered, too few replicas, or
		// refused by an admission (the router's, its bound on calls to
		// one node, or the node's) before anything was done.
		return Fail
	}
	return Maybe
}

// cause says why a write's outcome is unknown: the answer's status and
// title, or what the client met instead of an answer.
func cause(r response) string {
	if r.err != nil {
		switch msg := r.err.Error(); {
		case strings.Contains(msg, "Client.Timeout exceeded"):
			return "client timeout"
		case strings.Contains(msg, "EOF"):
			return "connection closed"
		case strings.Contains(msg, "reset by peer"):
			return "connection reset"
		default:
			return msg
		}
	}
	p := problemOf(r)
	if p.Title == "" {
		p.Title = strings.TrimPrefix(p.Type, "urn:cortado:problem:")
	}
	if p.Type == problem.TypeOverloaded {
		// Which limit refused it: the router's bound on its calls to
		// one node, or the node's own admission.
		switch {
		case strings.Contains(p.Detail, "in flight already"):
			return fmt.Sprintf("%d %s (the router's calls to the node)", r.status, p.Title)
		case strings.Contains(p.Detail, "storage node"):
			return fmt.Sprintf("%d %s (the node's admission)", r.status, p.Title)
		}
	}
	return fmt.Sprintf("%d %s", r.status, p.Title)
}

// problemOf is the problem detail r's body holds (empty if none).
func problemOf(r response) problem.Problem {
	var p problem.Problem
	json.Unmarshal(r.body, &p)
	return p
}

// written is the operation a write's answer r makes of op: its outcome,
// and what it met when it was not acknowledged.
func written(op Op, r response) Op {
	op.Outcome = writeOutcome(r)
	if op.Outcome != Ok {
		op.Why = cause(r)
	}
	return op
}

// readValue parses a counter or unique document's number.
func readValue(b []byte) (int64, bool) {
	var d struct {
		N *int64 `json:"n"`
		V *int64 `json:"v"`
	}
	if json.Unmarshal(b, &d) != nil {
		return 0, false
	}
	if d.N != nil {
		return *d.N, true
	}
	if d.V != nil {
		return *d.V, true
	}
	return 0, false
}

// Workload runs the clients until Stop.
type Workload struct {
	h     *History
	c     *Cluster
	stop  chan struct{}
	wg    sync.WaitGroup
	seed  uint64
	probe []string  // a key per partition
	begin time.Time // when the clients started: registers' periods count from it
	// staleBy counts staleReader's answers by who gave them (answerer);
	// staleBanks, bankReader's reads with max-stale.
	staleBy, staleBanks [byTier + 1]atomic.Int64
	// notModified counts its revalidations answered 304.
	notModified atomic.Int64
}

// StaleReads says how many of the stale readers' reads each kind of
// replica answered.
func (w *Workload) StaleReads() string {
	return fmt.Sprintf("%d from a router's cache, %d from the Redis cache tier, %d from a slave, %d from the master (%d revalidations answered 304); bank reads with max-stale=1: %d from a slave, %d from the master",
		w.staleBy[byCache].Load(), w.staleBy[byTier].Load(), w.staleBy[bySlave].Load(), w.staleBy[byMaster].Load(), w.notModified.Load(),
		w.staleBanks[bySlave].Load(), w.staleBanks[byMaster].Load())
}

// registerPeriod is how long the register clients use the same three
// registers: a register's history stays a few hundred operations with at
// most one write of unknown outcome per client (see registers), and the
// registers move across partitions, and so across masters, during a
// run. Three registers over a whole run (tens of thousands of
// operations, hundreds of them unknown after kills) were seldom decided
// within the checker's minute.
const registerPeriod = 5 * time.Second

// StartWorkload seeds the counters and starts every client.
func StartWorkload(c *Cluster, seed uint64) *Workload {
	w := &Workload{h: newHistory(), c: c, stop: make(chan struct{}), seed: seed}
	hc := newHTTP(c.routerURLs()...)
	for j := range counters {
		for _, k := range []string{"cas", "inc"} {
			for {
				if st, _ := hc.do("PUT", fmt.Sprintf("/d/C/%s%d", k, j), `{"n":0}`, ""); st < 300 {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	for g := range banks {
		for a := range accounts {
			for {
				if st, _ := hc.do("PUT", fmt.Sprintf("/d/B/bank%d/a%d", g, a), fmt.Sprintf(`{"n":%d}`, balance), ""); st < 300 {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	w.probe = probeKeys(c.opts.Partitions)
	w.begin = time.Now()
	client := 0
	run := func(n int, f func(id int, rng *rand.Rand, hc *httpClient)) {
		for range n {
			id := client
			client++
			w.wg.Go(func() { f(id, rand.New(rand.NewPCG(w.seed, uint64(id))), newHTTP(c.routerURLs()...)) })
		}
	}
	run(4, w.uniqueWriter)
	run(3, w.casIncrementer)
	run(3, w.patchIncrementer)
	run(3, w.reader)
	run(2, w.staleReader)
	run(2, w.registers)
	run(2, w.transferrer)
	run(1, w.bankReader)
	w.wg.Go(w.prober)
	return w
}

// probeKeys returns a key of table U in each partition of d.
func probeKeys(partitions int) []string { return partitionKeys(partitions, "probe") }

// partitionKeys returns a key of each partition of d (by index): the
// first of prefix0, prefix1, … that falls in it.
func partitionKeys(partitions int, prefix string) []string {
	db := schema.Database{Name: "d", Partitioning: "hash", Partitions: partitions}
	out := make([]string, partitions)
	for i, found := 0, 0; found < partitions; i++ {
		k := fmt.Sprintf("%s%d", prefix, i)
		if p := db.PartitionOf(keys.S(k)); out[p] == "" {
			out[p], found = k, found+1
		}
	}
	return out
}

func (c *Cluster) routerURLs() []string {
	var out []string
	for _, r := range c.Routers {
		out = append(out, r.URL)
	}
	return out
}

func (w *Workload) stopped() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

// pause waits d or until Stop.
func (w *Workload) pause(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.stop:
	case <-t.C:
	}
}

// Stop ends every client and returns the history.
func (w *Workload) Stop() *History {
	close(w.stop)
	w.wg.Wait()
	return w.h
}

func (w *Workload) uniqueWriter(id int, rng *rand.Rand, hc *httpClient) {
	for i := int64(0); !w.stopped(); i++ {
		key := fmt.Sprintf("u-%d-%d", id, i)
		// Retry an unknown outcome with the same PUT (idempotent) a few
		// times; a definite refusal, until it is accepted.
		for try := 0; try < 20 && !w.stopped(); try++ {
			start := time.Now()
			r := hc.send("PUT", "/d/U/"+key, fmt.Sprintf(`{"v":%d}`, i), "")
			op := written(Op{Kind: "put", Key: key, Value: i, Start: start, End: time.Now(), Client: id, SCN: r.scn}, r)
			w.h.add(op)
			if op.Outcome == Ok {
				break
			}
			w.pause(50 * time.Millisecond)
		}
		w.pause(time.Duration(rng.IntN(10)) * time.Millisecond)
	}
}

func (w *Workload) casIncrementer(id int, rng *rand.Rand, hc *httpClient) {
	for !w.stopped() {
		key := fmt.Sprintf("C/cas%d", rng.IntN(counters))
		start := time.Now()
		floor := w.h.floorOf(key)
		r := hc.send("GET", "/d/"+key, "", "")
		if r.err != nil || r.status != 200 {
			w.pause(50 * time.Millisecond)
			continue
		}
		n, _ := readValue(r.body)
		w.checkRead(key, n, floor, start)
		w.h.add(Op{Kind: "read", Key: key, Value: n, Found: true, Outcome: Ok, Start: start, End: time.Now(), Client: id, SCN: r.scn})
		start = time.Now()
		pr := hc.send("PUT", "/d/"+key, fmt.Sprintf(`{"n":%d}`, n+1), r.etag)
		w.h.add(written(Op{Kind: "cas", Key: key, Value: n + 1, Start: start, End: time.Now(), Client: id, SCN: pr.scn + " after " + r.scn}, pr))
		w.pause(time.Duration(rng.IntN(5)) * time.Millisecond)
	}
}

func (w *Workload) patchIncrementer(id int, rng *rand.Rand, hc *httpClient) {
	for !w.stopped() {
		key := fmt.Sprintf("C/inc%d", rng.IntN(counters))
		start := time.Now()
		r := hc.send("PATCH", "/d/"+key, `{"increment":{"n":1}}`, "")
		op := written(Op{Kind: "inc", Key: key, Value: 1, Start: start, End: time.Now(), Client: id}, r)
		w.h.add(op)
		if op.Outcome != Ok {
			w.pause(50 * time.Millisecond)
		}
		w.pause(time.Duration(rng.IntN(5)) * time.Millisecond)
	}
}

// checkRead records an anomaly if a read returned less than what was
// known (acknowledged or read) when it started.
func (w *Workload) checkRead(key string, got, floor int64, start time.Time) {
	if got < floor {
		w.h.anomaly("read went back", "%s read %d at %s, but %d was acknowledged or read before the read began", key, got, start.Format("15:04:05.000"), floor)
	}
}

func (w *Workload) reader(id int, rng *rand.Rand, hc *httpClient) {
	for !w.stopped() {
		start := time.Now()
		if rng.IntN(2) == 0 {
			key := anyCounter(rng)
			floor := w.h.floorOf(key)
			r := hc.send("GET", "/d/"+key, "", "")
			if r.err == nil && r.status == 200 {
				n, _ := readValue(r.body)
				w.checkRead(key, n, floor, start)
				w.h.add(Op{Kind: "read", Key: key, Value: n, Found: true, Outcome: Ok, Start: start, End: time.Now(), Client: id})
			} else if r.err == nil && r.status == 404 {
				w.h.anomaly("missing key", "counter %s: 404", key)
			}
		} else if key, ok := w.h.pickAcked(rng); ok {
			r := hc.send("GET", "/d/U/"+key, "", "")
			if r.err == nil && r.status == 404 {
				w.h.anomaly("missing key", "acknowledged U/%s: 404 at %s", key, start.Format("15:04:05.000"))
			}
			if r.err == nil && r.status == 200 {
				w.h.add(Op{Kind: "read", Key: "U/" + key, Found: true, Outcome: Ok, Start: start, End: time.Now(), Client: id})
			}
		}
		w.pause(time.Duration(1+rng.IntN(5)) * time.Millisecond)
	}
}

// anyCounter is one of the shared counters, C/cas<j> or C/inc<j>.
func anyCounter(rng *rand.Rand) string {
	return fmt.Sprintf("C/%s%d", []string{"cas", "inc"}[rng.IntN(2)], rng.IntN(counters))
}

// staleBound is what staleReader's reads accept (Cache-Control:
// max-stale=1), and staleSlack the time a commit takes from its
// master's state to an answer that carries it (an answer built before
// it is sent): a read may miss what was acknowledged within that much
// before its bound.
const staleBound, staleSlack = time.Second, 100 * time.Millisecond

// staleReader reads the counters accepting a second's staleness, through
// either router: answered by a router's hot-key cache, a slave (when the
// master is slow or gone) or the master. Half its reads of a counter it
// read before revalidate (If-None-Match with the tag it was given): a
// 304 says the counter still holds the value of that tag. Each value
// must be at least what was acknowledged or read a second before the
// read began.
func (w *Workload) staleReader(id int, rng *rand.Rand, hc *httpClient) {
	type seen struct {
		etag string
		n    int64
	}
	last := map[string]seen{}
	for !w.stopped() {
		key := anyCounter(rng)
		h := http.Header{"Cache-Control": {"max-stale=1"}}
		prev, revalidate := last[key]
		if revalidate = revalidate && rng.IntN(2) == 0; revalidate {
			h.Set("If-None-Match", prev.etag)
		}
		start := time.Now()
		floor := w.h.floorBefore(key, start.Add(-staleBound-staleSlack))
		r := hc.sendWith("GET", "/d/"+key, "", h)
		var n int64
		switch {
		case r.err == nil && r.status == 200:
			n, _ = readValue(r.body)
			last[key] = seen{r.etag, n}
		case r.err == nil && r.status == http.StatusNotModified && revalidate:
			n = prev.n
			w.notModified.Add(1)
		default:
			w.pause(time.Duration(1+rng.IntN(5)) * time.Millisecond)
			continue
		}
		w.staleBy[r.by].Add(1)
		if n < floor {
			w.h.anomaly("stale read beyond its bound", "%s read %d with max-stale=1 at %s through %s (answered by %s, Age %s, status %d), but %d was acknowledged or read %v before the read began",
				key, n, start.Format("15:04:05.000"), r.base, r.by, r.age, r.status, floor, staleBound+staleSlack)
		}
		w.h.add(Op{Kind: "stale-read", Key: key, Value: n, Found: true, Outcome: Ok, Start: start, End: time.Now(), Client: id, SCN: r.scn})
		w.pause(time.Duration(1+rng.IntN(5)) * time.Millisecond)
	}
}

// transferrer moves an amount between two accounts of a bank, with a
// receipt, in one transaction. An outcome it does not know is not
// retried: the balances add up either way.
func (w *Workload) transferrer(id int, rng *rand.Rand, hc *httpClient) {
	for i := 0; !w.stopped(); i++ {
		g, from, amount := rng.IntN(banks), rng.IntN(accounts), 1+rng.IntN(10)
		to := (from + 1 + rng.IntN(accounts-1)) % accounts
		bank, receipt := fmt.Sprintf("bank%d", g), fmt.Sprintf("r-%d-%d", id, i)
		body := fmt.Sprintf(`{"ops":[`+
			`{"op":"patch","table":"B","key":[%[1]q,"a%[2]d"],"patch":{"increment":{"n":%[4]d}}},`+
			`{"op":"patch","table":"B","key":[%[1]q,"a%[3]d"],"patch":{"increment":{"n":%[5]d}}},`+
			`{"op":"put","table":"R","key":[%[1]q,%[6]q],"document":{"n":%[5]d,"memo":"transfer from a%[2]d to a%[3]d"},"ifNoneMatch":"*"}]}`,
			bank, from, to, -amount, amount, receipt)
		start := time.Now()
		r := hc.send("POST", "/d/_txn/"+bank, body, "")
		op := written(Op{Kind: "transfer", Key: bank + "/" + receipt, Value: int64(amount), Start: start, End: time.Now(), Client: id, SCN: r.scn}, r)
		if op.Outcome == Fail && r.status == 400 {
			w.h.anomaly("transfer refused", "%s: %d %s", op.Key, r.status, r.body)
		}
		w.h.add(op)
		if op.Outcome != Ok {
			w.pause(50 * time.Millisecond)
		}
		w.pause(time.Duration(rng.IntN(10)) * time.Millisecond)
	}
}

// bankReader reads a bank's accounts, as one collection, and checks that
// they add up. Every other read accepts staleness (max-stale=1), which a
// slave answers when the bank's master cannot (a failover): it must add
// up too, and be at or past the SCN of every transfer acknowledged, and
// every fresh read made, staleBound (and a slack) before it began.
func (w *Workload) bankReader(id int, rng *rand.Rand, hc *httpClient) {
	for !w.stopped() {
		bank := fmt.Sprintf("bank%d", rng.IntN(banks))
		start := time.Now()
		stale := rng.IntN(2) == 0
		var h http.Header
		var floor storage.SCN
		if stale {
			h = http.Header{"Cache-Control": {"max-stale=1"}}
			floor = w.h.bankFloorBefore(bank, start.Add(-staleBound-staleSlack))
		}
		r := hc.sendWith("GET", "/d/B/"+bank, "", h)
		if r.err == nil && r.status == 200 {
			if n, sum, ok := balances(r.body); !ok {
				w.h.anomaly("transaction torn", "%s read at %s (scn %s, answered by %s): %d accounts holding %d, want %d holding %d: %s", bank, start.Format(stamp), r.scn, r.by, n, sum, accounts, accounts*balance, r.body)
			}
			if scn, err := storage.ParseSCN(r.scn); err != nil || scn.Less(floor) {
				w.h.anomaly("stale read beyond its bound", "%s read with max-stale=1 at %s (answered by %s, Age %s) at SCN %q, but %s was acknowledged or read %v before the read began",
					bank, start.Format(stamp), r.by, r.age, r.scn, floor, staleBound+staleSlack)
			}
			kind := "bank-read"
			if stale {
				kind = "stale-bank-read"
				w.staleBanks[r.by].Add(1)
			}
			w.h.add(Op{Kind: kind, Key: bank, Outcome: Ok, Start: start, End: time.Now(), Client: id, SCN: r.scn})
		}
		w.pause(time.Duration(1+rng.IntN(10)) * time.Millisecond)
	}
}

// transfers says how many transfers were acknowledged, of unknown
// outcome and refused, and how many bank reads checked the balances.
func (h *History) transfers() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var n [3]int
	reads, stale := 0, 0
	for _, op := range h.ops {
		switch op.Kind {
		case "transfer":
			n[op.Outcome]++
		case "bank-read":
			reads++
		case "stale-bank-read":
			stale++
		}
	}
	return fmt.Sprintf("transfers: %d acknowledged, %d unknown outcome, %d refused; %d bank reads added up (%d of them with max-stale=1)", n[Ok], n[Maybe], n[Fail], reads+stale, stale)
}

// balances counts the accounts of a collection page and adds up their
// balances; ok is whether the page holds every account of a bank and
// they add up to what the bank started with.
func balances(page []byte) (n int, sum int64, ok bool) {
	var p struct {
		Documents []struct {
			Document struct{ N int64 }
		}
	}
	if json.Unmarshal(page, &p) != nil {
		return 0, 0, false
	}
	for _, d := range p.Documents {
		sum += d.Document.N
	}
	n = len(p.Documents)
	return n, sum, n == accounts && sum == accounts*balance
}

// registers puts and gets C/reg<j>-<period> for the linearizability
// check. A register nobody wrote answers 404: that is its initial value,
// 0 (every value written is larger).
//
// After a write whose outcome it does not know, a client only reads that
// register. Such a write may take effect at any later time, and
// porcupine's search doubles with each one pending on a register: a
// dozen writes that timed out in a row during an outage could not be
// decided in minutes (TestRegistersDecided).
func (w *Workload) registers(id int, rng *rand.Rand, hc *httpClient) {
	unsure, last := map[string]bool{}, -1
	for i := int64(1); !w.stopped(); i++ {
		period := int(time.Since(w.begin) / registerPeriod)
		if period != last { // registers of past periods are not used again
			clear(unsure)
			last = period
		}
		key := fmt.Sprintf("C/reg%d-%d", rng.IntN(3), period)
		start := time.Now()
		if rng.IntN(2) == 0 && !unsure[key] {
			v := int64(id)*1_000_000_000 + i
			r := hc.send("PUT", "/d/"+key, fmt.Sprintf(`{"n":%d}`, v), "")
			op := written(Op{Kind: "reg-put", Key: key, Value: v, Start: start, End: time.Now(), Client: id}, r)
			w.h.add(op)
			if op.Outcome == Maybe {
				unsure[key] = true
			}
		} else {
			r := hc.send("GET", "/d/"+key, "", "")
			switch {
			case r.err == nil && r.status == 200:
				n, _ := readValue(r.body)
				w.h.add(Op{Kind: "reg-get", Key: key, Value: n, Found: true, Outcome: Ok, Start: start, End: time.Now(), Client: id})
			case r.err == nil && r.status == 404:
				w.h.add(Op{Kind: "reg-get", Key: key, Outcome: Ok, Start: start, End: time.Now(), Client: id})
			}
		}
		w.pause(time.Duration(5+rng.IntN(20)) * time.Millisecond)
	}
}

// prober writes to every partition every 250 ms.
func (w *Workload) prober() {
	var wg sync.WaitGroup
	for p, key := range w.probe {
		wg.Go(func() {
			hc := newHTTP(w.c.routerURLs()...)
			hc.hc.Timeout = 2 * time.Second
			for i := 0; !w.stopped(); i++ {
				start := time.Now()
				r := hc.send("PUT", "/d/U/"+key, fmt.Sprintf(`{"v":%d}`, i), "")
				w.h.add(written(Op{Kind: "probe", Key: fmt.Sprint(p), Start: start, End: time.Now()}, r))
				w.pause(250 * time.Millisecond)
			}
		})
	}
	wg.Wait()
}

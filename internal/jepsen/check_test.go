package jepsen

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/schema"
)

// TestUnavailabilityPerFault: a partition's longest gap between
// successful probes is charged to the fault in force, and a gap that
// outlasts it only until the next fault starts.
func TestUnavailabilityPerFault(t *testing.T) {
	t0 := time.Now()
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	faults := []Fault{
		{Kind: "kill-router", Start: at(0), Done: at(10)},
		{Kind: "kill-two", Start: at(10), Done: at(20)},
	}
	h := &History{}
	for _, s := range []float64{0.5, 1, 30, 31} { // down from 1 s to 30 s
		h.ops = append(h.ops, Op{Kind: "probe", Key: "p0", Outcome: Ok, Start: at(s), End: at(s)})
	}
	rows := table(h, &Result{}, faults)
	got := map[string]time.Duration{}
	for _, r := range rows {
		got[r.Fault] = r.MaxUnavail
	}
	if got["kill-router"] != 9*time.Second || got["kill-two"] != 20*time.Second {
		t.Fatalf("unavailability %v, want kill-router 9s (until kill-two starts), kill-two 20s", got)
	}
}

// TestLongestUnavailability: the report names each fault's longest gap,
// its partition, when it began and what that partition's probes met in
// it.
func TestLongestUnavailability(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 4, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	faults := []Fault{{Kind: "pause-master", Start: at(0), Done: at(20)}}
	h := &History{}
	probe := func(key string, s float64, r response) {
		h.ops = append(h.ops, written(Op{Kind: "probe", Key: key, Start: at(s - 0.1), End: at(s)}, r))
	}
	ok := response{status: 204}
	unavailable := response{status: 503, body: []byte(`{"title":"Partition unavailable"}`)}
	timeout := response{err: fmt.Errorf(`Put "http://r/d/U/k": context deadline exceeded (Client.Timeout exceeded while awaiting headers)`)}
	for _, s := range []float64{1, 2, 6, 7} { // p0: down 4 s
		probe("p0", s, ok)
	}
	probe("p1", 1, ok)
	probe("p1", 0.5, timeout) // before the gap: not its
	probe("p1", 3, timeout)
	probe("p1", 5, unavailable)
	probe("p1", 6, unavailable)
	probe("p1", 8.5, ok) // p1: down 7.5 s from 1 s
	md := (&Result{Rows: table(h, &Result{}, faults)}).Markdown()
	want := "- pause-master: partition p1, 7.5 s from 04:00:01.000 (1.0 s after the fault began); its probes met 503 Partition unavailable ×2, client timeout ×1\n"
	if !strings.Contains(md, want) {
		t.Fatalf("report:\n%s\nwant\n%s", md, want)
	}
}

// TestUnknownOutcomeCauses: the report names what left writes' outcomes
// unknown, per fault, the most frequent first.
func TestUnknownOutcomeCauses(t *testing.T) {
	t0 := time.Now()
	faults := []Fault{{Kind: "stall-disk", Start: t0, Done: t0.Add(time.Minute)}}
	timeout := response{err: fmt.Errorf(`Put "http://r/d/U/k": context deadline exceeded (Client.Timeout exceeded while awaiting headers)`)}
	notReplicated := response{status: 503, body: []byte(`{"type":"urn:cortado:problem:not-replicated","title":"Write not confirmed by a replica"}`)}
	unreachable := response{status: 503, body: []byte(`{"title":"Storage unreachable"}`)}
	overloaded := response{status: 503, body: []byte(`{"type":"urn:cortado:problem:overloaded","title":"Storage overloaded"}`)}
	h := &History{}
	for _, w := range []struct {
		kind string
		r    response
	}{{"probe", timeout}, {"put", notReplicated}, {"probe", timeout}, {"put", unreachable}, {"inc", timeout}, {"probe", timeout}, {"probe", overloaded}} {
		h.ops = append(h.ops, written(Op{Kind: w.kind, Start: t0, End: t0.Add(time.Second)}, w.r))
	}
	md := (&Result{Rows: table(h, &Result{}, faults)}).Markdown()
	want := "- stall-disk: probe: client timeout ×3, inc: client timeout ×1, put: 503 Write not confirmed by a replica ×1\n"
	if !strings.Contains(md, want) || !strings.Contains(md, "| stall-disk | 1 | 7 | 0 | 5 |") {
		t.Fatalf("report:\n%s\nwant the row with 5 unknown outcomes (refusals as never delivered or overloaded are none) and\n%s", md, want)
	}
}

// TestPartitionKeys: the nemesis's keys of each partition fall in it. (A
// suffix appended to a partition's key moves it to another partition:
// with a power of two of them, FNV-1a permutes them, so a write of
// "probeN-settle" for each N still reached every partition, but one of
// "probeN-stalled" did not reach probeN's.)
func TestPartitionKeys(t *testing.T) {
	db := schema.Database{Name: "d", Partitioning: "hash", Partitions: 64}
	for _, prefix := range []string{"probe", "settle", "stalled"} {
		for p, k := range partitionKeys(64, prefix) {
			if got := db.PartitionOf(keys.S(k)); got != p || !strings.HasPrefix(k, prefix) {
				t.Fatalf("key %q of partition %d is in partition %d", k, p, got)
			}
		}
	}
}

// registerHistory simulates clients on registers that are linearizable:
// each operation takes effect at one instant inside its interval, and
// the intervals of neighbours overlap. About one write in twenty has an
// unknown outcome (a kill cut its answer off), half of those took effect;
// as in the workload, a client only reads a register after such a write.
func registerHistory(registers, opsEach int, seed uint64) []Op {
	rng := rand.New(rand.NewPCG(seed, 1))
	t0 := time.Now()
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }
	var ops []Op
	for r := range registers {
		key := fmt.Sprintf("C/reg%d-%d", r%3, r/3)
		var state int64
		var unsure [2]bool
		for i := range opsEach {
			point := float64(i * 10)
			op := Op{Key: key, Client: i % 2, Outcome: Ok, Start: at(point - rng.Float64()*12), End: at(point + rng.Float64()*12)}
			if rng.IntN(2) == 0 && !unsure[op.Client] {
				op.Kind, op.Value = "reg-put", int64(r*1_000_000+i+1)
				if rng.IntN(20) == 0 {
					op.Outcome, unsure[op.Client] = Maybe, true
				}
				if op.Outcome == Ok || rng.IntN(2) == 0 {
					state = op.Value
				}
			} else {
				op.Kind, op.Value, op.Found = "reg-get", state, state != 0
			}
			ops = append(ops, op)
		}
	}
	return ops
}

// TestRegistersDecided: a run's worth of register operations (an hour of
// the workload's registers, each kept registerPeriod) is decided, and a
// read that missed an acknowledged write, or one on a register nobody
// wrote that returns a value, is not linearizable. (Without the
// workload's rule of one unknown write per client and register, fifteen
// unknown writes in a row followed by reads of the value before them
// were not decided in 20 s: the search tries every subset of them.)
func TestRegistersDecided(t *testing.T) {
	ops := registerHistory(3*720, 160, 1)
	if verdict, illegal := checkRegisters(ops, time.Minute); illegal || !strings.HasPrefix(verdict, "linearizable") {
		t.Fatalf("a linearizable history: %s", verdict)
	}
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	stale := []Op{
		{Kind: "reg-get", Key: "C/reg0-0", Outcome: Ok, Start: at(0), End: at(1)}, // 404: nobody wrote it yet
		{Kind: "reg-put", Key: "C/reg0-0", Value: 7, Outcome: Ok, Start: at(2), End: at(3)},
		{Kind: "reg-get", Key: "C/reg0-0", Outcome: Ok, Start: at(4), End: at(5), Client: 1}, // 404 after 7 was acknowledged
	}
	if verdict, illegal := checkRegisters(stale, time.Minute); !illegal {
		t.Fatalf("a read that missed an acknowledged write: %s", verdict)
	}
	stale[2].Value, stale[2].Found = 7, true
	if verdict, illegal := checkRegisters(stale, time.Minute); illegal {
		t.Fatalf("the same history with the read seeing the write: %s", verdict)
	}
	phantom := []Op{{Kind: "reg-get", Key: "C/reg1-0", Value: 3, Found: true, Outcome: Ok, Start: at(0), End: at(1)}}
	if verdict, illegal := checkRegisters(phantom, time.Minute); !illegal {
		t.Fatalf("a value nobody wrote: %s", verdict)
	}
}

// TestFloorBefore: a counter's floor at a moment is the greatest value
// acknowledged or read by then; a rise added late (operations are added
// as they complete) counts from the last rise's moment, never earlier,
// and a value lower than the floor changes nothing.
func TestFloorBefore(t *testing.T) {
	t0 := time.Now()
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	h := newHistory()
	h.add(Op{Kind: "cas", Key: "C/cas0", Value: 1, Outcome: Ok, End: at(1)})
	h.add(Op{Kind: "read", Key: "C/cas0", Value: 3, Outcome: Ok, End: at(3)})
	h.add(Op{Kind: "cas", Key: "C/cas0", Value: 2, Outcome: Ok, End: at(2)})   // lower: nothing
	h.add(Op{Kind: "cas", Key: "C/cas0", Value: 4, Outcome: Ok, End: at(2.5)}) // late: from 3 s on
	h.add(Op{Kind: "cas", Key: "C/cas0", Value: 9, Outcome: Maybe, End: at(4)})
	h.add(Op{Kind: "stale-read", Key: "C/cas0", Value: 7, Outcome: Ok, End: at(4)})
	h.add(Op{Kind: "inc", Key: "C/inc0", Outcome: Ok, End: at(1)})
	h.add(Op{Kind: "inc", Key: "C/inc0", Outcome: Ok, End: at(2)})
	for _, c := range []struct {
		key  string
		s    float64
		want int64
	}{
		{"C/cas0", 0.5, 0}, {"C/cas0", 1, 1}, {"C/cas0", 2.9, 1}, {"C/cas0", 3, 4}, {"C/cas0", 10, 4},
		{"C/inc0", 1.5, 1}, {"C/inc0", 2, 2}, {"C/other", 5, 0},
	} {
		if got := h.floorBefore(c.key, at(c.s)); got != c.want {
			t.Errorf("floor of %s at %.1f s: %d, want %d", c.key, c.s, got, c.want)
		}
	}
}

// TestBankFloorBefore: a bank's SCN floor rises with acknowledged
// transfers and fresh reads of its accounts, from when each ended (or
// the last rise's moment, if later), and never with a transfer of
// unknown outcome, a stale read, or another bank's.
func TestBankFloorBefore(t *testing.T) {
	t0 := time.Now()
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	h := newHistory()
	h.add(Op{Kind: "transfer", Key: "bank0/r-1-1", SCN: "1:5", Outcome: Ok, End: at(1)})
	h.add(Op{Kind: "bank-read", Key: "bank0", SCN: "1:9", Outcome: Ok, End: at(3)})
	h.add(Op{Kind: "transfer", Key: "bank0/r-1-2", SCN: "1:7", Outcome: Ok, End: at(2)})   // lower: nothing
	h.add(Op{Kind: "transfer", Key: "bank0/r-1-3", SCN: "2:1", Outcome: Ok, End: at(2.5)}) // late: from 3 s on
	h.add(Op{Kind: "transfer", Key: "bank0/r-1-4", SCN: "2:8", Outcome: Maybe, End: at(4)})
	h.add(Op{Kind: "stale-bank-read", Key: "bank0", SCN: "2:6", Outcome: Ok, End: at(4)})
	h.add(Op{Kind: "transfer", Key: "bank1/r-1-5", SCN: "3:1", Outcome: Ok, End: at(1)})
	for _, c := range []struct {
		bank string
		s    float64
		want string
	}{
		{"bank0", 0.5, "0:0"}, {"bank0", 1, "1:5"}, {"bank0", 2.9, "1:5"}, {"bank0", 3, "2:1"}, {"bank0", 10, "2:1"},
		{"bank1", 1, "3:1"}, {"bank2", 5, "0:0"},
	} {
		if got := h.bankFloorBefore(c.bank, at(c.s)).String(); got != c.want {
			t.Errorf("floor of %s at %.1f s: %s, want %s", c.bank, c.s, got, c.want)
		}
	}
}

package jepsen

import (
	"testing"
	"time"
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

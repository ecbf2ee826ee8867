package node

import (
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/storage"
)

// TestFreshMarks: a replica reaching a master's head named in an
// acknowledgement's answer holds all the master had when that
// acknowledgement was sent — the newest such time of the marks it passed;
// when the marks are full the newest is replaced, so the oldest are
// reached first and none is ever dated later than it was sent.
func TestFreshMarks(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	scn := func(seq uint64) storage.SCN { return storage.SCN{Gen: 1, Seq: seq} }
	var f freshMarks
	if _, ok := f.reached(scn(100)); ok {
		t.Fatal("no marks, yet one reached")
	}
	f.add(at(1), scn(10))
	f.add(at(2), scn(20))
	f.add(at(3), scn(30))
	if _, ok := f.reached(scn(9)); ok {
		t.Fatal("reached a head it does not hold")
	}
	if got, ok := f.reached(scn(25)); !ok || !got.Equal(at(2)) {
		t.Fatalf("at 1:25: %v %v, want the mark sent at 2 s", got, ok)
	}
	if _, ok := f.reached(scn(25)); ok {
		t.Fatal("a mark reached twice")
	}
	// Full: the newest is replaced by what comes.
	f.add(at(4), scn(40))
	f.add(at(5), scn(50))
	f.add(at(6), scn(60))
	f.add(at(7), scn(70))
	if f.n != len(f.marks) {
		t.Fatalf("%d marks, want %d", f.n, len(f.marks))
	}
	if got, ok := f.reached(scn(50)); !ok || !got.Equal(at(5)) {
		t.Fatalf("at 1:50: %v %v, want the mark sent at 5 s", got, ok)
	}
	if got, ok := f.reached(scn(1000)); !ok || !got.Equal(at(7)) {
		t.Fatalf("at 1:1000: %v %v, want the mark sent at 7 s (6 s was replaced)", got, ok)
	}
	f.add(at(8), scn(80))
	f.clear()
	if _, ok := f.reached(scn(1000)); ok {
		t.Fatal("a cleared mark reached")
	}
}

package node

import (
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/storage"
)

// TestSnapshotPins: the oldest live pin is what a partition keeps; an
// ended pin lasts until its time; a partition's pins stay bounded however
// many snapshots end within the grace, by dropping the ended ones that
// expire first, never one still streaming.
func TestSnapshotPins(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	scn := func(seq uint64) storage.SCN { return storage.SCN{Gen: 1, Seq: seq} }
	k, other := partitionKey{"d", 0}, partitionKey{"d", 1}
	var s snapshotPins
	if _, ok := s.oldest(k, t0); ok {
		t.Fatal("a pin with none taken")
	}
	streaming := s.add(k, scn(10), t0)
	ended := s.add(k, scn(5), t0)
	s.add(other, scn(1), t0)
	if got, ok := s.oldest(k, t0); !ok || got != scn(5) {
		t.Fatalf("oldest: %s %v, want 1:5", got, ok)
	}
	s.release(ended, t0.Add(time.Minute))
	if got, _ := s.oldest(k, t0.Add(59*time.Second)); got != scn(5) {
		t.Fatalf("within its grace: %s, want 1:5", got)
	}
	if got, _ := s.oldest(k, t0.Add(time.Minute)); got != scn(10) {
		t.Fatalf("past its grace: %s, want the streaming one's 1:10", got)
	}
	// Snapshots ending one after another, each pinning less than the
	// streaming one.
	for i := range 10 * maxPinsPerPartition {
		p := s.add(k, scn(uint64(9-i%9)), t0)
		s.release(p, t0.Add(time.Hour+time.Duration(i)*time.Second))
		if n := len(s.pins[k]); n > maxPinsPerPartition {
			t.Fatalf("%d pins after %d snapshots, bound %d", n, i+1, maxPinsPerPartition)
		}
	}
	if got, _ := s.oldest(k, t0.Add(2*time.Hour)); got != scn(10) {
		t.Fatalf("once the ended ones expired: %s, want the streaming one's 1:10", got)
	}
	s.release(streaming, t0)
	if _, ok := s.oldest(k, t0.Add(2*time.Hour)); ok || len(s.pins[k]) != 0 {
		t.Fatalf("all ended and expired, yet %d pins", len(s.pins[k]))
	}
	if got, ok := s.oldest(other, t0); !ok || got != scn(1) {
		t.Fatalf("another partition's pin: %s %v, want 1:1", got, ok)
	}
	// A partition no pass asks for again (moved away) loses its pins
	// once they expire.
	s.release(s.pins[other][0], t0)
	s.prune(t0)
	if len(s.pins) != 0 {
		t.Fatalf("pruned, yet pins of %d partitions", len(s.pins))
	}
}

package storage

import (
	"slices"
	"testing"
)

// TestHistoryOutlivesADropAndARestart: a copy dropped (Engine.Drop), then
// rebuilt from a snapshot of a master whose log was trimmed, keeps the
// whole generation history the snapshot brought, across a restart. The
// history once lived on only until the next restart there: the drop
// deleted the mark that says the history is kept, so the restart built
// it again from the retained log, which holds only the last generation,
// and the replica then took every older position for another timeline
// (as a master, it told its slaves to undo everything: "diverged after
// 0:0").
func TestHistoryOutlivesADropAndARestart(t *testing.T) {
	me := open(t, t.TempDir())
	defer me.Close()
	m, _ := me.Partition("db", 0)
	for gen := uint32(1); gen <= 3; gen++ {
		if err := m.StartGeneration(gen); err != nil {
			t.Fatal(err)
		}
		put(t, m, "k", "v")
	}
	// The master's log keeps only generation 3's last commit.
	m.Acknowledged(m.SCN())
	if _, err := m.Trim(SCN{Gen: 3, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	want := []SCN{{1, 2}, {2, 2}, {3, 2}}
	if got := m.History(); !slices.Equal(got, want) {
		t.Fatalf("master's history %v, want %v", got, want)
	}

	dir := t.TempDir()
	se := open(t, dir)
	s, _ := se.Partition("db", 0)
	rebuildFrom(t, m, s)
	if _, err := se.Drop("db", 0); err != nil {
		t.Fatal(err)
	}
	rebuildFrom(t, m, s) // a replica of it again
	if got := s.History(); !slices.Equal(got, want) {
		t.Fatalf("after the rebuild: history %v, want %v", got, want)
	}
	se.Close()
	se = open(t, dir)
	defer se.Close()
	s, _ = se.Partition("db", 0)
	if got := s.History(); !slices.Equal(got, want) {
		t.Fatalf("after a restart: history %v, want %v", got, want)
	}
	if !s.OnTimeline(SCN{Gen: 1, Seq: 2}) || s.LastOnTimelineBefore(SCN{Gen: 2, Seq: 5}) != (SCN{Gen: 2, Seq: 2}) {
		t.Fatalf("after a restart: 1:2 on the timeline %v, the last before 2:5 %s", s.OnTimeline(SCN{Gen: 1, Seq: 2}), s.LastOnTimelineBefore(SCN{Gen: 2, Seq: 5}))
	}
}

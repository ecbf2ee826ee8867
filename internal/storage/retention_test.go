package storage

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cortado-db/cortado/internal/keys"
)

// twoGenerations commits 5 writes in generation 1, then opens generation
// 3 (its marker, 3:1) and commits 3 writes in it.
func twoGenerations(t *testing.T, p *Partition) {
	t.Helper()
	for i := range 5 {
		put(t, p, fmt.Sprint("k", i), "v")
	}
	if err := p.StartGeneration(3); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		put(t, p, fmt.Sprint("k", i), "w")
	}
}

func TestTimelineOutlivesTrimmedLog(t *testing.T) {
	dir := t.TempDir()
	e := open(t, dir)
	p, _ := e.Partition("db", 1)
	twoGenerations(t, p)
	want := []SCN{{1, 5}, {3, 4}}
	if h := p.History(); !slices.Equal(h, want) {
		t.Fatalf("history %v, want %v", h, want)
	}
	p.Acknowledged(SCN{3, 2})
	if _, err := p.Trim(SCN{3, 3}); !errors.Is(err, ErrTruncateAcknowledged) {
		t.Fatalf("trim past the acknowledged watermark: %v", err)
	}
	before := p.LogBytes()
	freed, err := p.Trim(SCN{1, 5})
	if err != nil || freed <= 0 || p.LogBytes() != before-freed {
		t.Fatalf("trim: freed %d of %d, now %d, %v", freed, before, p.LogBytes(), err)
	}
	check := func(p *Partition) {
		t.Helper()
		if p.LogStart() != (SCN{1, 5}) {
			t.Fatalf("log start %s", p.LogStart())
		}
		var logged []SCN
		p.ReadLog(SCN{}, func(c Commit) bool { logged = append(logged, c.SCN); return true })
		if !slices.Equal(logged, []SCN{{3, 1}, {3, 2}, {3, 3}, {3, 4}}) {
			t.Fatalf("log after trim: %v", logged)
		}
		for scn, on := range map[SCN]bool{{1, 3}: true, {1, 5}: true, {1, 6}: false, {2, 1}: false, {3, 4}: true, {3, 5}: false, {0, 0}: true} {
			if p.OnTimeline(scn) != on {
				t.Fatalf("OnTimeline(%s) = %v", scn, !on)
			}
		}
		for asked, common := range map[SCN]SCN{{1, 7}: {1, 5}, {2, 5}: {1, 5}, {3, 9}: {3, 4}, {4, 1}: {3, 4}, {1, 1}: {}} {
			if got := p.LastOnTimelineBefore(asked); got != common {
				t.Fatalf("LastOnTimelineBefore(%s) = %s, want %s", asked, got, common)
			}
		}
	}
	check(p)
	e.Close()
	e = open(t, dir)
	defer e.Close()
	p, _ = e.Partition("db", 1)
	check(p)
	if p.LogBytes() != before-freed {
		t.Fatalf("log bytes after restart %d, want %d", p.LogBytes(), before-freed)
	}
	// Truncating a generation away drops it from the history.
	if _, err := p.TruncateAfter(SCN{3, 2}); err != nil {
		t.Fatal(err)
	}
	put(t, p, "x", "y")
	p.StartGeneration(4)
	put(t, p, "x", "z")
	if h := p.History(); !slices.Equal(h, []SCN{{1, 5}, {3, 3}, {4, 2}}) {
		t.Fatalf("history after truncation and a new generation: %v", h)
	}
}

func TestTrimPoint(t *testing.T) {
	p := solo(t, 1)
	for i := range 10 {
		put(t, p, fmt.Sprint("k", i), "0123456789")
	}
	p.Acknowledged(SCN{1, 8})
	now := time.Now()
	cases := []struct {
		name string
		o    RetentionPolicy
		want SCN
	}{
		{"nothing set", RetentionPolicy{}, SCN{}},
		{"age: everything old, capped at acknowledged", RetentionPolicy{MaxAge: time.Minute, Now: now.Add(time.Hour)}, SCN{1, 8}},
		{"age: nothing old", RetentionPolicy{MaxAge: time.Hour, Now: now}, SCN{}},
		{"size: a live slave pins", RetentionPolicy{MaxBytes: 1, Keep: SCN{1, 3}}, SCN{1, 3}},
		{"size: under the limit", RetentionPolicy{MaxBytes: 1 << 20}, SCN{}},
	}
	for _, c := range cases {
		if got, err := p.TrimPoint(c.o); err != nil || got != c.want {
			t.Errorf("%s: trim point %s (%v), want %s", c.name, got, err, c.want)
		}
	}
	// Size: keep about half of the log.
	half := p.LogBytes() / 2
	point, _ := p.TrimPoint(RetentionPolicy{MaxBytes: half})
	if _, err := p.Trim(point); err != nil {
		t.Fatal(err)
	}
	if p.LogBytes() > half || point.Seq < 4 || point.Seq > 6 {
		t.Fatalf("size trim to %s left %d bytes, limit %d", point, p.LogBytes(), half)
	}
}

func TestSnapshotInstall(t *testing.T) {
	m, s := pair(t, 1)
	twoGenerations(t, m)
	if _, err := m.Update(func(tx *Tx) error {
		n, err := tx.NextAutoIncrement("A", nil, math.MaxInt64)
		if err != nil {
			return err
		}
		_, err = tx.Put("A", []keys.Part{keys.I(n)}, 1, []byte("auto"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	m.Acknowledged(SCN{3, 2})
	snap, err := m.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Later commits are not in the snapshot.
	put(t, m, "later", "x")

	put(t, s, "stale", "x") // replaced
	in, err := s.BeginInstall()
	if err != nil {
		t.Fatal(err)
	}
	if err := snap.Rows(func(r Row) error { return in.Row(r) }); err != nil {
		t.Fatal(err)
	}
	marks, err := snap.Marks()
	if err != nil || len(marks) != 1 {
		t.Fatalf("marks %v %v", marks, err)
	}
	n, err := in.Finish(snap.SCN, snap.History, snap.Acked, marks)
	if err != nil || n != 6 {
		t.Fatalf("installed %d rows: %v", n, err)
	}
	snap.Close()
	if s.SCN() != (SCN{3, 5}) || s.LogStart() != (SCN{3, 5}) || !slices.Equal(s.History(), []SCN{{1, 5}, {3, 5}}) {
		t.Fatalf("installed at %s, log start %s, history %v", s.SCN(), s.LogStart(), s.History())
	}
	// It follows the master from there on, and ends equal to it.
	m.ReadLog(SCN{3, 5}, func(c Commit) bool {
		if err := s.Apply(c); err != nil {
			t.Fatal(err)
		}
		return true
	})
	ms, mt, _ := m.Checksum()
	ss, st, _ := s.Checksum()
	if ms != ss || mt != st {
		t.Fatalf("master %s %x, rebuilt replica %s %x", ms, mt, ss, st)
	}
	// It cannot undo what it never held the log of.
	if _, err := s.TruncateAfter(SCN{3, 3}); !errors.Is(err, ErrTrimmed) {
		t.Fatalf("truncating before the installed snapshot: %v", err)
	}
}

func TestInterruptedInstallLeavesEmpty(t *testing.T) {
	dir := t.TempDir()
	e := open(t, dir)
	p, _ := e.Partition("db", 1)
	put(t, p, "a", "1")
	in, err := p.BeginInstall()
	if err != nil {
		t.Fatal(err)
	}
	in.Row(Row{Table: "T", Key: keys.Encode([]keys.Part{keys.S("b")}), Value: encodeRow(nil, &Doc{Version: 1, Value: []byte("2")})})
	in.Abort()
	e.Close()
	e = open(t, dir)
	defer e.Close()
	p, _ = e.Partition("db", 1)
	if p.SCN() != (SCN{}) || rows(t, p) != "" {
		t.Fatalf("after an interrupted install: scn %s, rows %q", p.SCN(), rows(t, p))
	}
}

// TestTrimPointByAgeAcrossEpochs: by age, the trim point is the last
// commit older than the cutoff, wherever the cutoff falls among the
// epochs the log spans; the commits of epochs a later epoch's first
// commit shows to be old are not read (their values here are emptied,
// which would read as young).
func TestTrimPointByAgeAcrossEpochs(t *testing.T) {
	e := open(t, t.TempDir())
	defer e.Close()
	p, _ := e.Partition("db", 0)
	scns := putInEpochs(t, e, 4, 5, p)[0]
	p.Acknowledged(scns[18])
	times := make([]time.Time, len(scns))
	for i, scn := range scns {
		at, ok, err := p.CommitTime(scn)
		if err != nil || !ok {
			t.Fatalf("CommitTime(%s): %v %v", scn, ok, err)
		}
		times[i] = at
	}
	es := epochsOf(t, p)
	// Empty the values of every commit but the epochs' first ones of the
	// first three epochs.
	b := e.db.NewBatch()
	for i, scn := range scns[:15] {
		if i%5 != 0 {
			b.Set(keys.Log(es[i/5].epoch, p.DB, p.ID, scn.Gen, scn.Seq), nil, nil)
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	for i := range scns {
		if i%5 != 0 && i < 15 {
			continue // a cutoff inside an emptied epoch reads its values
		}
		want := SCN{}
		for j := range scns[:19] { // capped at the acknowledged scns[18]
			if !times[j].After(times[i]) {
				want = scns[j]
			}
		}
		// Commits a second ago or more are old: those up to times[i].
		o := RetentionPolicy{MaxAge: time.Second, Now: times[i].Add(time.Second + 1)}
		if got, err := p.TrimPoint(o); err != nil || got != want {
			t.Fatalf("cutoff after commit %d (%s): trim point %s (%v), want %s", i, scns[i], got, err, want)
		}
	}
}

// TestTrimPointByAgeAcrossGenerations: within an epoch whose commits are
// of two generations (sequence numbers start again), the trim point by
// age is still the last commit older than the cutoff.
func TestTrimPointByAgeAcrossGenerations(t *testing.T) {
	e := open(t, t.TempDir())
	defer e.Close()
	p, _ := e.Partition("db", 0)
	scns := putInEpochs(t, e, 1, 4, p)[0]
	if err := p.StartGeneration(2); err != nil {
		t.Fatal(err)
	}
	scns = append(scns, putInEpochs(t, e, 1, 4, p)[0]...)
	p.Acknowledged(p.SCN())
	for _, scn := range scns {
		at, ok, err := p.CommitTime(scn)
		if err != nil || !ok {
			t.Fatalf("CommitTime(%s): %v %v", scn, ok, err)
		}
		o := RetentionPolicy{MaxAge: time.Second, Now: at.Add(time.Second + 1)}
		if got, err := p.TrimPoint(o); err != nil || got != scn {
			t.Fatalf("cutoff after %s: trim point %s (%v)", scn, got, err)
		}
	}
}

// TestReadLogFailsWhenATrimPassesIt: a read of the stored log that a trim
// passes before it ends fails with ErrTrimmed (what it handed on may
// follow a gap); a read from before the log's start reads from the start.
func TestReadLogFailsWhenATrimPassesIt(t *testing.T) {
	dir := t.TempDir()
	e := open(t, dir)
	p, _ := e.Partition("db", 0)
	scns := putInEpochs(t, e, 1, 10, p)[0]
	p.Acknowledged(scns[9])
	// Reopened, the log's tail in memory is empty: reads go to Pebble.
	e.Close()
	e = open(t, dir)
	defer e.Close()
	p, _ = e.Partition("db", 0)
	p.Acknowledged(scns[9])
	trimmed := false
	err := p.ReadLog(scns[1], func(c Commit) bool {
		if !trimmed {
			trimmed = true
			if _, err := p.Trim(scns[4]); err != nil {
				t.Fatal(err)
			}
		}
		return true
	})
	if !errors.Is(err, ErrTrimmed) {
		t.Fatalf("a read a trim passed: %v, want ErrTrimmed", err)
	}
	var got []SCN
	if err := p.ReadLog(scns[1], func(c Commit) bool { got = append(got, c.SCN); return true }); err != nil || !slices.Equal(got, scns[5:]) {
		t.Fatalf("a read from before the log's start: %v (%v), want %v", got, err, scns[5:])
	}
}

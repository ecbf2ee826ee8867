package storage

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cortado-db/cortado/internal/keys"
)

var convergeSeeds = flag.Int("converge.seeds", 12, "how many random histories TestRandomTimelinesConverge runs")

// TestRandomTimelinesConverge drives four replicas of one indexed
// partition through random histories of failovers, as the cluster does:
// a master commits random transactions (puts of indexed and unindexed
// versions, deletes, whole-collection deletes, auto-increment inserts);
// each slave applies a random prefix of them; the slave furthest along
// becomes master of the next generation; every other replica truncates
// what the new timeline lacks (undoing it with the pre-images) and
// follows; now and then a slave is rebuilt from the master's snapshot
// instead. At every failover and at the end, each replica at the
// master's SCN must have the master's sums (rows, tables, marks, index)
// and its rows byte for byte, and a replica built by applying the
// master's log from empty must too. A difference here is what the
// consistency check calls "differs".
func TestRandomTimelinesConverge(t *testing.T) {
	seeds := *convergeSeeds
	if testing.Short() {
		seeds = min(seeds, 3)
	}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { convergeRun(t, seed) })
	}
}

func convergeRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	reps := make([]*Partition, 4)
	for i := range reps {
		reps[i] = openIndexed(t)
	}
	master, gen := 0, uint32(1)
	if err := reps[master].StartGeneration(gen); err != nil {
		t.Fatal(err)
	}
	var trace strings.Builder // what happened, for a failure's message
	for round := range 8 {
		m := reps[master]
		for range 5 + rng.IntN(20) {
			if _, err := m.Update(func(tx *Tx) error { return randomTx(rng, tx) }); err != nil {
				t.Fatalf("round %d: %v\n%s", round, err, trace.String())
			}
		}
		fmt.Fprintf(&trace, "round %d: master %d at %s\n", round, master, m.SCN())
		// Each slave gets a random prefix of the master's log, or is
		// rebuilt from its snapshot.
		for i, r := range reps {
			if i == master {
				continue
			}
			if !follow(t, m, r, &trace) {
				continue
			}
			if rng.IntN(6) == 0 {
				rebuildFrom(t, m, r)
				fmt.Fprintf(&trace, "  %d rebuilt at %s\n", i, r.SCN())
				continue
			}
			commits := logAfter(t, m, r.SCN())
			n := rng.IntN(len(commits) + 1)
			if err := r.ApplyAll(commits[:n]); err != nil {
				t.Fatalf("replica %d applies %d commits after %s: %v\n%s", i, n, r.SCN(), err, trace.String())
			}
			fmt.Fprintf(&trace, "  %d at %s\n", i, r.SCN())
		}
		// The master's own state, and each replica's where it stands
		// at the master's SCN.
		assertConverged(t, reps, master, &trace, false)
		// A failover: the replica furthest along becomes master (the
		// old one, on the way out, is not a candidate).
		next := -1
		for i, r := range reps {
			if i != master && (next < 0 || reps[next].SCN().Less(r.SCN())) {
				next = i
			}
		}
		gen++
		if err := reps[next].StartGeneration(gen); err != nil {
			t.Fatal(err)
		}
		master = next
		fmt.Fprintf(&trace, "failover: %d masters generation %d\n", master, gen)
	}
	m := reps[master]
	for range 10 {
		if _, err := m.Update(func(tx *Tx) error { return randomTx(rng, tx) }); err != nil {
			t.Fatal(err)
		}
	}
	for i, r := range reps {
		if i != master && follow(t, m, r, &trace) {
			if err := r.ApplyAll(logAfter(t, m, r.SCN())); err != nil {
				t.Fatal(err)
			}
		}
	}
	assertConverged(t, reps, master, &trace, true)
	// A replica that applies the master's whole log from empty ends the
	// same, if the master holds it all (it was not rebuilt itself).
	if m.LogStart().IsZero() {
		fresh := openIndexed(t)
		if err := fresh.ApplyAll(logAfter(t, m, SCN{})); err != nil {
			t.Fatal(err)
		}
		assertSame(t, m, fresh, "replayed from empty", &trace)
	}
}

// follow brings r onto m's timeline as a slave does by m's answers
// (node.Node.Log): truncated to the newest SCN both hold when m says its
// position diverged, rebuilt from m's snapshot when m's log no longer
// reaches there. It reports whether r can now apply m's log after its SCN.
func follow(t *testing.T, m, r *Partition, trace *strings.Builder) bool {
	t.Helper()
	at := r.SCN()
	if m.OnTimeline(at) {
		if at.Less(m.LogStart()) {
			rebuildFrom(t, m, r)
			fmt.Fprintf(trace, "  rebuilt at %s: the log starts after %s\n", r.SCN(), at)
			return false
		}
		return true
	}
	keep := m.LastOnTimelineBefore(at)
	undone, err := r.TruncateAfter(keep)
	if err != nil {
		rebuildFrom(t, m, r)
		fmt.Fprintf(trace, "  rebuilt at %s instead of truncating %s to %s: %v\n", r.SCN(), at, keep, err)
		return false
	}
	fmt.Fprintf(trace, "  truncated %s to %s (%d events undone)\n", at, keep, undone)
	return true
}

// rebuildFrom replaces r's contents with a snapshot of m.
func rebuildFrom(t *testing.T, m, r *Partition) {
	t.Helper()
	snap, err := m.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	in, err := r.BeginInstall()
	if err != nil {
		t.Fatal(err)
	}
	if err := snap.Rows(func(row Row) error { return in.Row(row) }); err != nil {
		t.Fatal(err)
	}
	marks, err := snap.Marks()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.Finish(snap.SCN, snap.History, snap.Acked, marks); err != nil {
		t.Fatal(err)
	}
}

// logAfter returns m's commits after scn.
func logAfter(t *testing.T, m *Partition, scn SCN) []Commit {
	t.Helper()
	var out []Commit
	if err := m.ReadLog(scn, func(c Commit) bool {
		out = append(out, c)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// assertConverged checks every replica that stands at the master's SCN
// (all of them, with all) against the master.
func assertConverged(t *testing.T, reps []*Partition, master int, trace *strings.Builder, all bool) {
	t.Helper()
	for i, r := range reps {
		if i == master || (!all && r.SCN() != reps[master].SCN()) {
			continue
		}
		assertSame(t, reps[master], r, fmt.Sprintf("replica %d", i), trace)
	}
}

func assertSame(t *testing.T, m, r *Partition, who string, trace *strings.Builder) {
	t.Helper()
	ms, err := m.Sums()
	if err != nil {
		t.Fatal(err)
	}
	rs, err := r.Sums()
	if err != nil {
		t.Fatal(err)
	}
	if ms.SCN != rs.SCN || ms.Total != rs.Total || fmt.Sprint(ms.Tables) != fmt.Sprint(rs.Tables) {
		t.Fatalf("%s at %s differs from the master at %s:\n%v\n%v\nrows:\n%s\nmaster's:\n%s\n%s",
			who, rs.SCN, ms.SCN, rs.Tables, ms.Tables, sectionDump(t, r, keys.SectionData), sectionDump(t, m, keys.SectionData), trace.String())
	}
	if a, b := sectionDump(t, r, keys.SectionData), sectionDump(t, m, keys.SectionData); a != b {
		t.Fatalf("%s's rows differ from the master's at %s:\n%s\nmaster's:\n%s\n%s", who, ms.SCN, a, b, trace.String())
	}
}

// randomTx writes one to four random changes to tables T (indexed by
// wordIndexer at version 1) and U, in collections a, b and c.
func randomTx(rng *rand.Rand, tx *Tx) error {
	words := []string{"alpha", "beta", "gamma", "delta", "beta", "omega"}
	text := func() string {
		n := 1 + rng.IntN(5)
		var w []string
		for range n {
			w = append(w, words[rng.IntN(len(words))])
		}
		return strings.Join(w, " ")
	}
	coll := func() keys.Part { return keys.S(string(rune('a' + rng.IntN(3)))) }
	for range 1 + rng.IntN(4) {
		switch k := rng.IntN(10); {
		case k < 5:
			if _, err := tx.Put("T", []keys.Part{coll(), keys.I(int64(rng.IntN(8)))}, 1+rng.IntN(4)/3, []byte(text())); err != nil {
				return err
			}
		case k < 6:
			if _, err := tx.Put("U", []keys.Part{coll(), keys.I(int64(rng.IntN(4)))}, 1, []byte(text())); err != nil {
				return err
			}
		case k < 8:
			if _, err := tx.Delete("T", []keys.Part{coll(), keys.I(int64(rng.IntN(8)))}); err != nil {
				return err
			}
		case k < 9:
			if _, err := tx.DeleteCollection("T", []keys.Part{coll()}, rng.IntN(2) == 0); err != nil {
				return err
			}
		default:
			c := coll()
			n, err := tx.NextAutoIncrement("T", []keys.Part{c}, math.MaxInt64)
			if err != nil {
				return err
			}
			if _, err := tx.Put("T", []keys.Part{c, keys.I(n)}, 1, []byte(text())); err != nil {
				return err
			}
		}
	}
	return nil
}

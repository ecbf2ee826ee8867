package storage

import (
	"fmt"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cortado-db/cortado/internal/keys"
)

// storedSCNs reads the partition's whole stored log after from, through
// the epochs it records.
func storedSCNs(t *testing.T, p *Partition, from SCN) []SCN {
	t.Helper()
	var got []SCN
	if err := p.readStoredLog(from, maxSCN, func(c Commit) bool {
		got = append(got, c.SCN)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// rawLog lists every key of the log space that belongs to partition p,
// epoch by epoch, without the records of its epochs: what is really
// stored.
func rawLog(t *testing.T, p *Partition) []string {
	t.Helper()
	it, err := p.e.db.NewIter(&pebble.IterOptions{LowerBound: []byte{keys.LogSpace}, UpperBound: []byte{keys.LogSpace + 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	var out []string
	for valid := it.First(); valid; valid = it.Next() {
		epoch, err := keys.ParseLogEpoch(it.Key())
		if err != nil {
			t.Fatal(err)
		}
		prefix := keys.LogPrefix(epoch, p.DB, p.ID)
		if len(it.Key()) != len(prefix)+12 || string(it.Key()[:len(prefix)]) != string(prefix) {
			continue // another partition's
		}
		gen, seq, err := keys.ParseLog(it.Key(), len(prefix))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%d %s", epoch, SCN{gen, seq}))
	}
	return out
}

// epochsOf returns the partition's records of its epochs, checking that
// the one it keeps in memory is the last.
func epochsOf(t *testing.T, p *Partition) []logEpoch {
	t.Helper()
	es, err := p.epochs(SCN{}, maxSCN)
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.logAt.wrote != (len(es) > 0) || len(es) > 0 && p.logAt.epoch != es[len(es)-1].epoch {
		t.Fatalf("the partition's last epoch is %+v, its records %v", p.logAt, es)
	}
	return es
}

// flush ends the engine's log epoch: the next commit of every partition
// goes to a new one.
func flush(t *testing.T, e *Engine) {
	t.Helper()
	before := e.logEpoch.Load()
	if err := e.db.Flush(); err != nil {
		t.Fatal(err)
	}
	if e.logEpoch.Load() <= before {
		t.Fatalf("a flush left the log epoch at %d", e.logEpoch.Load())
	}
}

// putInEpochs commits n writes to each of parts in each of rounds
// epochs (a flush between two rounds) and returns each partition's SCNs.
func putInEpochs(t *testing.T, e *Engine, rounds, n int, parts ...*Partition) [][]SCN {
	t.Helper()
	scns := make([][]SCN, len(parts))
	for round := range rounds {
		if round > 0 {
			flush(t, e)
		}
		for i := range n {
			for j, p := range parts {
				scns[j] = append(scns[j], put(t, p, fmt.Sprint("k", i), fmt.Sprint(round)))
			}
		}
	}
	return scns
}

// TestLogAcrossEpochs: a partition's log spread over the epochs of
// several flushes and a restart reads as one, from any SCN; a trim, a
// truncation and a wipe remove exactly their entries from every epoch,
// and the records of the epochs they empty; another partition's log in
// the same epochs is untouched.
func TestLogAcrossEpochs(t *testing.T) {
	dir := t.TempDir()
	e := open(t, dir)
	p, err := e.Partition("db", 0)
	if err != nil {
		t.Fatal(err)
	}
	other, err := e.Partition("db", 1)
	if err != nil {
		t.Fatal(err)
	}
	all := putInEpochs(t, e, 3, 10, p, other)[0]
	es := epochsOf(t, p)
	if len(es) != 3 || es[0].first != all[0] || es[1].first != all[10] || es[2].first != all[20] {
		t.Fatalf("epochs %v, want three starting at %s, %s, %s", es, all[0], all[10], all[20])
	}
	for i, from := range append([]SCN{{}}, all...) {
		if got := storedSCNs(t, p, from); !slices.Equal(got, all[i:]) {
			t.Fatalf("the stored log after %s: %v, want %v", from, got, all[i:])
		}
	}
	for _, scn := range []SCN{all[0], all[9], all[10], all[29]} {
		if _, ok, err := p.CommitTime(scn); err != nil || !ok {
			t.Fatalf("CommitTime(%s): %v, %v", scn, ok, err)
		}
	}
	otherLog := rawLog(t, other)

	// A restart: the engine's epoch is past every stored one, and the
	// partition goes on where it was.
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open(t, dir)
	defer func() { e.Close() }()
	p, _ = e.Partition("db", 0)
	other, _ = e.Partition("db", 1)
	if p.SCN() != all[29] || !slices.Equal(epochsOf(t, p), es) {
		t.Fatalf("reopened at %s with epochs %v, want %s and %v", p.SCN(), epochsOf(t, p), all[29], es)
	}
	if e.logEpoch.Load() <= es[2].epoch {
		t.Fatalf("reopened in epoch %d, not after the stored %d", e.logEpoch.Load(), es[2].epoch)
	}
	all = append(all, put(t, p, "k0", "3"))
	if got := storedSCNs(t, p, SCN{}); !slices.Equal(got, all) {
		t.Fatalf("after a restart the log holds %v, want %v", got, all)
	}
	before := p.LogBytes()

	// A trim through the 15th commit: the first epoch is empty and its
	// record goes.
	p.Acknowledged(all[30])
	freed, err := p.Trim(all[14])
	if err != nil {
		t.Fatal(err)
	}
	if got := storedSCNs(t, p, p.LogStart()); !slices.Equal(got, all[15:]) {
		t.Fatalf("after the trim the log holds %v, want %v", got, all[15:])
	}
	if n := len(rawLog(t, p)); n != len(all)-15 {
		t.Fatalf("after the trim %d entries are stored, want %d", n, len(all)-15)
	}
	if es := epochsOf(t, p); len(es) != 3 || es[0].first != all[10] {
		t.Fatalf("after the trim the epochs are %v", es)
	}
	if p.LogBytes() != before-freed || freed <= 0 {
		t.Fatalf("the trim freed %d bytes, and the log went from %d to %d", freed, before, p.LogBytes())
	}

	// A truncation after the 25th commit: the epoch of the restart is
	// empty and goes too.
	p.mu.Lock()
	p.acked = all[24] // as a replica that never learnt of later acknowledgements
	p.mu.Unlock()
	if _, err := p.TruncateAfter(all[24]); err != nil {
		t.Fatal(err)
	}
	if got := storedSCNs(t, p, p.LogStart()); !slices.Equal(got, all[15:25]) {
		t.Fatalf("after the truncation the log holds %v, want %v", got, all[15:25])
	}
	if n := len(rawLog(t, p)); n != 10 {
		t.Fatalf("after the truncation %d entries are stored, want 10", n)
	}
	if es := epochsOf(t, p); len(es) != 2 {
		t.Fatalf("after the truncation the epochs are %v", es)
	}
	next := put(t, p, "k9", "4")
	if got := storedSCNs(t, p, all[20]); !slices.Equal(got, append(slices.Clone(all[21:25]), next)) {
		t.Fatalf("a commit after the truncation: the log after %s holds %v", all[20], got)
	}

	// A wipe (a rebuild from a snapshot) empties every epoch.
	in, err := p.BeginInstall()
	if err != nil {
		t.Fatal(err)
	}
	in.Abort()
	if got := rawLog(t, p); len(got) != 0 || len(epochsOf(t, p)) != 0 {
		t.Fatalf("after a wipe the log holds %v in epochs %v", got, epochsOf(t, p))
	}
	if got := rawLog(t, other); !slices.Equal(got, otherLog) {
		t.Fatalf("the other partition's log changed: %v, want %v", got, otherLog)
	}
}

// TestLegacyLogMovesToTheLogSpace: a log stored inside the partition's
// range, as before the log space, moves to epoch 0 when the partition is
// opened, including one whose move a crash interrupted; it reads as it
// did, and new commits follow it.
func TestLegacyLogMovesToTheLogSpace(t *testing.T) {
	for _, moved := range []int{0, 4} {
		t.Run(fmt.Sprint(moved, " moved before"), func(t *testing.T) {
			dir := t.TempDir()
			e := open(t, dir)
			p, _ := e.Partition("db", 3)
			var all []SCN
			for i := range 10 {
				all = append(all, put(t, p, fmt.Sprint("k", i), "v"))
			}
			want := logDump(t, p)
			// Store the log as before the log space, the first `moved`
			// entries already moved to epoch 0.
			b := e.db.NewBatch()
			es := epochsOf(t, p)
			if err := p.scanLog(SCN{}, maxSCN, func(scn SCN, k []byte, lv logValue) (bool, error) {
				v, err := lv.Read()
				if err != nil {
					return false, err
				}
				legacy := legacyLogKey(keys.LegacyLogPrefix(p.DB, p.ID), scn)
				if scn.Seq <= uint64(moved) {
					return true, b.Set(keys.Log(0, p.DB, p.ID, scn.Gen, scn.Seq), v, nil)
				}
				return true, b.Set(legacy, v, nil)
			}); err != nil {
				t.Fatal(err)
			}
			for _, ep := range es {
				if err := b.DeleteRange(keys.LogPrefix(ep.epoch, p.DB, p.ID), keys.PrefixEnd(keys.LogPrefix(ep.epoch, p.DB, p.ID)), nil); err != nil {
					t.Fatal(err)
				}
				if err := b.Delete(epochKey(p.DB, p.ID, ep.first), nil); err != nil {
					t.Fatal(err)
				}
			}
			if moved > 0 {
				if err := b.Set(epochKey(p.DB, p.ID, all[0]), epochValue(0), nil); err != nil {
					t.Fatal(err)
				}
			}
			if err := b.Commit(pebble.Sync); err != nil {
				t.Fatal(err)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}

			e = open(t, dir)
			defer e.Close()
			p, err := e.Partition("db", 3)
			if err != nil {
				t.Fatal(err)
			}
			if p.SCN() != all[9] {
				t.Fatalf("opened at %s, want %s", p.SCN(), all[9])
			}
			if got := logDump(t, p); got != want {
				t.Fatalf("the moved log reads\n%s\nwant\n%s", got, want)
			}
			if got := sectionDump(t, p, keys.SectionLog); got != "" {
				t.Fatalf("the old log section still holds\n%s", got)
			}
			if es := epochsOf(t, p); len(es) != 1 || es[0] != (logEpoch{0, all[0]}) {
				t.Fatalf("the moved log's epochs: %v", es)
			}
			next := put(t, p, "k0", "w")
			if got := storedSCNs(t, p, all[8]); !slices.Equal(got, []SCN{all[9], next}) {
				t.Fatalf("a commit after the move: the log after %s holds %v", all[8], got)
			}
			if es := epochsOf(t, p); len(es) != 2 || es[1].epoch == 0 {
				t.Fatalf("a commit after the move went to the epochs %v", es)
			}
		})
	}
}

// legacyLogKey returns a legacy log key: prefix, generation, sequence.
func legacyLogKey(prefix []byte, scn SCN) []byte {
	return append(append([]byte(nil), prefix...), encodeSCN(scn)...)
}

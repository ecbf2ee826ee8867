package storage

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cortado-db/cortado/internal/keys"
)

// rows returns every document row of a partition, key and stored bytes,
// and the partition's log SCNs.
func rows(t *testing.T, p *Partition) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(sectionDump(t, p, keys.SectionData))
	p.ReadLog(SCN{}, func(c Commit) bool {
		fmt.Fprintf(&b, "log %s\n", c.SCN)
		return true
	})
	return b.String()
}

// sectionDump is every key and value of one section of a partition.
// logDump returns the partition's stored log entries, by SCN.
func logDump(t *testing.T, p *Partition) string {
	t.Helper()
	var b strings.Builder
	if err := p.scanLog(SCN{}, maxSCN, func(scn SCN, _ []byte, lv logValue) (bool, error) {
		v, err := lv.Read()
		fmt.Fprintf(&b, "%s=%x\n", scn, v)
		return true, err
	}); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func sectionDump(t *testing.T, p *Partition, section byte) string {
	t.Helper()
	prefix := append(keys.Partition(p.DB, p.ID), section)
	it, err := p.e.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: keys.PrefixEnd(prefix)})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	var b strings.Builder
	for valid := it.First(); valid; valid = it.Next() {
		fmt.Fprintf(&b, "%x=%x\n", it.Key(), it.Value())
	}
	return b.String()
}

func put(t *testing.T, p *Partition, k string, v string) SCN {
	t.Helper()
	scn, err := p.Update(func(tx *Tx) error {
		_, err := tx.Put("T", []keys.Part{keys.S(k)}, 1, []byte(v))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return scn
}

// replicate applies every commit of from after the follower's SCN.
func replicate(t *testing.T, from, to *Partition) {
	t.Helper()
	last := to.SCN()
	err := from.ReadLog(SCN{}, func(c Commit) bool {
		if !last.Less(c.SCN) {
			return true
		}
		if err := to.Apply(c); err != nil {
			t.Fatal(err)
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestSlaveFollowsMasterTimeline(t *testing.T) {
	m, s := pair(t, 1)
	put(t, m, "a", "1")
	put(t, m, "b", "2")
	put(t, m, "a", "3")           // update
	m.Update(func(tx *Tx) error { // one commit, three events
		tx.Put("T", []keys.Part{keys.S("c")}, 1, []byte("4"))
		tx.Put("U", []keys.Part{keys.S("c")}, 2, []byte("5"))
		_, err := tx.Delete("T", []keys.Part{keys.S("b")})
		return err
	})
	replicate(t, m, s)
	if got, want := rows(t, s), rows(t, m); got != want {
		t.Fatalf("slave differs from master:\nslave\n%s\nmaster\n%s", got, want)
	}
	if s.SCN() != (SCN{1, 4}) {
		t.Fatalf("slave SCN %s", s.SCN())
	}

	// Commits out of order are refused and change nothing.
	before := rows(t, s)
	for _, scn := range []SCN{{1, 4}, {1, 6}, {0, 5}, {2, 2}} {
		if err := s.Apply(Commit{SCN: scn}); !errors.Is(err, ErrTimeline) {
			t.Fatalf("apply %s after 1:4: %v", scn, err)
		}
	}
	if rows(t, s) != before {
		t.Fatal("a refused commit changed the slave")
	}
}

// TestFailoverTruncatesTheOldTimeline: the master commits 1:1..1:6, the
// slave has 1:1..1:3 when the master dies. The slave becomes master in
// generation 2 and commits; the old master comes back, truncates what the
// new timeline does not contain (1:4..1:6), follows generation 2, and ends
// byte-identical to the new master, also after a restart.
func TestFailoverTruncatesTheOldTimeline(t *testing.T) {
	oldDir := t.TempDir()
	oe, ne := open(t, oldDir), open(t, t.TempDir())
	defer ne.Close()
	old, _ := oe.Partition("db", 0)
	next, _ := ne.Partition("db", 0)
	put(t, old, "a", "1")
	put(t, old, "b", "1")
	put(t, old, "a", "2")
	replicate(t, old, next)
	stateAt3 := rows(t, next)
	// Never replicated: an update (1:4), a delete (1:5), an insert (1:6).
	put(t, old, "a", "lost")
	old.Update(func(tx *Tx) error { _, err := tx.Delete("T", []keys.Part{keys.S("b")}); return err })
	put(t, old, "z", "lost")

	if err := next.StartGeneration(1); !errors.Is(err, ErrTimeline) {
		t.Fatalf("reusing generation 1: %v", err)
	}
	if err := next.StartGeneration(2); err != nil {
		t.Fatal(err)
	}
	if next.SCN() != (SCN{2, 1}) {
		t.Fatalf("generation 2 opened at %s, want its marker 2:1", next.SCN())
	}
	if scn := put(t, next, "c", "new"); scn != (SCN{2, 2}) {
		t.Fatalf("first write of generation 2 is %s", scn)
	}
	put(t, next, "a", "new")

	undone, err := old.TruncateAfter(SCN{1, 3})
	if err != nil {
		t.Fatal(err)
	}
	if undone != 3 {
		t.Fatalf("undid %d events, want 3", undone)
	}
	// Before following: exactly the state both shared at 1:3.
	if got := rows(t, old); got != stateAt3 {
		t.Fatalf("after truncation:\n%s\nwant\n%s", got, stateAt3)
	}
	replicate(t, next, old)
	if got, want := rows(t, old), rows(t, next); got != want {
		t.Fatalf("old master differs from new master:\nold\n%s\nnew\n%s", got, want)
	}
	// The truncated timeline is what a restart finds.
	want := rows(t, next)
	oe.Close()
	oe = open(t, oldDir)
	defer oe.Close()
	old, _ = oe.Partition("db", 0)
	if got := rows(t, old); got != want || old.SCN() != next.SCN() {
		t.Fatalf("after restart: SCN %s, want %s; rows equal: %v", old.SCN(), next.SCN(), got == want)
	}
}

// TestSumsLocateDifferences checks that replicas at the same SCN with the
// same rows have equal sums, and that a difference in one table shows in
// that table's range only.
func TestSumsLocateDifferences(t *testing.T) {
	a, _ := open(t, t.TempDir()).Partition("d", 0)
	b, _ := open(t, t.TempDir()).Partition("d", 0)
	for i := range 5 {
		if _, err := a.Update(func(tx *Tx) error {
			if _, err := tx.Put("A", []keys.Part{keys.S(fmt.Sprint(i))}, 1, []byte("x")); err != nil {
				return err
			}
			_, err := tx.Put("B", []keys.Part{keys.S(fmt.Sprint(i))}, 1, []byte("y"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	replicate(t, a, b)
	sa, _ := a.Sums()
	sb, _ := b.Sums()
	if sa.SCN != sb.SCN || len(sa.Tables) != 3 || sa.Tables["A"] != sb.Tables["A"] || sa.Tables["B"] != sb.Tables["B"] {
		t.Fatalf("equal replicas: %+v vs %+v", sa, sb)
	}
	// Same SCN, different bytes in table B (as a diverged replica would).
	put(t, a, "z", "1")
	if _, err := b.Update(func(tx *Tx) error {
		_, err := tx.Put("T", []keys.Part{keys.S("z")}, 1, []byte("2"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	sa, _ = a.Sums()
	sb, err := b.ChecksumAt(sa.SCN, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sa.Total == sb.Total || sa.Tables["T"] == sb.Tables["T"] || sa.Tables["A"] != sb.Tables["A"] || sa.Tables["B"] != sb.Tables["B"] {
		t.Fatalf("a difference in T: %+v vs %+v", sa, sb)
	}
	if _, err := b.ChecksumAt(SCN{Gen: sa.SCN.Gen, Seq: sa.SCN.Seq - 1}, nil); !errors.Is(err, ErrPassed) {
		t.Fatalf("checksum at a passed SCN: %v", err)
	}
}

// TestTruncationStopsAtTheAcknowledgedWatermark: commits a master knows
// were acknowledged, and those a slave learns were, survive a restart as
// the acknowledged watermark, and a truncation reaching below it is
// refused with ErrTruncateAcknowledged, changing nothing.
func TestTruncationStopsAtTheAcknowledgedWatermark(t *testing.T) {
	dir := t.TempDir()
	e := open(t, dir)
	m, _ := e.Partition("db", 0)
	put(t, m, "a", "1")
	acked := put(t, m, "a", "2")
	m.Acknowledged(acked) // a slave confirmed 1:2
	put(t, m, "b", "1")   // 1:3 carries the watermark to disk
	e.Close()

	e = open(t, dir)
	defer e.Close()
	m, _ = e.Partition("db", 0)
	if got := m.AcknowledgedSCN(); got != acked {
		t.Fatalf("acknowledged watermark after restart: %s, want %s", got, acked)
	}
	before := rows(t, m)
	if _, err := m.TruncateAfter(SCN{1, 1}); !errors.Is(err, ErrTruncateAcknowledged) {
		t.Fatalf("truncating an acknowledged commit: %v", err)
	}
	if got := rows(t, m); got != before {
		t.Fatalf("a refused truncation changed the partition:\n%s\nwant\n%s", got, before)
	}
	if undone, err := m.TruncateAfter(acked); err != nil || undone != 1 {
		t.Fatalf("truncating the unacknowledged 1:3: undid %d, %v", undone, err)
	}

	// A slave records the master's watermark as far as it has applied.
	s, _ := open(t, t.TempDir()).Partition("db", 0)
	var first []Commit
	m.ReadLog(SCN{}, func(c Commit) bool { first = append(first, c); return len(first) < 1 })
	if err := s.ApplyAcknowledged(first, acked); err != nil {
		t.Fatal(err)
	}
	if got := s.AcknowledgedSCN(); got != (SCN{1, 1}) {
		t.Fatalf("slave at 1:1 told 1:2 is acknowledged records %s, want 1:1", got)
	}
}

// TestAutoIncrementIsReplicated: the auto-increment high-water mark
// travels in the commit. A slave promoted after the master handed out
// keys 1..3 and deleted 3 hands out 4, never 3 again; the checksum covers
// the mark; truncating the commit that raised it restores the old one.
func TestAutoIncrementIsReplicated(t *testing.T) {
	m, _ := open(t, t.TempDir()).Partition("db", 0)
	s, _ := open(t, t.TempDir()).Partition("db", 0)
	insert := func(p *Partition) int64 {
		t.Helper()
		var n int64
		if _, err := p.Update(func(tx *Tx) error {
			var err error
			if n, err = tx.NextAutoIncrement("M", []keys.Part{keys.S("box")}, math.MaxInt64); err != nil {
				return err
			}
			_, err = tx.Put("M", []keys.Part{keys.S("box"), keys.I(n)}, 1, []byte("x"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for range 3 {
		insert(m)
	}
	if _, err := m.Update(func(tx *Tx) error {
		_, err := tx.Delete("M", []keys.Part{keys.S("box"), keys.I(3)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	replicate(t, m, s)
	ms, _ := m.Sums()
	ss, _ := s.Sums()
	if ms.Total != ss.Total || ms.Tables["_autoincrement"] == 0 || ms.Tables["_autoincrement"] != ss.Tables["_autoincrement"] {
		t.Fatalf("sums differ or miss the mark: %+v vs %+v", ms, ss)
	}
	if err := s.StartGeneration(2); err != nil {
		t.Fatal(err)
	}
	if n := insert(s); n != 4 {
		t.Fatalf("the promoted slave handed out key %d, want 4 (3 was deleted, never to be reused)", n)
	}
	// Truncating 2:1 (the insert of 4) restores the mark of 3.
	if _, err := s.TruncateAfter(ms.SCN); err != nil {
		t.Fatal(err)
	}
	if after, _ := s.Sums(); after.Tables["_autoincrement"] != ms.Tables["_autoincrement"] {
		t.Fatal("truncation did not restore the auto-increment mark")
	}
}

// TestPreImagesWithinATransaction: a transaction that reads a document,
// then writes it twice and deletes another it read, records each write's
// pre-image as the transaction saw it (the read is reused for the first
// write, not the second), so truncating the commit restores every row.
func TestPreImagesWithinATransaction(t *testing.T) {
	p := solo(t, 0)
	put(t, p, "a", "a1")
	put(t, p, "b", "b1")
	before := p.SCN()
	_, err := p.Update(func(tx *Tx) error {
		if _, _, err := tx.Get("T", []keys.Part{keys.S("a")}); err != nil {
			return err
		}
		if _, err := tx.Put("T", []keys.Part{keys.S("a")}, 1, []byte("a2")); err != nil {
			return err
		}
		if _, err := tx.Put("T", []keys.Part{keys.S("a")}, 1, []byte("a3")); err != nil {
			return err
		}
		if _, _, err := tx.Get("T", []keys.Part{keys.S("b")}); err != nil {
			return err
		}
		_, err := tx.Delete("T", []keys.Part{keys.S("b")})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var prevs []string
	last := p.SCN()
	p.ReadLog(SCN{last.Gen, last.Seq - 1}, func(c Commit) bool {
		for _, ev := range c.Events {
			prevs = append(prevs, string(ev.PrevValue))
		}
		return false
	})
	if got := strings.Join(prevs, ","); got != "a1,a2,b1" {
		t.Fatalf("pre-images %s, want a1,a2,b1", got)
	}
	if _, err := p.TruncateAfter(before); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b"} {
		d, ok, err := p.Get("T", []keys.Part{keys.S(k)})
		if err != nil || !ok || string(d.Value) != k+"1" {
			t.Fatalf("after truncation %s: %q %v %v", k, d.Value, ok, err)
		}
	}
}

// crashImage copies the directory of a running engine, as a kill -9
// would leave it: only what Pebble has written and synced.
func crashImage(t *testing.T, dir string) string {
	t.Helper()
	to := t.TempDir()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, filepath.Base(path)), b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	return to
}

// TestSCNSurvivesACrash: commits do not store the partition's SCN, the
// log's last entry says it. After a crash a partition is at its last
// commit (and its next commit follows it); after a truncation, at the
// truncation's SCN; after a trim of its whole log, at its last commit.
// The acknowledged watermark, stored at most every ackedEvery, comes back
// no later than it was.
func TestSCNSurvivesACrash(t *testing.T) {
	dir := t.TempDir()
	e := open(t, dir)
	defer e.Close()
	p, _ := e.Partition("db", 0)
	reopen := func(step string, want SCN) *Partition {
		t.Helper()
		c := open(t, crashImage(t, dir))
		t.Cleanup(func() { c.Close() })
		q, _ := c.Partition("db", 0)
		if got := q.SCN(); got != want {
			t.Fatalf("%s: after a crash the partition is at %s, want %s", step, got, want)
		}
		if p.AcknowledgedSCN().Less(q.AcknowledgedSCN()) {
			t.Fatalf("%s: after a crash the watermark is %s, ahead of %s", step, q.AcknowledgedSCN(), p.AcknowledgedSCN())
		}
		return q
	}
	for i := range 5 {
		put(t, p, "a", fmt.Sprint(i))
	}
	p.Acknowledged(SCN{1, 3})
	last := put(t, p, "b", "1")
	q := reopen("commits", last)
	if got := q.AcknowledgedSCN(); got != (SCN{1, 3}) {
		t.Fatalf("the first watermark a commit carried came back as %s, want 1:3", got)
	}
	if next := put(t, q, "c", "1"); next != (SCN{1, last.Seq + 1}) {
		t.Fatalf("the commit after the crash is %s, want 1:%d", next, last.Seq+1)
	}

	if _, err := p.TruncateAfter(SCN{1, 4}); err != nil {
		t.Fatal(err)
	}
	reopen("truncation", SCN{1, 4})

	last = put(t, p, "d", "1")
	p.Acknowledged(last)
	if _, err := p.Trim(last); err != nil {
		t.Fatal(err)
	}
	// A trim is not synced: a commit elsewhere syncs the WAL past it.
	other, _ := e.Partition("db", 1)
	put(t, other, "x", "1")
	reopen("whole log trimmed", last)
}

// TestCloseStoresTheWatermark: a watermark no commit carried (a slave's
// acknowledgement after the last commit, or within ackedEvery of the last
// store) is stored when the engine closes.
func TestCloseStoresTheWatermark(t *testing.T) {
	dir := t.TempDir()
	e := open(t, dir)
	p, _ := e.Partition("db", 0)
	put(t, p, "a", "1")
	p.Acknowledged(SCN{1, 1})
	put(t, p, "a", "2") // stores 1:1
	last := put(t, p, "a", "3")
	p.Acknowledged(last)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open(t, dir)
	defer e.Close()
	p, _ = e.Partition("db", 0)
	if got := p.AcknowledgedSCN(); got != last {
		t.Fatalf("after a clean restart the watermark is %s, want %s", got, last)
	}
}

// TestReplicasStoreTheMastersEntries: a slave's log holds the bytes of
// its master's, whether the commits came from a log of this process
// (which carry the master's entry) or over the wire (which do not, and
// are encoded again), for updates, deletes and transactions of several
// rows.
func TestReplicasStoreTheMastersEntries(t *testing.T) {
	m, s := pair(t, 1)
	_, wire := pair(t, 1)
	put(t, m, "a", "1")
	put(t, m, "b", "2")
	if _, err := m.Update(func(tx *Tx) error {
		if _, err := tx.Put("T", []keys.Part{keys.S("a")}, 2, []byte("3")); err != nil {
			return err
		}
		_, err := tx.Delete("T", []keys.Part{keys.S("b")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	replicate(t, m, s)
	if err := m.ReadLog(SCN{}, func(c Commit) bool {
		c.entry = nil // as decoded from the wire
		if err := wire.Apply(c); err != nil {
			t.Fatal(err)
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	want := logDump(t, m)
	if n := strings.Count(want, "\n"); n != 3 {
		t.Fatalf("the master's log holds %d entries, want 3", n)
	}
	for name, p := range map[string]*Partition{"slave": s, "slave fed over the wire": wire} {
		if got := logDump(t, p); got != want {
			t.Fatalf("the %s's log entries differ from the master's", name)
		}
	}
}

// TestApplyAsyncMovesTheSCNOnceDurable: a slave's commits applied without
// waiting for their fsync are visible to reads at once, but the
// partition's SCN — what it acknowledges to its master, ships and reports
// — and its log as read stay where they were until the wait says the
// commits are durable; commits applied meanwhile follow the applied ones.
func TestApplyAsyncMovesTheSCNOnceDurable(t *testing.T) {
	m, _ := open(t, t.TempDir()).Partition("db", 0)
	s, _ := open(t, t.TempDir()).Partition("db", 0)
	put(t, m, "a", "1")
	put(t, m, "b", "1")
	put(t, m, "c", "1")
	var cs []Commit
	m.ReadLog(SCN{}, func(c Commit) bool { cs = append(cs, c); return true })
	wait1, err := s.ApplyAcknowledgedAsync(cs[:2], SCN{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Get("T", []keys.Part{keys.S("b")}); err != nil || !ok {
		t.Fatalf("a row applied and not yet durable: found %v, %v; want it visible", ok, err)
	}
	if got := s.SCN(); !got.IsZero() {
		t.Fatalf("SCN before the fsync: %s, want none", got)
	}
	logged := 0
	s.ReadLog(SCN{}, func(Commit) bool { logged++; return true })
	if logged != 0 {
		t.Fatalf("the log served %d commits not yet durable", logged)
	}
	// The next commit follows the applied ones, not the durable ones.
	wait2, err := s.ApplyAcknowledgedAsync(cs[2:], SCN{})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait1(); err != nil {
		t.Fatal(err)
	}
	if got := s.SCN(); got != cs[1].SCN {
		t.Fatalf("SCN once the first two are durable: %s, want %s", got, cs[1].SCN)
	}
	if err := wait2(); err != nil {
		t.Fatal(err)
	}
	if got := s.SCN(); got != cs[2].SCN {
		t.Fatalf("SCN once all are durable: %s, want %s", got, cs[2].SCN)
	}
	if a, b := rows(t, m), rows(t, s); a != b {
		t.Fatalf("slave rows:\n%s\nwant the master's\n%s", b, a)
	}
}

package storage

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/keys"
)

func open(t *testing.T, dir string) *Engine {
	t.Helper()
	e, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// pair opens two engines for the test (closed at its end) and returns
// partition id of each: a master and a slave.
func pair(t *testing.T, id int) (m, s *Partition) {
	t.Helper()
	me, se := open(t, t.TempDir()), open(t, t.TempDir())
	t.Cleanup(func() { me.Close(); se.Close() })
	m, _ = me.Partition("db", id)
	s, _ = se.Partition("db", id)
	return m, s
}

// solo opens one engine for the test (closed at its end) and returns its
// partition id.
func solo(t *testing.T, id int) *Partition {
	t.Helper()
	e := open(t, t.TempDir())
	t.Cleanup(func() { e.Close() })
	p, _ := e.Partition("db", id)
	return p
}

// TestCloseTwice: a second Close (a shutdown path and a deferred cleanup
// both closing) returns the first one's answer instead of panicking, and
// the data the first one stored is there on reopening.
func TestCloseTwice(t *testing.T) {
	dir := t.TempDir()
	e := open(t, dir)
	p, _ := e.Partition("db", 1)
	if _, err := p.Update(func(tx *Tx) error {
		_, err := tx.Put("T", []keys.Part{keys.S("k")}, 1, []byte{7})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
	e = open(t, dir)
	defer e.Close()
	p, _ = e.Partition("db", 1)
	if d, ok, err := p.Get("T", []keys.Part{keys.S("k")}); err != nil || !ok || len(d.Value) != 1 || d.Value[0] != 7 {
		t.Fatalf("after two closes: %v %v %v", d.Value, ok, err)
	}
}

func TestCommitsGetConsecutiveSCNsAcrossReopen(t *testing.T) {
	dir := t.TempDir()
	e := open(t, dir)
	p, _ := e.Partition("db", 3)
	for i := 1; i <= 5; i++ {
		scn, err := p.Update(func(tx *Tx) error {
			_, err := tx.Put("T", []keys.Part{keys.S("k"), keys.I(int64(i))}, 1, []byte{byte(i)})
			return err
		})
		if err != nil || scn != (SCN{1, uint64(i)}) {
			t.Fatalf("commit %d: scn %v err %v", i, scn, err)
		}
	}
	e.Close()
	e = open(t, dir)
	defer e.Close()
	p, _ = e.Partition("db", 3)
	if p.SCN() != (SCN{1, 5}) {
		t.Fatalf("after reopen scn = %v", p.SCN())
	}
	scn, _ := p.Update(func(tx *Tx) error {
		_, err := tx.Delete("T", []keys.Part{keys.S("k"), keys.I(1)})
		return err
	})
	if scn != (SCN{1, 6}) {
		t.Fatalf("next scn = %v", scn)
	}
	var seqs []uint64
	var ops []Op
	p.ReadLog(SCN{}, func(c Commit) bool {
		seqs = append(seqs, c.SCN.Seq)
		ops = append(ops, c.Events[0].Op)
		return true
	})
	if fmt.Sprint(seqs) != "[1 2 3 4 5 6]" || ops[5] != OpDelete || ops[0] != OpInsert {
		t.Fatalf("log = %v %v", seqs, ops)
	}
	// Other partitions have their own timeline.
	q, _ := e.Partition("db", 4)
	if q.SCN() != (SCN{}) {
		t.Fatalf("untouched partition scn = %v", q.SCN())
	}
}

func TestFailedUpdateWritesNothing(t *testing.T) {
	p := solo(t, 0)
	boom := errors.New("boom")
	_, err := p.Update(func(tx *Tx) error {
		tx.Put("T", []keys.Part{keys.S("a")}, 1, []byte("x"))
		if _, ok, _ := tx.Get("T", []keys.Part{keys.S("a")}); !ok {
			t.Error("transaction does not see its own write")
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if _, ok, _ := p.Get("T", []keys.Part{keys.S("a")}); ok {
		t.Fatal("aborted write visible")
	}
	if p.SCN() != (SCN{}) {
		t.Fatalf("aborted update consumed an SCN: %v", p.SCN())
	}
}

func TestScanCollection(t *testing.T) {
	p := solo(t, 0)
	p.Update(func(tx *Tx) error {
		for _, box := range []string{"a", "ab", "b"} {
			for i := int64(1); i <= 3; i++ {
				tx.Put("M", []keys.Part{keys.S(box), keys.I(i)}, 1, []byte(box))
			}
		}
		return nil
	})
	var got []string
	var last []byte
	err := p.Scan(ScanOptions{Table: "M", Prefix: []keys.Part{keys.S("a")}, Limit: 2}, func(k []keys.Part, enc []byte, d Doc) bool {
		got = append(got, fmt.Sprint(k[0].Str, k[1].Int))
		last = enc
		return true
	})
	if err != nil || fmt.Sprint(got) != "[a1 a2]" {
		t.Fatalf("page 1 = %v %v", got, err)
	}
	got = nil
	p.Scan(ScanOptions{Table: "M", Prefix: []keys.Part{keys.S("a")}, After: last}, func(k []keys.Part, _ []byte, d Doc) bool {
		got = append(got, fmt.Sprint(k[0].Str, k[1].Int))
		return true
	})
	if fmt.Sprint(got) != "[a3]" {
		t.Fatalf("page 2 = %v", got)
	}
}

func TestAutoIncrementNeverReuses(t *testing.T) {
	p := solo(t, 0)
	box := []keys.Part{keys.S("box")}
	var ids []int64
	for range 3 {
		p.Update(func(tx *Tx) error {
			n, err := tx.NextAutoIncrement("M", box, math.MaxInt64)
			ids = append(ids, n)
			tx.Put("M", append(box, keys.I(n)), 1, nil)
			return err
		})
	}
	p.Update(func(tx *Tx) error { _, err := tx.Delete("M", append(box, keys.I(3))); return err })
	p.Update(func(tx *Tx) error {
		n, err := tx.NextAutoIncrement("M", box, math.MaxInt64)
		ids = append(ids, n)
		return err
	})
	if fmt.Sprint(ids) != "[1 2 3 4]" {
		t.Fatalf("ids = %v", ids)
	}
}

func TestCorruptRowDetected(t *testing.T) {
	d := Doc{Version: 1, CRC: 123, Value: []byte("abc")}
	if _, err := decodeRow(encodeRow(nil, &d)); !errors.Is(err, ErrCorruptRow) {
		t.Fatalf("bad CRC not detected: %v", err)
	}
}

// TestDocETag: a document's entity tag is the SCN of its commit and its
// CRC in eight hex digits, quoted; two versions with the same bytes, or
// with the same CRC, have different tags.
func TestDocETag(t *testing.T) {
	for _, tc := range []struct {
		scn  SCN
		crc  uint32
		want string
	}{
		{SCN{Gen: 1, Seq: 1}, 0, `"1.1.00000000"`},
		{SCN{Gen: 1, Seq: 0x2f}, 0x0000abcd, `"1.2f.0000abcd"`},
		{SCN{Gen: 0xffffffff, Seq: 0xffffffffffffffff}, 0xffffffff, `"ffffffff.ffffffffffffffff.ffffffff"`},
	} {
		d := Doc{SCN: tc.scn, CRC: tc.crc}
		if got := d.ETag(); got != tc.want {
			t.Fatalf("ETag of %s/%#x: %s, want %s", tc.scn, tc.crc, got, tc.want)
		}
	}
	a, b := Doc{SCN: SCN{Gen: 1, Seq: 5}, CRC: 7}, Doc{SCN: SCN{Gen: 1, Seq: 6}, CRC: 7}
	if a.ETag() == b.ETag() {
		t.Fatalf("two versions with the same CRC share the tag %s", a.ETag())
	}
}

// TestDurableBetween: a master knows when each of its last DurableRing
// commits became durable, no earlier than it started and no later than
// Update returned; an older commit, one at or before the range's start,
// or one of another generation, it does not report.
func TestDurableBetween(t *testing.T) {
	m, _ := pair(t, 1)
	var scns []SCN
	var before, after []time.Time
	for i := range DurableRing + 5 {
		t0 := time.Now()
		scn, err := m.Update(func(tx *Tx) error {
			_, err := tx.Put("T", []keys.Part{keys.I(int64(i))}, 1, []byte{1})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		scns, before, after = append(scns, scn), append(before, t0), append(after, time.Now())
	}
	last := scns[len(scns)-1]
	i := 5 // the five oldest are no longer known
	m.DurableBetween(SCN{}, last, func(scn SCN, at time.Time) {
		if i >= len(scns) || scn != scns[i] || at.Before(before[i]) || at.After(after[i]) {
			t.Fatalf("commit %s durable at %v; want %s between %v and %v", scn, at, scns[min(i, len(scns)-1)], before[min(i, len(scns)-1)], after[min(i, len(scns)-1)])
		}
		i++
	})
	if i != len(scns) {
		t.Fatalf("%d commits reported, want the last %d", i-5, DurableRing)
	}
	n := 0
	m.DurableBetween(scns[len(scns)-3], last, func(SCN, time.Time) { n++ })
	if n != 2 {
		t.Fatalf("%d commits after the third newest, want 2", n)
	}
	m.DurableBetween(SCN{}, SCN{Gen: last.Gen + 1, Seq: last.Seq}, func(scn SCN, _ time.Time) {
		t.Fatalf("commit %s reported for another generation", scn)
	})
}

// TestIdlePartitionFootprint: a partition that took no write as master
// and no read through the row cache holds no more than its bookkeeping.
// A node holds a partition of every database placed on it, so this is
// what each database costs a node before it is used: 46 KB a partition
// (a 64-partition database: 2.9 MB) when the durability ring and the
// row cache's stripes were made with the partition.
func TestIdlePartitionFootprint(t *testing.T) {
	e := open(t, t.TempDir())
	defer e.Close()
	const n = 2000
	ps := make([]*Partition, 0, n) // held, so that the collector keeps them
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range n {
		p, err := e.Partition(fmt.Sprintf("db%d", i/64), i%64)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / n
	if per > 8<<10 {
		t.Fatalf("an idle partition holds %d bytes of heap, want at most 8 KiB", per)
	}
	// Used, it has both; a read and a write find the same stripes.
	p := ps[0]
	if _, err := p.Update(func(tx *Tx) error {
		_, err := tx.Put("T", []keys.Part{keys.S("k")}, 1, []byte{1})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if p.durableAt == nil || p.stripes.Load() == nil || p.stripeArray() != p.stripes.Load() {
		t.Fatal("a partition that took a write has no durability ring or no stripes")
	}
	t.Logf("an idle partition: %d bytes of heap", per)
}

// TestCommitBound: a transaction whose commit would be over
// MaxCommitBytes fails before anything is written — a collection too
// large to delete in one commit, a put whose document and pre-image are
// too large together — and the partition goes on committing. A commit
// over it would be durable on the master and never reach a slave.
func TestCommitBound(t *testing.T) {
	p := solo(t, 0)
	doc := make([]byte, 4<<20)
	n := MaxCommitBytes/len(doc) + 1
	for i := range n {
		if _, err := p.Update(func(tx *Tx) error {
			_, err := tx.Put("T", []keys.Part{keys.S("big"), keys.I(int64(i))}, 1, doc)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	before := p.SCN()
	var deleted int
	_, err := p.Update(func(tx *Tx) (err error) {
		deleted, err = tx.DeleteCollection("T", []keys.Part{keys.S("big")}, false)
		return err
	})
	if !errors.Is(err, ErrCommitTooLarge) || deleted != 0 {
		t.Fatalf("deleting %d documents of %d bytes in one commit: %d deleted, %v", n, len(doc), deleted, err)
	}
	// A transaction of deletes of some of them at a time goes through.
	_, err = p.Update(func(tx *Tx) error {
		for i := range n / 2 {
			if _, err := tx.Delete("T", []keys.Part{keys.S("big"), keys.I(int64(i))}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Puts: each document fits, all of them together do not.
	_, err = p.Update(func(tx *Tx) error {
		for i := range n {
			if _, err := tx.Put("T", []keys.Part{keys.S("other"), keys.I(int64(i))}, 1, doc); err != nil {
				return err
			}
		}
		return nil
	})
	if !errors.Is(err, ErrCommitTooLarge) {
		t.Fatalf("a transaction putting %d documents of %d bytes: %v", n, len(doc), err)
	}
	if _, ok, _ := p.Get("T", []keys.Part{keys.S("other"), keys.I(0)}); ok {
		t.Fatal("a refused transaction wrote a document")
	}
	// One document replaced by another as large as the bound allows.
	half := make([]byte, MaxCommitBytes/2-1024)
	for range 2 {
		if _, err := p.Update(func(tx *Tx) error {
			_, err := tx.Put("T", []keys.Part{keys.S("half")}, 1, half)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	if want := (SCN{Gen: before.Gen, Seq: before.Seq + 3}); p.SCN() != want {
		t.Fatalf("SCN %v after the refusals, want %v", p.SCN(), want)
	}
	var largest int
	p.ReadLog(SCN{}, func(c Commit) bool {
		largest = max(largest, c.Size())
		return true
	})
	if largest > MaxCommitBytes {
		t.Fatalf("a commit of %d bytes is in the log", largest)
	}
}

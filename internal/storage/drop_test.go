package storage

import (
	"bytes"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cortado-db/cortado/internal/keys"
)

// TestDropRemovesEverything: a dropped partition leaves no row, index
// entry, log entry or mark in the engine, before or after a reopen; a
// reader still holding it and the next Partition call find it empty (no
// row from the row cache either), and it starts a timeline afresh. Other
// partitions, partition 10 beside partition 1 too, keep all they hold.
func TestDropRemovesEverything(t *testing.T) {
	dir := t.TempDir()
	e := open(t, dir)
	put := func(p *Partition, k string, v byte) {
		t.Helper()
		if _, err := p.Update(func(tx *Tx) error {
			_, err := tx.Put("T", []keys.Part{keys.S(k)}, 1, []byte{v})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	p1, _ := e.Partition("db", 1)
	p10, _ := e.Partition("db", 10)
	if err := p1.StartGeneration(3); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		put(p1, "a", byte(i))
		put(p1, string(rune('b'+i)), byte(i))
		put(p10, "a", byte(10+i))
	}
	if d, ok, err := p1.Get("T", []keys.Part{keys.S("a")}); err != nil || !ok || d.Value[0] != 4 {
		t.Fatalf("before the drop: %v %v %v", d.Value, ok, err)
	}
	if held, err := e.Holds("db", 1); err != nil || !held {
		t.Fatalf("Holds before the drop: %v %v", held, err)
	}
	if held, err := e.Holds("db", 5); err != nil || held {
		t.Fatalf("Holds of a partition never written: %v %v", held, err)
	}
	wantTen := p10.SCN()

	compact, err := e.Drop("db", 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := compact(t.Context()); err != nil {
		t.Fatal(err)
	}
	check := func(when string, e *Engine, old *Partition) {
		t.Helper()
		if held, err := e.Holds("db", 1); err != nil || held {
			t.Fatalf("%s: Holds = %v %v", when, held, err)
		}
		it, err := e.db.NewIter(&pebble.IterOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for ok := it.First(); ok; ok = it.Next() {
			for ep := range e.logEpoch.Load() + 1 {
				if bytes.HasPrefix(it.Key(), keys.LogPrefix(ep, "db", 1)) {
					t.Fatalf("%s: a log entry of the dropped partition is left: %x", when, it.Key())
				}
			}
		}
		it.Close()
		fresh, _ := e.Partition("db", 1)
		for _, p := range []*Partition{old, fresh} {
			if p == nil {
				continue
			}
			if p.SCN() != (SCN{}) || p.Generation() != 0 {
				t.Fatalf("%s: scn %v generation %d", when, p.SCN(), p.Generation())
			}
			if d, ok, err := p.Get("T", []keys.Part{keys.S("a")}); err != nil || ok {
				t.Fatalf("%s: a row is still read: %v %v %v", when, d.Value, ok, err)
			}
			n := 0
			if err := p.ReadLog(SCN{}, func(Commit) bool { n++; return true }); err != nil || n != 0 {
				t.Fatalf("%s: %d log entries read (%v)", when, n, err)
			}
		}
		ten, _ := e.Partition("db", 10)
		if d, ok, err := ten.Get("T", []keys.Part{keys.S("a")}); err != nil || !ok || d.Value[0] != 14 || ten.SCN() != wantTen {
			t.Fatalf("%s: partition 10 at %v holds %v %v %v", when, ten.SCN(), d.Value, ok, err)
		}
		n := 0
		if err := ten.ReadLog(SCN{}, func(Commit) bool { n++; return true }); err != nil || n != 5 {
			t.Fatalf("%s: partition 10's log holds %d commits (%v)", when, n, err)
		}
	}
	check("dropped", e, p1)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open(t, dir)
	defer e.Close()
	check("reopened", e, nil)
	p, _ := e.Partition("db", 1)
	put(p, "z", 1)
	if p.SCN() != (SCN{1, 1}) {
		t.Fatalf("the first commit after the drop is at %v", p.SCN())
	}
}

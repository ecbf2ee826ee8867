package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cortado-db/cortado/internal/keys"
)

// wordIndexer indexes a document "tag word word…" (version 1) as an
// attribute field "tag" and a text field "body" with word positions;
// version 2 indexes nothing. The entries are storage's concern here, not
// how a schema derives them (internal/index does that).
type wordIndexer struct{}

func (wordIndexer) Index(_, _ string, version int, value []byte) ([]IndexEntry, bool, error) {
	if version != 1 {
		return nil, false, nil
	}
	words := strings.Fields(string(value))
	if len(words) == 0 {
		return nil, true, nil
	}
	out := []IndexEntry{{Field: "tag", Term: keys.AppendPart(nil, keys.S(words[0]))}}
	pos := map[string][]byte{}
	var order []string
	for i, w := range words[1:] {
		if pos[w] == nil {
			order = append(order, w)
		}
		pos[w] = binary.AppendUvarint(pos[w], uint64(i))
	}
	for _, w := range order {
		out = append(out, IndexEntry{Field: "body", Term: keys.AppendPart(nil, keys.S(w)), Payload: pos[w], Length: uint32(len(words) - 1)})
	}
	return out, true, nil
}

// indexDump is every key and value of a partition's index section.
func indexDump(t *testing.T, p *Partition) string {
	t.Helper()
	return sectionDump(t, p, keys.SectionIdx)
}

// deleteOneByOne deletes a collection's documents without the
// whole-collection mark: how it went before the mark, and how a replica
// that does not know it applies the deletes.
func deleteOneByOne(tx *Tx, table string, prefix []keys.Part) error {
	var doomed [][]keys.Part
	if err := tx.Scan(ScanOptions{Table: table, Prefix: prefix}, func(key []keys.Part, _ []byte, _ Doc) bool {
		doomed = append(doomed, key)
		return true
	}); err != nil {
		return err
	}
	for _, key := range doomed {
		if _, err := tx.Delete(table, key); err != nil {
			return err
		}
	}
	return nil
}

func openIndexed(t *testing.T) *Partition {
	t.Helper()
	return openIndexedWith(t, Options{})
}

// openIndexedWith opens an engine with opts and wordIndexer (closed when
// the test ends) and returns its partition db/1.
func openIndexedWith(tb testing.TB, opts Options) *Partition {
	tb.Helper()
	e, err := Open(tb.TempDir(), opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.Close() })
	e.SetIndexer(wordIndexer{})
	p, err := e.Partition("db", 1)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// putWords writes document (coll, i) of table T as words (see
// wordIndexer), version 1, in a commit of its own.
func putWords(tb testing.TB, p *Partition, coll string, i int64, words string) {
	tb.Helper()
	if _, err := p.Update(func(tx *Tx) error {
		_, err := tx.Put("T", []keys.Part{keys.S(coll), keys.I(i)}, 1, []byte(words))
		return err
	}); err != nil {
		tb.Fatal(err)
	}
}

// TestSumsCoverTheIndex: a replica's checksum holds its index's digest
// beside the documents' (Sums.Tables[IndexSum], not in the total): equal
// on replicas of one timeline, different on a replica that lacks an
// index entry its documents would have.
func TestSumsCoverTheIndex(t *testing.T) {
	master, slave := openIndexed(t), openIndexed(t)
	for i := range 10 {
		if _, err := master.Update(func(tx *Tx) error {
			_, err := tx.Put("T", []keys.Part{keys.S("c"), keys.I(int64(i))}, 1, []byte(fmt.Sprintf("word%d common", i)))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	replicate(t, master, slave)
	ms, _ := master.Sums()
	ss, _ := slave.Sums()
	if ms.Total != ss.Total || ms.Tables[IndexSum] != ss.Tables[IndexSum] {
		t.Fatalf("replicas of one timeline: %+v vs %+v", ms, ss)
	}
	// Drop one posting from the slave's index, as a replica that
	// missed an index update would be.
	prefix := append(keys.Partition(slave.DB, slave.ID), keys.SectionIdx, idxPosting)
	it, err := slave.e.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: keys.PrefixEnd(prefix)})
	if err != nil {
		t.Fatal(err)
	}
	if !it.First() {
		t.Fatal("no posting")
	}
	victim := slices.Clone(it.Key())
	it.Close()
	if err := slave.e.db.Delete(victim, pebble.Sync); err != nil {
		t.Fatal(err)
	}
	ss, _ = slave.Sums()
	if ms.Total != ss.Total || ms.Tables[IndexSum] == ss.Tables[IndexSum] {
		t.Fatalf("a slave without posting %x: %+v vs %+v", victim, ms, ss)
	}
}

// TestCollectionDeleteByRange checks that deleting a whole collection
// removes its index entries by range to exactly the state deleting its
// documents one by one leaves — on the master, on a slave that applies
// the marked commits, and on a slave that does not know the mark (an
// older binary) — that a transaction writing the collection around the
// delete keeps what it wrote after it, and that truncating the delete
// restores the index.
func TestCollectionDeleteByRange(t *testing.T) {
	k := func(coll string, id int64) []keys.Part { return []keys.Part{keys.S(coll), keys.I(id)} }
	byRange := func(tx *Tx, coll string) error {
		_, err := tx.DeleteCollection("T", []keys.Part{keys.S(coll)}, false)
		return err
	}
	oneByOne := func(tx *Tx, coll string) error { return deleteOneByOne(tx, "T", []keys.Part{keys.S(coll)}) }
	// The same history on two masters, but for how a collection goes.
	history := func(del func(tx *Tx, coll string) error) []func(tx *Tx) error {
		return []func(tx *Tx) error{
			func(tx *Tx) error {
				for i := range int64(20) {
					for _, coll := range []string{"x", "xy", "y"} {
						v := fmt.Sprintf("t%d alpha beta w%d alpha", i%3, i%5)
						if _, err := tx.Put("T", k(coll, i), 1, []byte(v)); err != nil {
							return err
						}
					}
				}
				_, err := tx.Put("T", k("x", 99), 2, []byte("t0 unindexed")) // a version without indexes
				return err
			},
			func(tx *Tx) error { _, err := tx.Put("T", k("x", 3), 1, []byte("t9 gamma")); return err },
			func(tx *Tx) error { _, err := tx.Put("U", k("x", 1), 1, []byte("t1 other table")); return err },
			// Written before and after the delete in one transaction.
			func(tx *Tx) error {
				if _, err := tx.Put("T", k("y", 100), 1, []byte("t5 before")); err != nil {
					return err
				}
				if err := del(tx, "y"); err != nil {
					return err
				}
				_, err := tx.Put("T", k("y", 101), 1, []byte("t5 after after"))
				return err
			},
			func(tx *Tx) error { return del(tx, "x") },
			func(tx *Tx) error { _, err := tx.Put("T", k("x", 7), 1, []byte("t2 again")); return err },
		}
	}
	master, control := openIndexed(t), openIndexed(t)
	var beforeX SCN
	var beforeSum uint32
	var beforeVersions map[int]uint64
	for i, step := range history(byRange) {
		if i == 4 {
			beforeX = master.SCN()
			var err error
			if beforeSum, _, err = master.IndexChecksum(); err != nil {
				t.Fatal(err)
			}
			if beforeVersions, err = master.VersionCounts("T"); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := master.Update(step); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range history(oneByOne) {
		if _, err := control.Update(step); err != nil {
			t.Fatal(err)
		}
	}
	// Slaves of the master: one reads the marks, one (an older binary)
	// does not see them.
	slave, old := openIndexed(t), openIndexed(t)
	marked := 0
	err := master.ReadLog(SCN{}, func(c Commit) bool {
		if err := slave.Apply(c); err != nil {
			t.Fatal(err)
		}
		for i := range c.Events {
			if c.Events[i].WholeCollection {
				marked++
				c.Events[i].WholeCollection = false
			}
		}
		if err := old.Apply(c); err != nil {
			t.Fatal(err)
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if marked != 21+21 {
		t.Fatalf("%d deletes marked whole-collection, want 42", marked)
	}
	want := indexDump(t, control)
	for name, p := range map[string]*Partition{"master": master, "slave": slave, "older slave": old} {
		if got := indexDump(t, p); got != want {
			t.Fatalf("%s's index differs from deleting one by one:\n%s\nwant\n%s", name, got, want)
		}
	}
	// What is left: y/101 and x/7 of the collections deleted, all of xy.
	r := master.IndexReader()
	defer r.Close()
	for coll, n := range map[string]int{"x": 1, "y": 1, "xy": 20} {
		got := 0
		err := r.Postings("T", "tag", nil, nil, keys.AppendPart(nil, keys.S(coll)), false, func(_, _ []byte, _ uint64, _ []byte) bool {
			got++
			return true
		})
		if err != nil || got != n {
			t.Fatalf("collection %s: %d documents in the index, want %d (%v)", coll, got, n, err)
		}
	}
	// Truncating the delete restores the index as it was (ordinals
	// aside: a replica's own).
	if _, err := master.TruncateAfter(beforeX); err != nil {
		t.Fatal(err)
	}
	sum, _, err := master.IndexChecksum()
	if err != nil {
		t.Fatal(err)
	}
	versions, err := master.VersionCounts("T")
	if err != nil {
		t.Fatal(err)
	}
	if sum != beforeSum || fmt.Sprint(versions) != fmt.Sprint(beforeVersions) {
		t.Fatalf("after truncating the delete: checksum %x versions %v, want %x %v", sum, versions, beforeSum, beforeVersions)
	}
}

func TestWholeCollectionMarkInTheLog(t *testing.T) {
	c := Commit{SCN: SCN{1, 2}, Events: []Event{
		{Op: OpInsert, Table: "T", Key: []byte("a"), Version: 1, Value: []byte("v")},
		{Op: OpDelete, Table: "T", Key: []byte("b"), PrevVersion: 1, PrevValue: []byte("p"), WholeCollection: true},
		{Op: OpDelete, Table: "T", Key: []byte("c"), PrevVersion: 1, PrevValue: []byte("q"), WholeCollection: true},
	}}
	enc := encodeCommit(&c)
	got, err := decodeCommit(c.SCN, enc)
	if err != nil || !got.Events[1].WholeCollection || !got.Events[2].WholeCollection || got.Events[0].WholeCollection {
		t.Fatalf("decoded %+v, %v", got.Events, err)
	}
	// The events are encoded as before; the mark is a trailer an older
	// decoder ignores.
	plain := c
	plain.Events = append([]Event(nil), c.Events...)
	for i := range plain.Events {
		plain.Events[i].WholeCollection = false
	}
	if p := encodeCommit(&plain); !bytes.HasPrefix(enc, p) || len(enc) == len(p) {
		t.Fatalf("marked %x, plain %x", enc, p)
	}
	// A mark on no event, or on one that is no delete, is corrupt.
	for _, trailer := range [][]byte{{1, 3}, {1, 0}, {2, 1}} {
		bad := append(encodeCommit(&plain), trailer...)
		if _, err := decodeCommit(c.SCN, bad); !errors.Is(err, errCorruptLog) {
			t.Fatalf("trailer %x: %v", trailer, err)
		}
	}
}

// FuzzDecodeCommit: any bytes decode to a commit or errCorruptLog, never
// a panic, and what decodes encodes back to a commit that decodes the
// same.
func FuzzDecodeCommit(f *testing.F) {
	f.Add(encodeCommit(&Commit{Events: []Event{
		{Op: OpDelete, Table: "T", Key: []byte("b"), PrevVersion: 1, PrevValue: []byte("p"), WholeCollection: true},
	}}))
	f.Add(encodeCommit(&Commit{Events: []Event{{Op: OpInsert, Table: "T", Key: []byte("a"), Version: 1, Value: []byte("v")}}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeCommit(SCN{1, 1}, b)
		if err != nil {
			if !errors.Is(err, errCorruptLog) {
				t.Fatal(err)
			}
			return
		}
		again, err := decodeCommit(SCN{1, 1}, encodeCommit(&c))
		// The entry a commit was decoded from is kept as it came (a
		// replica stores its master's bytes); a decoder ignores what
		// follows the fields it knows, so only the fields must agree.
		c.entry, again.entry = nil, nil
		if err != nil || fmt.Sprint(again) != fmt.Sprint(c) {
			t.Fatalf("%+v\nre-decoded %+v, %v", c, again, err)
		}
	})
}

// TestChangedFields: the entries of a field that are the same before and
// after are left out of the comparison; a changed field, a field only on
// one side and a field in two runs are kept whole.
func TestChangedFields(t *testing.T) {
	e := func(field, term, payload string) IndexEntry {
		return IndexEntry{Field: field, Term: []byte(term), Payload: []byte(payload)}
	}
	olds := []IndexEntry{e("a", "x", "1"), e("a", "y", "2"), e("b", "x", "1"), e("c", "x", ""), e("d", "x", ""), e("c", "y", ""), e("gone", "x", "")}
	news := []IndexEntry{e("a", "x", "1"), e("a", "y", "2"), e("b", "x", "2"), e("c", "x", ""), e("d", "x", ""), e("c", "y", ""), e("new", "x", "")}
	o, n := changedFields(olds, news)
	fields := func(es []IndexEntry) (s string) {
		for _, e := range es {
			s += e.Field + ":" + string(e.Term) + " "
		}
		return s
	}
	if got, want := fields(o), "b:x c:x c:y gone:x "; got != want {
		t.Errorf("olds kept %q, want %q", got, want)
	}
	if got, want := fields(n), "b:x c:x c:y new:x "; got != want {
		t.Errorf("news kept %q, want %q", got, want)
	}
	// Nothing the same: the lists as they were.
	o, n = changedFields(olds[2:3], news[2:3])
	if len(o) != 1 || len(n) != 1 {
		t.Fatalf("a changed field alone: %v %v", o, n)
	}
}

// TestVersionCounts: how many documents of each schema version a table
// holds, as writes of every version move them, read by a seek past each
// version (versions far apart, one past a byte's carry), with each count
// rewritten many times in the memtable.
func TestVersionCounts(t *testing.T) {
	p := openIndexed(t)
	versions := []int{1, 3, 255, 256, 70000}
	model := map[int]uint64{}
	at := map[int64]int{} // key → version
	rng := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		id, v := rng.Int64N(50), versions[rng.IntN(len(versions))]
		del := rng.IntN(5) == 0
		if _, err := p.Update(func(tx *Tx) error {
			key := []keys.Part{keys.S("c"), keys.I(id)}
			if del {
				_, err := tx.Delete("T", key)
				return err
			}
			_, err := tx.Put("T", key, v, []byte("w"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if old, ok := at[id]; ok {
			model[old]--
			delete(at, id)
		}
		if !del {
			model[v]++
			at[id] = v
		}
	}
	got, err := p.VersionCounts("T")
	if err != nil {
		t.Fatal(err)
	}
	live := func(m map[int]uint64) string {
		maps.DeleteFunc(m, func(_ int, n uint64) bool { return n == 0 })
		return fmt.Sprint(m)
	}
	if g, w := live(got), live(model); g != w {
		t.Fatalf("version counts %s, want %s", g, w)
	}
}

// TestKeysInOrderPastACollection: a page token's key in a later
// collection bounds a collection's read past its end (a query of every
// collection resumes each from the token's key): it reads nothing, and
// the reader's iterator, reused, then reads the next collection whole.
func TestKeysInOrderPastACollection(t *testing.T) {
	p := openIndexedWith(t, Options{NoSync: true})
	for _, coll := range []string{"a", "b"} {
		for i := range int64(3) {
			putWords(t, p, coll, i, "tag word")
		}
	}
	r := p.IndexReader()
	defer r.Close()
	read := func(coll string, after []byte) int {
		n := 0
		if err := r.KeysInOrder("T", keys.AppendPart(nil, keys.S(coll)), after, func(uint64, []byte) bool { n++; return true }); err != nil {
			t.Fatal(err)
		}
		return n
	}
	token := keys.AppendParts(nil, []keys.Part{keys.S("b"), keys.I(1)})
	if n := read("a", token); n != 0 {
		t.Fatalf("collection a after a key of b: %d keys", n)
	}
	if n := read("b", token); n != 1 {
		t.Fatalf("collection b after its second key: %d keys, want 1", n)
	}
	if n := read("a", nil); n != 3 {
		t.Fatalf("collection a whole: %d keys, want 3", n)
	}
}

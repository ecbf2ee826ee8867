package storage

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cortado-db/cortado/internal/keys"
)

// hiddenSteps reads the postings of tag "a" in collection "c" with an
// iterator of its own and returns how many values it stepped over
// without returning them.
func hiddenSteps(t *testing.T, p *Partition) int {
	t.Helper()
	prefix := append(PostingPrefix(p.DB, p.ID, "T", "tag"), keys.AppendPart(nil, keys.S("c"))...)
	it, err := p.e.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: keys.PrefixEnd(prefix)})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.NextPrefix() {
	}
	st := it.Stats()
	return st.ForwardStepCount[pebble.InternalIterCall] - st.ForwardStepCount[pebble.InterfaceCall]
}

// awaitFor polls cond until it holds, failing the test after 30 s
// without what.
func awaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("30 s without %s", what)
		}
	}
}

// TestReadsAskForAFlush: a message whose tag flipped 20,000 times has
// as many values of its posting in the memtable, which every read of
// the tag steps over; the first such read asks for a flush, after which
// reads step over a few, and no second flush comes within
// ReadFlushInterval. Close does not wait for the interval.
func TestReadsAskForAFlush(t *testing.T) {
	e, err := Open(t.TempDir(), Options{ReadFlushInterval: time.Hour, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	e.SetIndexer(wordIndexer{})
	p, err := e.Partition("db", 1) // the test closes e itself
	if err != nil {
		t.Fatal(err)
	}
	put := func(i int64, tag string) { putWords(t, p, "c", i, tag+" word") }
	for i := range int64(10) {
		put(i, "a")
	}
	for j := range 20000 {
		put(5, string(rune('a'+j%2)))
	}
	if n := hiddenSteps(t, p); n < 10000 {
		t.Fatalf("before any flush, a read steps over %d hidden values", n)
	}
	if got := e.readFlushes.Load(); got != 0 {
		t.Fatalf("%d flushes before a read asked", got)
	}
	read := func() int {
		r := p.IndexReader()
		defer r.Close()
		n := 0
		if err := r.Postings("T", "tag", nil, nil, keys.AppendPart(nil, keys.S("c")), false, func(_, _ []byte, _ uint64, _ []byte) bool { n++; return true }); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := read(); n != 10 {
		t.Fatalf("%d postings, want 10", n)
	}
	awaitFor(t, "reads that step over a few values after the read's flush", func() bool { return hiddenSteps(t, p) <= 100 })
	if got := e.readFlushes.Load(); got != 1 {
		t.Fatalf("%d flushes, want 1", got)
	}
	// More toggles and reads within the hour: asked, not started.
	for j := range 20000 {
		put(5, string(rune('a'+j%2)))
	}
	read()
	read()
	if n := hiddenSteps(t, p); n < 10000 {
		t.Fatalf("a second flush within the interval: %d hidden values left", n)
	}
	if got := e.readFlushes.Load(); got != 1 {
		t.Fatalf("%d flushes within the interval, want 1", got)
	}
	closed := make(chan error, 1)
	go func() { closed <- e.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close waits for the flush interval")
	}
}

// TestReadFlushesSkipASmallMemtable: a collection whose 20,000 documents
// were each inserted and deleted (a queue) leaves that many tombstones,
// which a read of it steps over. The first read's flush takes them out
// of the memtable, where they can be stepped over fast; the reads after
// it step over them in a table, which only compactions clear, and a
// flush of a memtable that holds nothing would only add a small table:
// they are not granted one.
func TestReadFlushesSkipASmallMemtable(t *testing.T) {
	e, err := Open(t.TempDir(), Options{ReadFlushInterval: time.Millisecond, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	p, err := e.Partition("db", 1)
	if err != nil {
		t.Fatal(err)
	}
	key := func(i int64) []keys.Part { return []keys.Part{keys.S("q"), keys.I(i)} }
	for i := range int64(20000) {
		if _, err := p.Update(func(tx *Tx) error {
			if _, err := tx.Put("T", key(i), 1, []byte("job")); err != nil {
				return err
			}
			_, err := tx.Delete("T", key(i))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Update(func(tx *Tx) error { _, err := tx.Put("T", key(20000), 1, []byte("live")); return err }); err != nil {
		t.Fatal(err)
	}
	read := func() {
		n := 0
		if err := p.Scan(ScanOptions{Table: "T", Prefix: []keys.Part{keys.S("q")}}, func([]keys.Part, []byte, Doc) bool { n++; return true }); err != nil || n != 1 {
			t.Fatalf("%d documents, %v", n, err)
		}
	}
	read()
	awaitFor(t, "the first flush", func() bool {
		m := e.db.Metrics()
		return e.readFlushes.Load() == 1 && m.Flush.Count >= 1 && m.Flush.NumInProgress == 0
	})
	read()
	awaitFor(t, "the second read's request answered", func() bool { return e.readFlushSkips.Load() >= 1 })
	if got := e.readFlushes.Load(); got != 1 {
		t.Fatalf("%d flushes, want 1: the second read's memtable held nothing", got)
	}
}

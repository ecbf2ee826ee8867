package storage

import (
	"fmt"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/keys"
)

// BenchmarkScanPastARewrittenRow reads a collection of 100 rows, then
// the same after one of them was rewritten 20,000 times (as many values
// of its key in the memtable until a flush). Stepping with Next over
// those values made the second 27 times slower than the first
// (1.36–1.48 ms against 38–47 µs); NextPrefix seeks past them (50–61
// µs, the first 41–52 µs).
func BenchmarkScanPastARewrittenRow(b *testing.B) {
	e, err := Open(b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	p, err := e.Partition("db", 1)
	if err != nil {
		b.Fatal(err)
	}
	put := func(i int64) {
		if _, err := p.Update(func(tx *Tx) error {
			_, err := tx.Put("T", []keys.Part{keys.S("c"), keys.I(i)}, 1, make([]byte, 200))
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
	scan := func(b *testing.B) {
		for b.Loop() {
			n := 0
			if err := p.Scan(ScanOptions{Table: "T", Prefix: []keys.Part{keys.S("c")}}, func([]keys.Part, []byte, Doc) bool { n++; return true }); err != nil || n != 100 {
				b.Fatalf("%d rows, %v", n, err)
			}
		}
	}
	for i := range int64(100) {
		put(i)
	}
	b.Run("fresh", scan)
	for range 20000 {
		put(5)
	}
	b.Run("rewritten", scan)
}

// BenchmarkPostingsPastAToggledTerm reads the postings of tag "a" in a
// collection of 100 documents, then the same after one of them moved
// between tags "a" and "b" 20,000 times: its posting under "a" was
// written and deleted as often, each a value of one key in the
// memtable until a flush. It reads them forwards and backwards (a
// descending sort), with and without the flush such reads ask for
// (ReadFlushInterval). Stepping with Next and no flush, the toggled read
// took 6.2 ms against 20 µs fresh; with NextPrefix 3.5 ms: what remains
// is the posting under "a" while its newest value is a deletion, which
// Pebble skips one older value at a time, as Prev does every key's
// (6.0 ms). After the flush the first such read asks for: 31 and 34 µs.
func BenchmarkPostingsPastAToggledTerm(b *testing.B) {
	b.Run("flush", func(b *testing.B) { benchmarkPostingsPastAToggledTerm(b, 0) })
	b.Run("no-flush", func(b *testing.B) { benchmarkPostingsPastAToggledTerm(b, -1) })
}

func benchmarkPostingsPastAToggledTerm(b *testing.B, flushes time.Duration) {
	p := openIndexedWith(b, Options{ReadFlushInterval: flushes})
	put := func(i int64, tag string) { putWords(b, p, "c", i, tag+" word") }
	coll := keys.AppendPart(nil, keys.S("c"))
	read := func(reverse bool) func(b *testing.B) {
		return func(b *testing.B) {
			for b.Loop() {
				r := p.IndexReader()
				n := 0
				err := r.Postings("T", "tag", nil, nil, coll, reverse, func(_, _ []byte, _ uint64, _ []byte) bool { n++; return true })
				r.Close()
				if err != nil || n < 99 {
					b.Fatalf("%d postings, %v", n, err)
				}
			}
		}
	}
	for i := range int64(100) {
		put(i, "a")
	}
	b.Run("fresh", read(false))
	b.Run("fresh-reverse", read(true))
	for j := range 20000 {
		put(5, string(rune('a'+j%2)))
	}
	b.Run("toggled", read(false))
	b.Run("toggled-reverse", read(true))
}

// BenchmarkCollectionsPastBusyCounters lists the indexed collections of
// a partition of 100, then the same after 20,000 documents were
// inserted into one of them: each insert rewrote that collection's
// ordinal counter, a value of one key in the memtable until a flush.
// Stepping with Next: 4.2 ms against 23 µs fresh; NextPrefix: 36 µs
// (no flush asked for: ReadFlushInterval).
func BenchmarkCollectionsPastBusyCounters(b *testing.B) {
	p := openIndexedWith(b, Options{ReadFlushInterval: -1})
	put := func(coll string, i int64) { putWords(b, p, coll, i, "a word") }
	list := func(b *testing.B) {
		for b.Loop() {
			r := p.IndexReader()
			n := 0
			err := r.Collections("T", func([]byte) bool { n++; return true })
			r.Close()
			if err != nil || n != 100 {
				b.Fatalf("%d collections, %v", n, err)
			}
		}
	}
	for c := range 100 {
		put(fmt.Sprintf("c%03d", c), 0)
	}
	b.Run("fresh", list)
	for i := range int64(20000) {
		put("c050", i+1)
	}
	b.Run("busy", list)
}

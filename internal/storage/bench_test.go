package storage

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/cortado-db/cortado/internal/keys"
)

func benchPut(b *testing.B, size int, opts Options) {
	e, err := Open(b.TempDir(), opts)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	p, _ := e.Partition("bench", 0)
	doc := bytes.Repeat([]byte("x"), size)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		_, err := p.Update(func(tx *Tx) error {
			_, err := tx.Put("T", []keys.Part{keys.I(int64(i % 10000))}, 1, doc)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPut measures one committed write (document row, commit-log
// entry and SCN in one batch), with fsync (what an acknowledged write
// costs) and without (the engine's own overhead).
func BenchmarkPut(b *testing.B) {
	for _, size := range []int{1 << 10, 20 << 10} {
		b.Run(fmt.Sprintf("%dKB/fsync", size>>10), func(b *testing.B) { benchPut(b, size, Options{}) })
		b.Run(fmt.Sprintf("%dKB/nosync", size>>10), func(b *testing.B) { benchPut(b, size, Options{NoSync: true}) })
	}
}

// BenchmarkGet measures a point read with CRC check of a document in the
// block cache.
func BenchmarkGet(b *testing.B) {
	for _, size := range []int{1 << 10, 20 << 10} {
		b.Run(fmt.Sprintf("%dKB", size>>10), func(b *testing.B) {
			e, err := Open(b.TempDir(), Options{NoSync: true})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			p, _ := e.Partition("bench", 0)
			doc := bytes.Repeat([]byte("x"), size)
			const n = 1000
			for i := range n {
				p.Update(func(tx *Tx) error {
					_, err := tx.Put("T", []keys.Part{keys.I(int64(i))}, 1, doc)
					return err
				})
			}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if _, ok, err := p.Get("T", []keys.Part{keys.I(int64(i % n))}); !ok || err != nil {
					b.Fatal(ok, err)
				}
			}
		})
	}
}

// BenchmarkCollectionDelete measures deleting a collection of 2,000
// indexed documents (60 words each: 1 attribute and about 40 distinct
// text postings per document) in one commit: by range (the
// whole-collection mark) and document by document (as a replica that does
// not know the mark applies it).
func BenchmarkCollectionDelete(b *testing.B) {
	const docs = 2000
	var words []string
	for i := range 60 {
		words = append(words, fmt.Sprintf("w%d", (i*7)%41))
	}
	body := []byte("t1 " + strings.Join(words, " "))
	for _, mode := range []string{"range", "one-by-one"} {
		b.Run(mode, func(b *testing.B) {
			e, err := Open(b.TempDir(), Options{NoSync: true})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			e.SetIndexer(wordIndexer{})
			p, _ := e.Partition("bench", 0)
			coll := []keys.Part{keys.S("box")}
			b.ReportAllocs()
			for range b.N {
				b.StopTimer()
				_, err := p.Update(func(tx *Tx) error {
					for i := range int64(docs) {
						if _, err := tx.Put("T", []keys.Part{keys.S("box"), keys.I(i)}, 1, body); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				_, err = p.Update(func(tx *Tx) error {
					if mode == "range" {
						_, err := tx.DeleteCollection("T", coll, false)
						return err
					}
					return deleteOneByOne(tx, "T", coll)
				})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

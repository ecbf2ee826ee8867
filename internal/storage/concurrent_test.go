package storage

import (
	"bytes"
	"fmt"
	"sync"
	"testing"

	"github.com/cortado-db/cortado/internal/keys"
)

// TestConcurrentCommits runs many writers on one partition and on several
// at once: every acknowledged commit has its own SCN, the SCNs of a
// partition are consecutive, and every acknowledged write is there after
// the engine is reopened.
func TestConcurrentCommits(t *testing.T) {
	dir := t.TempDir()
	e := open(t, dir)
	const writers, each, parts = 16, 25, 3
	type ack struct {
		part int
		key  string
		scn  SCN
	}
	acks := make(chan ack, writers*each)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			p, err := e.Partition("db", w%parts)
			if err != nil {
				t.Error(err)
				return
			}
			for i := range each {
				k := fmt.Sprintf("w%d-%d", w, i)
				scn, err := p.Update(func(tx *Tx) error {
					_, err := tx.Put("T", []keys.Part{keys.S(k)}, 1, []byte(k))
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
				acks <- ack{w % parts, k, scn}
			}
		})
	}
	wg.Wait()
	close(acks)
	seen := map[int]map[SCN]bool{}
	var all []ack
	for a := range acks {
		if seen[a.part] == nil {
			seen[a.part] = map[SCN]bool{}
		}
		if seen[a.part][a.scn] {
			t.Fatalf("partition %d: scn %s acknowledged twice", a.part, a.scn)
		}
		seen[a.part][a.scn] = true
		all = append(all, a)
	}
	for id := range parts {
		p, _ := e.Partition("db", id)
		if got, want := p.SCN(), (SCN{Gen: 1, Seq: uint64(len(seen[id]))}); got != want {
			t.Fatalf("partition %d at %s, want %s (consecutive SCNs)", id, got, want)
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open(t, dir)
	defer e.Close()
	for _, a := range all {
		p, _ := e.Partition("db", a.part)
		d, ok, err := p.Get("T", []keys.Part{keys.S(a.key)})
		if err != nil || !ok || !bytes.Equal(d.Value, []byte(a.key)) || d.SCN != a.scn {
			t.Fatalf("after reopen, %s: %v %v %q %s (acknowledged at %s)", a.key, ok, err, d.Value, d.SCN, a.scn)
		}
	}
}

// BenchmarkPutParallel measures fsynced writes from many goroutines at
// once, to one partition (serialized through its fsyncs) and spread over
// 16 (which share fsyncs in Pebble's commit pipeline).
func BenchmarkPutParallel(b *testing.B) {
	for _, parts := range []int{1, 16} {
		b.Run(fmt.Sprintf("partitions=%d", parts), func(b *testing.B) {
			e, err := Open(b.TempDir(), Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			doc := bytes.Repeat([]byte("x"), 1<<10)
			var mu sync.Mutex
			next := 0
			b.SetBytes(int64(len(doc)))
			b.ReportAllocs()
			b.SetParallelism(32)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				mu.Lock()
				w := next
				next++
				mu.Unlock()
				p, _ := e.Partition("bench", w%parts)
				i := 0
				for pb.Next() {
					i++
					_, err := p.Update(func(tx *Tx) error {
						_, err := tx.Put("T", []keys.Part{keys.I(int64(w)), keys.I(int64(i % 1000))}, 1, doc)
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

package storage

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cortado-db/cortado/internal/keys"
)

// sameAsPebble checks that every key's read through the row cache gives
// what Pebble holds, reading each twice so that the second is a hit.
func sameAsPebble(t *testing.T, p *Partition, step string, ks ...string) {
	t.Helper()
	for range 2 {
		for _, k := range ks {
			key := []keys.Part{keys.S(k)}
			got, gotOK, err := p.Get("T", key)
			if err != nil {
				t.Fatal(err)
			}
			want, wantOK, err := getDoc(p.e.db, p.dataKey("T", key))
			if err != nil {
				t.Fatal(err)
			}
			if gotOK != wantOK || !bytes.Equal(got.Value, want.Value) || got.SCN != want.SCN {
				t.Fatalf("%s: %s read %v %q at %s, Pebble holds %v %q at %s", step, k, gotOK, got.Value, got.SCN, wantOK, want.Value, want.SCN)
			}
		}
	}
}

// TestRowCacheHidesARowBeingWritten reads a key while a commit's batch
// that writes it is applied to Pebble and its row not yet put in the
// cache: the read must not answer with the row the batch replaced, which a
// scan of Pebble no longer finds.
func TestRowCacheHidesARowBeingWritten(t *testing.T) {
	p := solo(t, 1)
	put(t, p, "a", "1")
	sameAsPebble(t, p, "cached", "a")
	var during string
	rowsApplied = func() {
		d, _, err := p.Get("T", []keys.Part{keys.S("a")})
		if err != nil {
			t.Error(err)
		}
		during = string(d.Value)
	}
	defer func() { rowsApplied = nil }()
	put(t, p, "a", "2")
	if during != "2" {
		t.Fatalf("between the apply and the cache's update, a read %q, want 2 (Pebble's)", during)
	}
	sameAsPebble(t, p, "after", "a")
}

// TestRowCacheFollowsEveryWrite reads every key through the cache after
// each kind of write a partition takes (a commit, a transaction that reads
// first, a delete, a row written and deleted at once, a slave's apply, a
// truncation, an install, one abandoned) and compares with Pebble.
func TestRowCacheFollowsEveryWrite(t *testing.T) {
	m, s := pair(t, 1)
	ks := []string{"a", "b", "c", "d", "gone"}
	sameAsPebble(t, m, "empty", ks...)
	put(t, m, "a", "1")
	put(t, m, "b", "1")
	sameAsPebble(t, m, "puts", ks...)
	put(t, m, "a", "2")
	sameAsPebble(t, m, "update", ks...)

	// A transaction's pre-image comes through the cache: the log must
	// still record the value it replaced.
	scn, err := m.Update(func(tx *Tx) error {
		d, ok, err := tx.Get("T", []keys.Part{keys.S("a")})
		if err != nil || !ok || string(d.Value) != "2" {
			return fmt.Errorf("in a transaction, a reads %v %q %v", ok, d.Value, err)
		}
		_, err = tx.Put("T", []keys.Part{keys.S("a")}, 1, []byte("3"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	m.ReadLog(SCN{Gen: scn.Gen, Seq: scn.Seq - 1}, func(c Commit) bool {
		if e := c.Events[0]; string(e.PrevValue) != "2" || string(e.Value) != "3" {
			t.Fatalf("commit %s replaced %q by %q, want 2 by 3", c.SCN, e.PrevValue, e.Value)
		}
		return false
	})
	sameAsPebble(t, m, "transaction", ks...)
	// A key written twice in one transaction, in rows of other sizes:
	// the second row is what the cache holds. In the second transaction
	// the first put replaces d's slot (another size) and the second
	// fits the slot it replaced, which must not take it.
	for _, vs := range [][2]string{{"44", "5"}, {"666", "7"}} {
		if _, err := m.Update(func(tx *Tx) error {
			for _, v := range vs {
				if _, err := tx.Put("T", []keys.Part{keys.S("d")}, 1, []byte(v)); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		sameAsPebble(t, m, "written twice", ks...)
	}
	if _, err := m.Update(func(tx *Tx) error { _, err := tx.Delete("T", []keys.Part{keys.S("b")}); return err }); err != nil {
		t.Fatal(err)
	}
	sameAsPebble(t, m, "delete", ks...)
	// A row written and deleted by one transaction is not cached.
	if _, err := m.Update(func(tx *Tx) error {
		if _, err := tx.Put("T", []keys.Part{keys.S("c")}, 1, []byte("brief")); err != nil {
			return err
		}
		_, err := tx.Delete("T", []keys.Part{keys.S("c")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	sameAsPebble(t, m, "put and delete", ks...)
	// What a commit writes is in the cache: reading it misses nothing.
	put(t, m, "c", "0")
	_, _, misses := m.e.RowCache()
	if d, ok, _ := m.Get("T", []keys.Part{keys.S("c")}); !ok || string(d.Value) != "0" {
		t.Fatalf("c written as 0 reads %v %q", ok, d.Value)
	}
	if _, _, after := m.e.RowCache(); after != misses {
		t.Fatalf("a row just written was read from Pebble (%d misses, then %d)", misses, after)
	}

	// A slave reads what it applies.
	sameAsPebble(t, s, "slave empty", ks...)
	replicate(t, m, s)
	sameAsPebble(t, s, "slave apply", ks...)
	at := s.SCN()
	put(t, m, "a", "4")
	put(t, m, "c", "1")
	replicate(t, m, s)
	// The slave emptied a's slot and left it empty: the read after its
	// apply goes to Pebble.
	_, _, misses = s.e.RowCache()
	if d, _, _ := s.Get("T", []keys.Part{keys.S("a")}); string(d.Value) != "4" {
		t.Fatalf("on the slave a reads %q, want 4", d.Value)
	}
	if _, _, after := s.e.RowCache(); after != misses+1 {
		t.Fatalf("a row a slave applied was read from the cache (%d misses, then %d)", misses, after)
	}
	sameAsPebble(t, s, "slave apply 2", ks...)

	// A truncation puts pre-images back.
	if _, err := s.TruncateAfter(at); err != nil {
		t.Fatal(err)
	}
	sameAsPebble(t, s, "truncation", ks...)
	if d, _, _ := s.Get("T", []keys.Part{keys.S("a")}); string(d.Value) != "3" {
		t.Fatalf("after the truncation a is %q, want 3", d.Value)
	}

	// An install empties the partition first; reads meanwhile see what
	// Pebble holds, and after it, the snapshot's rows.
	snap, err := m.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	in, err := s.BeginInstall()
	if err != nil {
		t.Fatal(err)
	}
	sameAsPebble(t, s, "install begun", ks...)
	if err := snap.Rows(func(r Row) error { return in.Row(r) }); err != nil {
		t.Fatal(err)
	}
	sameAsPebble(t, s, "install rows", ks...)
	if _, err := in.Finish(snap.SCN, snap.History, snap.Acked, nil); err != nil {
		t.Fatal(err)
	}
	sameAsPebble(t, s, "install finished", ks...)
	if d, _, _ := s.Get("T", []keys.Part{keys.S("c")}); string(d.Value) != "1" {
		t.Fatalf("after the install c is %q, want 1", d.Value)
	}
	in, err = s.BeginInstall()
	if err != nil {
		t.Fatal(err)
	}
	in.Abort()
	sameAsPebble(t, s, "install abandoned", ks...)

	if _, hits, _ := m.e.RowCache(); hits == 0 {
		t.Fatal("no read was answered by the cache")
	}
}

// TestRowCacheReadsAreLinearizable runs writers and readers of a few keys
// at once. A read must return the newest write acknowledged before it
// began, or a later one, and a reader must never go back to an older
// value of a key it read.
func TestRowCacheReadsAreLinearizable(t *testing.T) {
	p := solo(t, 1)
	const nkeys, writers, readers, writes = 4, 4, 4, 300
	var acked [nkeys]atomic.Uint64 // the newest acknowledged sequence of each key
	var stop atomic.Bool
	var wg, rg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range writes {
				k := (w + i) % nkeys
				scn, err := p.Update(func(tx *Tx) error {
					_, err := tx.Put("T", []keys.Part{keys.I(int64(k))}, 1, []byte(fmt.Sprint(w, i)))
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
				for {
					cur := acked[k].Load()
					if cur >= scn.Seq || acked[k].CompareAndSwap(cur, scn.Seq) {
						break
					}
				}
			}
		})
	}
	var reads atomic.Int64
	for range readers {
		rg.Go(func() {
			var seen [nkeys]uint64
			for i := 0; !stop.Load(); i++ {
				k := i % nkeys
				floor := acked[k].Load()
				d, ok, err := p.Get("T", []keys.Part{keys.I(int64(k))})
				if err != nil {
					t.Error(err)
					return
				}
				if floor > 0 && (!ok || d.SCN.Seq < floor) {
					t.Errorf("key %d read at %s (found %v) after %d was acknowledged", k, d.SCN, ok, floor)
					return
				}
				if ok && d.SCN.Seq < seen[k] {
					t.Errorf("key %d read at %s after this reader read it at %d", k, d.SCN, seen[k])
					return
				}
				if ok {
					seen[k] = d.SCN.Seq
				}
				reads.Add(1)
			}
		})
	}
	wg.Wait()
	stop.Store(true)
	rg.Wait()
	if _, hits, _ := p.e.RowCache(); hits == 0 || reads.Load() == 0 {
		t.Fatalf("%d reads, %d answered by the cache", reads.Load(), hits)
	}
}

// TestRowCacheStaysWithinItsBytes writes and reads ten times more rows
// than a small cache holds, and a few hot rows among them: the cache
// holds no more than its bytes, reuses the entries it evicts, keeps the
// rows read again (the clock's second chance), leaves out a row larger
// than a shard holds, and every read gives what Pebble holds.
func TestRowCacheStaysWithinItsBytes(t *testing.T) {
	const limit = rowShards * 8 << 10 // eight 1 KB rows a shard
	e, err := Open(t.TempDir(), Options{NoSync: true, RowCacheBytes: limit, ProbeInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	p, _ := e.Partition("db", 1)
	value := strings.Repeat("v", 1000)
	hot := []string{"hot0", "hot1", "hot2", "hot3"}
	var cold []string
	for i := range 10 * limit / 1024 {
		cold = append(cold, fmt.Sprint("cold", i))
	}
	for _, k := range append(slices.Clone(hot), cold...) {
		put(t, p, k, value)
	}
	sameAsPebble(t, p, "hot", hot...) // the writes of cold ones evicted them
	hotMisses := uint64(0)
	for i, k := range cold {
		sameAsPebble(t, p, "cold", k)
		if i%16 == 0 {
			_, _, before := e.RowCache()
			sameAsPebble(t, p, "hot", hot...)
			_, _, after := e.RowCache()
			hotMisses += after - before
		}
	}
	if hotMisses != 0 {
		t.Fatalf("the rows read all along were evicted: %d misses reading them", hotMisses)
	}
	bytes, _, _ := e.RowCache()
	if bytes > limit {
		t.Fatalf("the cache holds %d bytes, its limit is %d", bytes, limit)
	}
	most := 0
	for i := range e.rows.shards {
		most = max(most, len(e.rows.shards[i].entries))
	}
	if most > limit/rowShards/(1000+rowOverhead)+1 {
		t.Fatalf("a shard has %d entries: evicted ones are not reused", most)
	}
	// A row larger than a shard's share is read from Pebble each time
	// and takes nothing out of the cache.
	put(t, p, "big", strings.Repeat("b", limit/rowShards+1))
	sameAsPebble(t, p, "big", "big")
	if after, _, _ := e.RowCache(); after > limit {
		t.Fatalf("after a row larger than a shard, the cache holds %d bytes", after)
	}
	sameAsPebble(t, p, "hot after big", hot...)
}

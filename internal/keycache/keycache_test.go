package keycache

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
)

// clock is a test's time: it moves only when told.
type clock struct{ at atomic.Int64 }

func (c *clock) now() time.Time           { return time.Unix(0, c.at.Load()) }
func (c *clock) move(d time.Duration)     { c.at.Add(int64(d)) }
func newCache(o Options) (*Cache, *clock) { c := &clock{}; o.Now = c.now; return New(o), c }

func item(body string) *node.Item {
	return &node.Item{Body: []byte(body), BodyVersion: 1, ETag: `"e"`}
}

// fill reads k as a miss would: Begin, then Put of what was read.
func fill(c *Cache, k, body string) {
	c.Put(c.Begin(k), item(body))
}

func TestAnswersNoOlderThanTheReadAccepts(t *testing.T) {
	c, clk := newCache(Options{MaxAge: 5 * time.Second})
	k := Key("d", "T", []keys.Part{keys.S("a")})
	if _, _, ok := c.Get(k, time.Hour); ok {
		t.Fatal("an empty cache answered")
	}
	fill(c, k, "v1")
	clk.move(2 * time.Second)
	it, age, ok := c.Get(k, 3*time.Second)
	if !ok || string(it.Body) != "v1" || age != 2*time.Second {
		t.Fatalf("a read accepting 3 s of an entry 2 s old: %v %v %v", ok, age, it)
	}
	if _, _, ok := c.Get(k, time.Second); ok {
		t.Fatal("a read accepting 1 s was answered with an entry 2 s old")
	}
	clk.move(4 * time.Second)
	if _, _, ok := c.Get(k, 365*24*time.Hour); ok {
		t.Fatal("a read accepting any staleness was answered past MaxAge (6 s > 5 s)")
	}
	// A slave's answer is as old as the slave was behind when it
	// answered.
	r := c.Begin(k)
	clk.move(time.Second)
	c.Put(r, &node.Item{Body: []byte("v2"), Stale: 3 * time.Second})
	if _, age, ok := c.Get(k, 5*time.Second); !ok || age != 4*time.Second {
		t.Fatalf("a slave's answer 3 s behind, read 1 s ago: age %v (%v), want 4s", age, ok)
	}
	if _, _, ok := c.Get(k, 3*time.Second); ok {
		t.Fatal("a slave's answer 4 s old was given to a read accepting 3 s")
	}
	hits, misses, _, _, _ := c.Stats()
	if hits != 2 || misses != 4 {
		t.Fatalf("hits %d, misses %d; want 2 and 4", hits, misses)
	}
}

// TestWritesDropWhatReadsFound: a write of a key drops its entry, and a
// read that began before the write began or ended keeps nothing: after
// the write returns, its router answers no older value.
func TestWritesDropWhatReadsFound(t *testing.T) {
	c, _ := newCache(Options{})
	k := Key("d", "T", []keys.Part{keys.S("a")})
	other := Key("d", "T", []keys.Part{keys.S("b")})
	fill(c, k, "old")
	fill(c, other, "other")
	c.Writing(k)
	if _, _, ok := c.Get(k, time.Hour); ok {
		t.Fatal("the entry of a key being written answered")
	}
	// Read before the write began, answered after: not kept.
	before := c.Begin(k)
	c.Writing(k)
	c.Put(before, item("old"))
	// Read while the write was in progress, answered after it ended.
	during := c.Begin(k)
	c.Written(k)
	c.Put(during, item("old"))
	if _, _, ok := c.Get(k, time.Hour); ok {
		t.Fatal("a read that overlapped a write kept its answer")
	}
	// Read while the write was in progress, kept before it ended: the
	// end drops it.
	during = c.Begin(k)
	c.Writing(k)
	fill(c, k, "old") // a read begun after Writing may still see the old value
	c.Written(k)
	if _, _, ok := c.Get(k, time.Hour); ok {
		t.Fatal("an entry kept during a write outlived it")
	}
	c.Put(during, item("old"))
	if _, _, ok := c.Get(k, time.Hour); ok {
		t.Fatal("a read that overlapped a write kept its answer")
	}
	if _, _, ok := c.Get(other, time.Hour); !ok {
		t.Fatal("a write of one key dropped another's entry")
	}
	fill(c, k, "new")
	if it, _, ok := c.Get(k, time.Hour); !ok || string(it.Body) != "new" {
		t.Fatal("a read after the write was not kept")
	}
	if _, _, skipped, _, _ := c.Stats(); skipped != 3 {
		t.Fatalf("%d answers not kept, want 3", skipped)
	}
}

func TestACollectionsDeleteDropsItsDocuments(t *testing.T) {
	c, _ := newCache(Options{})
	in := []string{
		Key("d", "T", []keys.Part{keys.S("box"), keys.I(1)}),
		Key("d", "T", []keys.Part{keys.S("box"), keys.I(2)}),
	}
	out := []string{
		Key("d", "T", []keys.Part{keys.S("boxes"), keys.I(1)}),
		Key("d", "U", []keys.Part{keys.S("box"), keys.I(1)}),
		Key("e", "T", []keys.Part{keys.S("box"), keys.I(1)}),
	}
	for _, k := range append(in, out...) {
		fill(c, k, "v")
	}
	r := c.Begin(in[0])
	c.WritingUnder(Key("d", "T", []keys.Part{keys.S("box")}))
	c.Put(r, item("v"))
	for _, k := range in {
		if _, _, ok := c.Get(k, time.Hour); ok {
			t.Fatalf("%q outlived its collection's delete", k)
		}
	}
	for _, k := range out {
		if _, _, ok := c.Get(k, time.Hour); !ok {
			t.Fatalf("%q, of another collection, was dropped", k)
		}
	}
}

// TestBoundedAndKeepsHotKeys: the cache holds no more than its bytes,
// and keys read again and again stay while keys read once each go
// through it, twice its size between two reads of a hot key (W-TinyLFU's
// admission: a least-recently-used cache would hold none of them).
func TestBoundedAndKeepsHotKeys(t *testing.T) {
	const maxBytes = 1 << 20
	c, _ := newCache(Options{MaxBytes: maxBytes})
	body := strings.Repeat("x", 1000)
	read := func(k string) {
		if _, _, ok := c.Get(k, time.Hour); !ok {
			fill(c, k, body)
		}
		if _, _, _, _, b := c.Stats(); b > maxBytes {
			t.Fatalf("%d bytes held, bound %d", b, maxBytes)
		}
	}
	hot := make([]string, 100)
	for i := range hot {
		hot[i] = Key("d", "T", []keys.Part{keys.I(int64(i))})
	}
	// Each hot key is read once every 2,000 cold keys (2.4 MB, more
	// than the cache holds).
	for i := range 40_000 {
		read(Key("d", "T", []keys.Part{keys.S(fmt.Sprint("cold", i))}))
		if i%20 == 0 {
			read(hot[i/20%len(hot)])
		}
	}
	held := 0
	for _, k := range hot {
		if _, _, ok := c.Get(k, time.Hour); ok {
			held++
		}
	}
	hits, misses, _, entries, b := c.Stats()
	t.Logf("hits %d, misses %d, %d entries, %d bytes; %d of %d hot keys held", hits, misses, entries, b, held, len(hot))
	if held < 95 {
		t.Fatalf("%d of %d hot keys held among 40,000 cold ones", held, len(hot))
	}
}

func TestOff(t *testing.T) {
	c := New(Options{MaxBytes: -1})
	if c != nil {
		t.Fatal("a cache of negative bytes is not off")
	}
	k := Key("d", "T", []keys.Part{keys.S("a")})
	fill(c, k, "v")
	c.Writing(k)
	c.WritingUnder("d")
	if _, _, ok := c.Get(k, time.Hour); ok {
		t.Fatal("a cache that is off answered")
	}
	if h, m, s, e, b := c.Stats(); h+m+s+uint64(e)+b != 0 {
		t.Fatal("a cache that is off counts")
	}
}

// Package keycache is a router's hot-key cache: documents read by full
// key, kept in the router's memory with how old they may be, so that a
// read that accepts a stale answer (Cache-Control: max-stale) of a key
// read often is answered without a storage node.
//
// It owns its entries and their eviction: otter's W-TinyLFU, bounded by
// the entries' bytes, so a key read once does not push out a key read
// often. It never answers a read that did not accept staleness (the
// router does not ask it), never answers with an entry older than the
// read accepts or than Options.MaxAge, never keeps an entry that a write
// through its router may have made older than its read time says, and
// starts no goroutine (otter's maintenance runs on the calling one).
//
// Writes through other routers are not seen: an entry is as stale as the
// time since its read, which is what a max-stale read bounds.
package keycache

import (
	"hash/maphash"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/maypok86/otter/v2"
)

// Options configures a Cache.
type Options struct {
	// MaxBytes bounds the bytes of the documents kept (and a fixed
	// overhead an entry); default DefaultMaxBytes, negative: no cache.
	MaxBytes int64
	// MaxAge is the oldest an answer from the cache may be, whatever
	// the read accepts (default DefaultMaxAge): a read with max-stale
	// and no value accepts any staleness.
	MaxAge time.Duration
	// Now is the clock (default time.Now); tests set it.
	Now func() time.Time
}

// Defaults of Options.
const (
	DefaultMaxBytes = 64 << 20
	DefaultMaxAge   = 5 * time.Second
)

// entryOverhead is what an entry is counted for besides its document's
// bytes and key: the item, otter's node, the map's slot.
const entryOverhead = 256

// stripes is how many write counters the keys hash onto (see Cache.Begin).
const stripes = 1024

// Cache is a router's hot-key cache. A nil *Cache is a cache that is off:
// it finds nothing and keeps nothing.
type Cache struct {
	c      *otter.Cache[string, *entry]
	opts   Options
	seed   maphash.Seed
	writes [stripes]atomic.Uint64
	// hits and misses count Get's answers; skipped counts reads whose
	// answer was not kept because a write of their key went through
	// this router meanwhile.
	hits, misses, skipped atomic.Uint64
}

type entry struct {
	item *node.Item
	// read is when the document was as the item says, at the latest:
	// when its read was sent, less the staleness of the slave that
	// answered it.
	read time.Time
}

// New returns a cache, or nil if o.MaxBytes is negative.
func New(o Options) *Cache {
	if o.MaxBytes < 0 {
		return nil
	}
	if o.MaxBytes == 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.MaxAge <= 0 {
		o.MaxAge = DefaultMaxAge
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	c := otter.Must(&otter.Options[string, *entry]{
		MaximumWeight: uint64(o.MaxBytes),
		Weigher: func(k string, e *entry) uint32 {
			return uint32(min(len(k)+len(e.item.Body)+len(e.item.ETag)+entryOverhead, 1<<31))
		},
		// Maintenance (eviction) on the goroutine that reads or writes
		// the cache: otter's default starts goroutines nobody stops.
		Executor: func(fn func()) { fn() },
	})
	return &Cache{c: c, opts: o, seed: maphash.MakeSeed()}
}

// Key is the cache's key of a document: its database, table and full key.
func Key(db, table string, key []keys.Part) string {
	b := make([]byte, 0, len(db)+len(table)+2+16*len(key))
	b = append(append(append(append(b, db...), 0), table...), 0)
	return string(keys.AppendParts(b, key))
}

// Get returns the document kept under k if it is at most maxStale old
// (and at most Options.MaxAge), and how old it may be.
func (c *Cache) Get(k string, maxStale time.Duration) (*node.Item, time.Duration, bool) {
	if c == nil {
		return nil, 0, false
	}
	if e, ok := c.c.GetIfPresent(k); ok {
		if age := c.opts.Now().Sub(e.read); age <= min(maxStale, c.opts.MaxAge) {
			c.hits.Add(1)
			return e.item, max(age, 0), true
		}
	}
	c.misses.Add(1)
	return nil, 0, false
}

// A Read is a read of one key that may fill the cache (Begin).
type Read struct {
	k      string
	stripe *atomic.Uint64
	writes uint64
	sent   time.Time
}

// Begin starts a read of k whose answer Put may keep. A zero Read (the
// cache is off) keeps nothing.
func (c *Cache) Begin(k string) Read {
	if c == nil {
		return Read{}
	}
	s := c.stripe(k)
	return Read{k: k, stripe: s, writes: s.Load(), sent: c.opts.Now()}
}

// stripe is the write counter of k's stripe.
func (c *Cache) stripe(k string) *atomic.Uint64 {
	return &c.writes[maphash.String(c.seed, k)%stripes]
}

// Put keeps the answer of read r, as stale as the slave that answered
// said (0 for a master): unless a write of a key of r's stripe began
// through this router since r began, which may have changed it after
// the read.
func (c *Cache) Put(r Read, it *node.Item) {
	if c == nil || r.stripe == nil {
		return
	}
	if r.stripe.Load() != r.writes {
		c.skipped.Add(1)
		return
	}
	c.c.Set(r.k, &entry{item: it, read: r.sent.Add(-it.Stale)})
	// A write that began between the check and the Set: it removes
	// the entry when it ends (Written), and this removes it now.
	if r.stripe.Load() != r.writes {
		c.c.Invalidate(r.k)
	}
}

// Writing tells the cache that a write of k begins: reads begun before
// it keep nothing, and k's entry is dropped.
func (c *Cache) Writing(k string) {
	if c == nil {
		return
	}
	c.stripe(k).Add(1)
	c.c.Invalidate(k)
}

// Written tells the cache that a write of k ended, whatever its outcome:
// an entry a read put meanwhile is dropped.
func (c *Cache) Written(k string) {
	if c == nil {
		return
	}
	c.Writing(k)
}

// WritingUnder drops the entries of every key that starts with prefix
// (a collection's delete), and makes reads begun before it keep nothing.
// It walks the whole cache: collection deletes are rare.
func (c *Cache) WritingUnder(prefix string) {
	if c == nil {
		return
	}
	for i := range c.writes {
		c.writes[i].Add(1)
	}
	for k := range c.c.Keys() {
		if strings.HasPrefix(k, prefix) {
			c.c.Invalidate(k)
		}
	}
}

// Stats returns the cache's hits and misses, the answers it did not keep
// because of a write, and its entries and their weight in bytes.
func (c *Cache) Stats() (hits, misses, skipped uint64, entries int, bytes uint64) {
	if c == nil {
		return 0, 0, 0, 0, 0
	}
	return c.hits.Load(), c.misses.Load(), c.skipped.Load(), c.c.EstimatedSize(), c.c.WeightedSize()
}

package storage

import (
	"hash/maphash"
	"math/bits"
	"sync/atomic"

	"github.com/maypok86/otter/v2"
)

// The row cache holds documents read by key (Partition.Get, and a
// transaction's first read), decoded and CRC-checked, and those a commit
// or a slave's apply just wrote, in front of Pebble's point read, which
// was about 60 % of a GET's handler. It is bounded in bytes
// (Options.RowCacheBytes) and evicts by W-TinyLFU.
//
// It is never consulted for what Pebble no longer holds. Each partition
// has rowStripes stamps; a data key belongs to one by hash. Every batch
// that writes rows moves the stamps of the keys it writes to an odd value
// before it is applied and to the next even value after, under the
// partition's lock (a truncation or an install moves them all). An entry
// records the stamp its key had, even, before the row was read from
// Pebble, and is served only while the stamp is still that value:
//   - a write that was applied before the stamp was read is in what the
//     read found;
//   - a write in progress when it was read makes it odd, and nothing is
//     cached;
//   - a write that starts later moves the stamp before its rows become
//     visible, and the entry is never served again.
//
// A row a batch wrote is put in the cache after the second move, still
// under the lock, with the stamp as it then is: what Pebble now holds.
// So a hit returns what a read of Pebble would have returned at some
// moment between the call and its return.
const rowStripes = 256

// rowCache is an engine's cache of rows; nil when it has none.
type rowCache struct {
	c            *otter.Cache[string, cachedRow]
	seed         maphash.Seed
	hits, misses atomic.Uint64
}

type cachedRow struct {
	stamp uint64
	doc   Doc // Value is the cache's own and never written to
}

// rowOverhead is about what an entry costs besides its key and value: the
// entry, its node in otter's table and policy, and the Doc.
const rowOverhead = 160

func newRowCache(bytes int64) *rowCache {
	if bytes <= 0 {
		return nil
	}
	return &rowCache{
		seed: maphash.MakeSeed(),
		c: otter.Must(&otter.Options[string, cachedRow]{
			MaximumWeight: uint64(bytes),
			Weigher: func(k string, v cachedRow) uint32 {
				return uint32(min(len(k)+len(v.doc.Value)+rowOverhead, 1<<31))
			},
			// Maintenance runs on the goroutine that reads or writes
			// the cache: the cache starts none of its own.
			Executor: func(fn func()) { fn() },
		}),
	}
}

// RowCache returns what the engine's row cache holds, in bytes, and how
// many reads it has answered and missed (zeros without one).
func (e *Engine) RowCache() (bytes, hits, misses uint64) {
	rc := e.rows
	if rc == nil {
		return 0, 0, 0
	}
	return rc.c.WeightedSize(), rc.hits.Load(), rc.misses.Load()
}

// stripe is the stamp that guards data key k.
func (p *Partition) stripe(k []byte) *atomic.Uint64 {
	return &p.stamps[maphash.Bytes(p.e.rows.seed, k)%rowStripes]
}

// cachedGet reads the document at data key k through the row cache,
// reading Pebble (r) on a miss.
func (p *Partition) cachedGet(r getter, k []byte) (Doc, bool, error) {
	rc := p.e.rows
	if rc == nil {
		return getDoc(r, k)
	}
	s := p.stripe(k)
	stamp := s.Load()
	if v, ok := rc.c.GetIfPresent(string(k)); ok && v.stamp == stamp {
		rc.hits.Add(1)
		return v.doc, true, nil
	}
	rc.misses.Add(1)
	d, ok, err := getDoc(r, k)
	if err != nil || !ok || stamp%2 == 1 {
		return d, ok, err
	}
	rc.c.Set(string(k), cachedRow{stamp: stamp, doc: d})
	return d, ok, nil
}

// rowWrites is what a batch writes to rows: their stripes, and the rows
// themselves to put in the cache once the batch is applied (a database's
// buffer pool holds what was written too). The caller holds the
// partition's lock from the first move to the fill.
type rowWrites struct {
	p       *Partition
	set     [rowStripes / 64]uint64
	written []writtenRow
}

type writtenRow struct {
	k       []byte
	doc     Doc
	deleted bool
}

// put notes that the batch writes d at data key k.
func (w *rowWrites) put(k []byte, d Doc) {
	if w.p.e.rows == nil {
		return
	}
	w.stripe(k)
	w.written = append(w.written, writtenRow{k: k, doc: d})
}

// del notes that the batch deletes the row at data key k.
func (w *rowWrites) del(k []byte) {
	if w.p.e.rows == nil {
		return
	}
	w.stripe(k)
	w.written = append(w.written, writtenRow{k: k, deleted: true})
}

func (w *rowWrites) stripe(k []byte) {
	i := maphash.Bytes(w.p.e.rows.seed, k) % rowStripes
	w.set[i/64] |= 1 << (i % 64)
}

// all notes that the batch may write any row of the partition (it fills
// nothing).
func (w *rowWrites) all() {
	for i := range w.set {
		w.set[i] = ^uint64(0)
	}
	w.written = nil
}

// move moves the noted stripes' stamps by one: before the batch is
// applied (to odd) and after (to even), whether or not it was.
func (w *rowWrites) move() {
	if w.p.e.rows == nil {
		return
	}
	for i, b := range w.set {
		for ; b != 0; b &= b - 1 {
			w.p.stamps[i*64+bits.TrailingZeros64(b)].Add(1)
		}
	}
}

// fill puts the rows of an applied batch in the cache, in the order the
// batch wrote them, each under its stripe's stamp (even, after the second
// move): what a read of Pebble now finds. A row's value is copied: the
// batch's may be its caller's buffer.
func (w *rowWrites) fill() {
	rc := w.p.e.rows
	if rc == nil {
		return
	}
	for _, r := range w.written {
		if r.deleted {
			rc.c.Invalidate(string(r.k))
			continue
		}
		d := r.doc
		d.Value = append([]byte(nil), d.Value...)
		rc.c.Set(string(r.k), cachedRow{stamp: w.p.stripe(r.k).Load(), doc: d})
	}
}

package storage

import (
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/maypok86/otter/v2"
)

// The row cache holds documents read by key (Partition.Get, and a
// transaction's first read), decoded and CRC-checked, and those a commit
// just wrote, in front of Pebble's point read, which
// was about 60 % of a GET's handler. It is bounded in bytes
// (Options.RowCacheBytes) and evicts by W-TinyLFU.
//
// It never answers with a row Pebble no longer holds:
//   - A batch that writes rows (under the partition's lock) empties their
//     entries before it is applied, and a commit fills them with what it
//     wrote after (a slave's apply leaves them empty). So a row a hit
//     finds was current when the hit was made.
//   - A read that missed puts what it read from Pebble only if no write
//     of a key of its stripe began since before it read. Each partition
//     has rowStripes stripes, a data key belongs to one by hash, and a
//     stripe's stamp is odd while a batch that writes one of its keys runs
//     (moved under the partition's lock, from before the emptying to after
//     the apply). The reader takes the stamp before reading, and checks it
//     and puts the row under the stripe's mutex, which the writer holds
//     for its first move and its emptying: the read's put comes before the
//     emptying, or sees the stamp moved.
//   - A truncation or an install (which may change any row) moves the
//     partition's epoch to odd before and to even after; an entry is
//     served only with the epoch it was put under, and nothing is put
//     while it is odd.
//
// An entry is a key's slot, kept across writes: emptying it and filling
// it again are atomic stores, where removing and adding an entry in otter
// cost a PUT load 4.9 % of its CPU. A slot is weighed when otter takes it;
// a row of another size replaces the slot, so the weights stay those of
// the rows held.
const rowStripes = 256

// rowCache is an engine's cache of rows; nil when it has none.
type rowCache struct {
	c            *otter.Cache[string, *rowSlot]
	seed         maphash.Seed
	hits, misses atomic.Uint64
}

type cachedRow struct {
	epoch uint64
	doc   Doc // Value is the cache's own and never written to
}

// rowSlot is a key's entry: its row, nil while a write of the key is in
// progress.
type rowSlot struct {
	weight uint32 // what otter weighed it at: the row's size when added
	row    atomic.Pointer[cachedRow]
}

// rowWeight is what the row d of key k weighs.
func rowWeight(k []byte, d Doc) uint32 {
	return uint32(min(len(k)+len(d.Value)+rowOverhead, 1<<31))
}

// put makes row the one held for key k: in k's slot if it has one of the
// row's weight, else in a new slot. The caller holds k's stripe's mutex,
// or is the writer between begin and end.
func (rc *rowCache) put(k []byte, row *cachedRow) {
	w := rowWeight(k, row.doc)
	if s, ok := rc.c.GetIfPresent(string(k)); ok && s.weight == w {
		s.row.Store(row)
		return
	}
	s := &rowSlot{weight: w}
	s.row.Store(row)
	rc.c.Set(string(k), s)
}

// rowStripe guards the cache's entries of the keys that hash to it.
type rowStripe struct {
	mu    sync.Mutex
	stamp atomic.Uint64
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
		c: otter.Must(&otter.Options[string, *rowSlot]{
			MaximumWeight: uint64(bytes),
			Weigher:       func(_ string, s *rowSlot) uint32 { return s.weight },
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

// stripeOf is the index of data key k's stripe; the partition's engine
// has a row cache.
func (p *Partition) stripeOf(k []byte) uint64 {
	return maphash.Bytes(p.e.rows.seed, k) % rowStripes
}

// cachedGet reads the document at data key k through the row cache,
// reading Pebble (r) on a miss.
func (p *Partition) cachedGet(r getter, k []byte) (Doc, bool, error) {
	rc := p.e.rows
	if rc == nil {
		return getDoc(r, k)
	}
	epoch := p.epoch.Load()
	if s, ok := rc.c.GetIfPresent(string(k)); ok {
		if v := s.row.Load(); v != nil && v.epoch == epoch {
			rc.hits.Add(1)
			return v.doc, true, nil
		}
	}
	rc.misses.Add(1)
	s := &p.stripes[p.stripeOf(k)]
	stamp := s.stamp.Load()
	d, ok, err := getDoc(r, k)
	if err != nil || !ok || stamp%2 == 1 || epoch%2 == 1 {
		return d, ok, err
	}
	s.mu.Lock()
	if s.stamp.Load() == stamp {
		rc.put(k, &cachedRow{epoch: epoch, doc: d})
	}
	s.mu.Unlock()
	return d, ok, nil
}

// rowWrites is what a batch writes to rows, to take out of the cache
// before the batch is applied and put in after (a database's buffer pool
// holds what was written too). The caller holds the partition's lock from
// begin to end.
type rowWrites struct {
	p       *Partition
	set     [rowStripes / 64]uint64
	written []writtenRow
	// leaveEmpty is set for a slave's apply: its rows' slots stay empty
	// until a read fills them. A slave serves few reads (max-stale ones),
	// and filling the slots of all it applied was 3.5 % of serve --nodes
	// 3's CPU under a PUT load.
	leaveEmpty bool
}

type writtenRow struct {
	k       []byte
	doc     Doc
	deleted bool
}

// put notes that the batch writes d at data key k.
func (w *rowWrites) put(k []byte, d Doc) {
	if w.p.e.rows != nil {
		w.written = append(w.written, writtenRow{k: k, doc: d})
	}
}

// del notes that the batch deletes the row at data key k.
func (w *rowWrites) del(k []byte) {
	if w.p.e.rows != nil {
		w.written = append(w.written, writtenRow{k: k, deleted: true})
	}
}

// begin moves the written keys' stripes to odd and empties their slots,
// before the batch is applied.
func (w *rowWrites) begin() {
	rc := w.p.e.rows
	if rc == nil {
		return
	}
	for _, r := range w.written {
		i := w.p.stripeOf(r.k)
		w.set[i/64] |= 1 << (i % 64)
	}
	w.each(func(s *rowStripe) {
		s.mu.Lock()
		s.stamp.Add(1)
	})
	for _, r := range w.written {
		if s, ok := rc.c.GetIfPresent(string(r.k)); ok {
			s.row.Store(nil)
		}
	}
	w.each(func(s *rowStripe) { s.mu.Unlock() })
}

// end moves the stripes back to even and puts the written rows in the
// cache, in the order the batch wrote them, once it is applied; if it
// failed, nothing is put (the slots stay empty). A value is copied: the
// batch's may be its caller's buffer. A key written twice by the batch is
// put twice, its slot looked up each time: the first put may have
// replaced it.
func (w *rowWrites) end(applied bool) {
	rc := w.p.e.rows
	if rc == nil {
		return
	}
	w.each(func(s *rowStripe) { s.stamp.Add(1) })
	if !applied {
		return
	}
	epoch := w.p.epoch.Load()
	for _, r := range w.written {
		if r.deleted {
			rc.c.Invalidate(string(r.k))
			continue
		}
		if w.leaveEmpty {
			continue
		}
		d := r.doc
		d.Value = append([]byte(nil), d.Value...)
		rc.put(r.k, &cachedRow{epoch: epoch, doc: d})
	}
}

// rowsApplied, when set by a test, runs after a commit's batch is applied
// and before its rows are put in the cache.
var rowsApplied func()

func (w *rowWrites) each(fn func(*rowStripe)) {
	for i, b := range w.set {
		for ; b != 0; b &= b - 1 {
			fn(&w.p.stripes[i*64+bits.TrailingZeros64(b)])
		}
	}
}

// moveEpoch moves the partition's epoch by one, around a batch that may
// change any row: to odd before, to even after. The caller holds the
// partition's lock.
func (p *Partition) moveEpoch() { p.epoch.Add(1) }

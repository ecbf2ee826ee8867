package storage

import (
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// The row cache holds documents read by key (Partition.Get, and a
// transaction's first read), decoded and CRC-checked, and those a commit
// just wrote, in front of Pebble's point read, which
// was about 60 % of a GET's handler. It is bounded in bytes
// (Options.RowCacheBytes) and evicts by a clock that counts reads
// (GCLOCK): a row read often outlives rows written and not read since.
//
// It never answers with a row Pebble no longer holds:
//   - A batch that writes rows (under the partition's lock) takes their
//     entries out before it is applied, and a commit puts what it
//     wrote after (a slave's apply leaves them out). So a row a hit
//     finds was current when the hit was made.
//   - A read that missed puts what it read from Pebble only if no write
//     of a key of its stripe began since before it read. Each partition
//     has rowStripes stripes, a data key belongs to one by hash, and a
//     stripe's stamp is odd while a batch that writes one of its keys runs
//     (moved under the partition's lock, from before the removal to after
//     the apply). The reader takes the stamp before reading, and checks it
//     and puts the row under the stripe's mutex, which the writer holds
//     for its first move and its removals: the read's put comes before the
//     removal, or sees the stamp moved.
//   - A truncation or an install (which may change any row) moves the
//     partition's epoch to odd before and to even after; an entry is
//     served only with the epoch it was put under, and nothing is put
//     while it is odd.
//
// The cache is made for the garbage collector, which marks every object
// the heap holds at each cycle: an entry holds one pointer, to a single
// allocation of its key and value that holds none, and the index maps a
// key's hash to an entry's place in its shard's array. otter's cache,
// which this one replaced, held five objects a row (its node, the key's
// string, a slot, the row, the value); with 100,000 rows cached, the
// collector's mark took 65–83 ms of a serve under a multi-get load, and
// the requests it overlapped made the multi-get's p99.
const rowStripes = 256

// rowShards is how many shards, each under its own mutex, the cache's
// entries are split into by hash.
const rowShards = 64

// rowCache is an engine's cache of rows; nil when it has none.
type rowCache struct {
	seed         maphash.Seed
	shards       [rowShards]rowShard
	hits, misses atomic.Uint64
}

// rowShard is the entries whose keys' hashes fall in it.
type rowShard struct {
	mu      sync.Mutex
	index   map[uint64]int32 // a key's hash → its entry in entries
	entries []rowEntry
	free    []int32 // entries not in use
	hand    int     // the clock's: the entry it looks at next
	bytes   int64   // the weights of the entries in use
	budget  int64
}

// rowEntry is a cached row: a Doc of key kv[:keyLen] and value
// kv[keyLen:], with Modified kept as Unix nanoseconds (as the row
// stores it: a hit gives what Pebble's read would). kv is nil while the
// entry is not in use.
type rowEntry struct {
	hash     uint64
	kv       []byte // never written once put: a hit's Value shares it
	keyLen   int32
	crc      uint32
	reads    uint8 // reads since put, at most maxReads, less one each time the clock's hand passes
	epoch    uint64
	version  int
	scn      SCN
	modified int64
}

// rowOverhead is about what an entry costs besides its key and value: the
// entry, its place in the index and the allocation's rounding.
const rowOverhead = 128

// maxReads is how many passes of the clock's hand a row read often
// outlives.
const maxReads = 3

func (e *rowEntry) weight() int64 { return int64(len(e.kv)) + rowOverhead }

// holds reports whether the entry is key k's (its hash may be another
// key's too).
func (e *rowEntry) holds(k []byte) bool { return string(e.kv[:e.keyLen]) == string(k) }

func newRowCache(bytes int64) *rowCache {
	if bytes <= 0 {
		return nil
	}
	rc := &rowCache{seed: maphash.MakeSeed()}
	for i := range rc.shards {
		rc.shards[i].index = map[uint64]int32{}
		rc.shards[i].budget = bytes / rowShards
	}
	return rc
}

// hash is data key k's hash: it picks k's shard and stripe.
func (rc *rowCache) hash(k []byte) uint64 { return maphash.Bytes(rc.seed, k) }

// shard is the shard of a key of hash h; its top bits, so that it does
// not follow the stripe (h's low bits).
func (rc *rowCache) shard(h uint64) *rowShard { return &rc.shards[h>>58] }

// get returns the row held for key k (of hash h) if it was put under
// epoch.
func (rc *rowCache) get(h uint64, k []byte, epoch uint64) (Doc, bool) {
	s := rc.shard(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.index[h]
	if !ok {
		return Doc{}, false
	}
	e := &s.entries[i]
	if e.epoch != epoch || !e.holds(k) {
		return Doc{}, false
	}
	if e.reads < maxReads {
		e.reads++
	}
	return Doc{Version: e.version, SCN: e.scn, Modified: time.Unix(0, e.modified), CRC: e.crc, Value: e.kv[e.keyLen:]}, true
}

// put makes d, put under epoch, the row held for key k (of hash h),
// copying k and d.Value. The caller holds k's stripe's mutex, or is the
// writer between begin and end.
func (rc *rowCache) put(h uint64, k []byte, d Doc, epoch uint64) {
	s := rc.shard(h)
	kv := make([]byte, len(k)+len(d.Value))
	copy(kv[copy(kv, k):], d.Value)
	w := int64(len(kv)) + rowOverhead
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.index[h]
	if w > s.budget {
		if ok {
			s.drop(i)
		}
		return
	}
	if ok {
		s.bytes -= s.entries[i].weight()
	} else {
		if n := len(s.free); n > 0 {
			i, s.free = s.free[n-1], s.free[:n-1]
		} else {
			s.entries = append(s.entries, rowEntry{})
			i = int32(len(s.entries) - 1)
		}
		s.index[h] = i
	}
	s.entries[i] = rowEntry{hash: h, kv: kv, keyLen: int32(len(k)), crc: d.CRC, epoch: epoch,
		version: d.Version, scn: d.SCN, modified: d.Modified.UnixNano()}
	s.bytes += w
	for s.bytes > s.budget {
		s.evict(i)
	}
}

// remove takes the row of key k (of hash h) out of the cache.
func (rc *rowCache) remove(h uint64, k []byte) {
	s := rc.shard(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.index[h]; ok && s.entries[i].holds(k) {
		s.drop(i)
	}
}

// evict drops the first entry in use after the clock's hand, other than
// keep, whose reads are down to none, taking one off each it passes. The
// shard holds another entry than keep (the caller is over budget, and
// keep alone is not), so the hand finds one within maxReads+1 turns.
func (s *rowShard) evict(keep int32) {
	for {
		if s.hand >= len(s.entries) {
			s.hand = 0
		}
		i := int32(s.hand)
		s.hand++
		e := &s.entries[i]
		switch {
		case e.kv == nil || i == keep:
		case e.reads > 0:
			e.reads--
		default:
			s.drop(i)
			return
		}
	}
}

// drop frees entry i.
func (s *rowShard) drop(i int32) {
	e := &s.entries[i]
	delete(s.index, e.hash)
	s.bytes -= e.weight()
	*e = rowEntry{}
	s.free = append(s.free, i)
}

// rowStripe guards the cache's entries of the keys that hash to it.
type rowStripe struct {
	mu    sync.Mutex
	stamp atomic.Uint64
}

// RowCache returns what the engine's row cache holds, in bytes, and how
// many reads it has answered and missed (zeros without one).
func (e *Engine) RowCache() (bytes, hits, misses uint64) {
	rc := e.rows
	if rc == nil {
		return 0, 0, 0
	}
	for i := range rc.shards {
		s := &rc.shards[i]
		s.mu.Lock()
		bytes += uint64(s.bytes)
		s.mu.Unlock()
	}
	return bytes, rc.hits.Load(), rc.misses.Load()
}

// cachedGet reads the document at data key k through the row cache,
// reading Pebble (r) on a miss.
func (p *Partition) cachedGet(r getter, k []byte) (Doc, bool, error) {
	rc := p.e.rows
	if rc == nil {
		return getDoc(r, k)
	}
	h := rc.hash(k)
	epoch := p.epoch.Load()
	if d, ok := rc.get(h, k, epoch); ok {
		rc.hits.Add(1)
		return d, true, nil
	}
	rc.misses.Add(1)
	s := &p.stripeArray()[h%rowStripes]
	stamp := s.stamp.Load()
	d, ok, err := getDoc(r, k)
	if err != nil || !ok || stamp%2 == 1 || epoch%2 == 1 {
		return d, ok, err
	}
	s.mu.Lock()
	if s.stamp.Load() == stamp {
		rc.put(h, k, d, epoch)
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
	// leaveEmpty is set for a slave's apply: its rows stay out of the
	// cache until a read puts them. A slave serves few reads (max-stale
	// ones), and putting all it applied was 3.5 % of serve --nodes 3's
	// CPU under a PUT load.
	leaveEmpty bool
}

type writtenRow struct {
	k       []byte
	h       uint64 // k's hash
	doc     Doc
	deleted bool
}

// put notes that the batch writes d at data key k.
func (w *rowWrites) put(k []byte, d Doc) {
	if rc := w.p.e.rows; rc != nil {
		w.written = append(w.written, writtenRow{k: k, h: rc.hash(k), doc: d})
	}
}

// del notes that the batch deletes the row at data key k.
func (w *rowWrites) del(k []byte) {
	if rc := w.p.e.rows; rc != nil {
		w.written = append(w.written, writtenRow{k: k, h: rc.hash(k), deleted: true})
	}
}

// begin moves the written keys' stripes to odd and takes their rows out
// of the cache, before the batch is applied.
func (w *rowWrites) begin() {
	rc := w.p.e.rows
	if rc == nil {
		return
	}
	for _, r := range w.written {
		i := r.h % rowStripes
		w.set[i/64] |= 1 << (i % 64)
	}
	w.each(func(s *rowStripe) {
		s.mu.Lock()
		s.stamp.Add(1)
	})
	for _, r := range w.written {
		rc.remove(r.h, r.k)
	}
	w.each(func(s *rowStripe) { s.mu.Unlock() })
}

// end moves the stripes back to even and puts the written rows in the
// cache, in the order the batch wrote them, once it is applied; if it
// failed, nothing is put (the rows stay out). A row is copied: the
// batch's value may be its caller's buffer. A key written twice by the
// batch is put twice, and what it was written last stays.
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
		switch {
		case r.deleted:
			rc.remove(r.h, r.k)
		case !w.leaveEmpty:
			rc.put(r.h, r.k, r.doc, epoch)
		}
	}
}

// rowsApplied, when set by a test, runs after a commit's batch is applied
// and before its rows are put in the cache.
var rowsApplied func()

func (w *rowWrites) each(fn func(*rowStripe)) {
	stripes := w.p.stripeArray()
	for i, b := range w.set {
		for ; b != 0; b &= b - 1 {
			fn(&stripes[i*64+bits.TrailingZeros64(b)])
		}
	}
}

// stripeArray returns the partition's stripes, made by whichever reader
// or writer needs them first; every later use sees that one array.
func (p *Partition) stripeArray() *[rowStripes]rowStripe {
	if s := p.stripes.Load(); s != nil {
		return s
	}
	p.stripes.CompareAndSwap(nil, new([rowStripes]rowStripe))
	return p.stripes.Load()
}

// moveEpoch moves the partition's epoch by one, around a batch that may
// change any row: to odd before, to even after. The caller holds the
// partition's lock.
func (p *Partition) moveEpoch() { p.epoch.Add(1) }

package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cortado-db/cortado/internal/keys"
)

// Indexer derives the index entries of documents. Storage asks it for the
// entries of a document's pre-image and post-image on every change and
// writes the difference in the batch of the commit itself — on a master
// when it commits, on a slave when it applies the commit, when a commit is
// truncated, and when a snapshot is installed — so a query sees exactly
// the documents a read would.
type Indexer interface {
	// Index returns the entries of a document (Avro bytes of schema
	// version) of table in db; indexed is false when that version
	// indexes no field (the document then has no ordinal either).
	Index(db, table string, version int, value []byte) (entries []IndexEntry, indexed bool, err error)
}

// IndexEntry is one posting of a document: its field, an encoded term
// (order-preserving, self-delimiting), and a payload stored with it
// (word positions of a text field). Length is the field's length in words
// for a text field (the same on each of its entries), 0 otherwise.
type IndexEntry struct {
	Field   string
	Term    []byte
	Payload []byte
	Length  uint32
}

// SetIndexer installs the indexer; before any partition is written.
func (e *Engine) SetIndexer(ix Indexer) { e.indexer = ix }

// The index's keys, all in the partition's index section, P|i|…:
//
//	P|i|p|table|field|collection|term|rest → uvarint ordinal, payload  (a posting)
//	P|i|o|table|key                   → uvarint ordinal            (the document's ordinal)
//	P|i|k|table|collection|ordinal    → key                        (and back)
//	P|i|c|table|collection            → the last ordinal handed out
//	P|i|s|table|field|collection      → documents with the field, their total length
//
// The collection is the key's first part (the document group), rest the
// key's other parts. Postings are grouped by collection before term, so
// one collection's postings of a field are one contiguous range, read in
// term order either way (a sorted page stops after its last hit) — the
// queries run per collection. Ordinals
// number a collection's documents for the query's bitmaps; they are this
// replica's own (a snapshot installs in key order, a truncation does not
// hand an ordinal out again), never compared across replicas.
const (
	idxPosting  = 'p'
	idxOrdinal  = 'o'
	idxKey      = 'k'
	idxCounter  = 'c'
	idxStats    = 's'
	idxVersions = 'v' // P|i|v|table|version → documents of that schema version
)

func versionCountKey(db string, id int, table string, version int) []byte {
	return binary.BigEndian.AppendUint32(idxPrefix(db, id, idxVersions, table), uint32(version))
}

func (p *Partition) addVersionCount(b *pebble.Batch, table string, version int, delta int64) error {
	k := versionCountKey(p.DB, p.ID, table, version)
	n, _, err := readUvarint(b, k)
	if err != nil {
		return err
	}
	n = uint64(int64(n) + delta)
	if n == 0 || int64(n) < 0 {
		return b.Delete(k, nil)
	}
	return b.Set(k, binary.AppendUvarint(nil, n), nil)
}

// VersionCounts returns how many documents of each schema version table
// holds in this partition (as of now).
func (p *Partition) VersionCounts(table string) (map[int]uint64, error) {
	return versionCounts(p.e.db, p.DB, p.ID, table)
}

// VersionCounts is Partition.VersionCounts as the reader sees it.
func (r *IndexReader) VersionCounts(table string) (map[int]uint64, error) {
	return versionCounts(r.snap, r.p.DB, r.p.ID, table)
}

func versionCounts(r interface {
	NewIter(*pebble.IterOptions) (*pebble.Iterator, error)
}, db string, id int, table string) (map[int]uint64, error) {
	prefix := idxPrefix(db, id, idxVersions, table)
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: keys.PrefixEnd(prefix)})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	out := map[int]uint64{}
	// Each count is rewritten by every write of its version: NextPrefix
	// seeks past the older values Next would step over (see scan).
	for valid := it.First(); valid; valid = it.NextPrefix() {
		k := it.Key()[len(prefix):]
		n, w := binary.Uvarint(it.Value())
		if len(k) != 4 || w <= 0 {
			return nil, fmt.Errorf("version count %x: %w", it.Key(), keys.ErrCorrupt)
		}
		out[int(binary.BigEndian.Uint32(k))] = n
	}
	return out, it.Error()
}

func idxPrefix(db string, id int, kind byte, table string) []byte {
	b := append(keys.Partition(db, id), keys.SectionIdx, kind)
	return keys.AppendPart(b, keys.S(table))
}

// PostingPrefix is the prefix of the postings of field's terms in table.
func PostingPrefix(db string, id int, table, field string) []byte {
	return keys.AppendPart(idxPrefix(db, id, idxPosting, table), keys.S(field))
}

func collectionOf(key []byte) ([]byte, error) {
	_, n, err := keys.DecodePart(key)
	if err != nil {
		return nil, err
	}
	return key[:n], nil
}

// indexEvent writes to b (an indexed batch: reads see its writes) the
// index changes of one event; undo applies the event backwards (a
// truncation). prev is the event applied just before it in the same
// commit (nil if none): the first of a whole-collection delete's events
// removes the collection's entries by range, the others only count.
func (p *Partition) indexEvent(b *pebble.Batch, e *Event, undo bool, prev *Event) error {
	ix := p.e.indexer
	if ix == nil || e.Op == OpAutoIncrement {
		return nil
	}
	if e.WholeCollection && !undo {
		if err := p.addVersionCount(b, e.Table, e.PrevVersion, -1); err != nil {
			return err
		}
		coll, err := collectionOf(e.Key)
		if err != nil {
			return err
		}
		if prev != nil && prev.WholeCollection && prev.Table == e.Table && bytes.HasPrefix(prev.Key, coll) {
			return nil // the run's first event removed them
		}
		return p.clearCollection(b, e.Table, coll)
	}
	oldV, oldB, newV, newB := e.PrevVersion, e.PrevValue, e.Version, e.Value
	hasOld, hasNew := e.Op != OpInsert, e.Op != OpDelete
	if undo {
		oldV, oldB, newV, newB = newV, newB, oldV, oldB
		hasOld, hasNew = hasNew, hasOld
	}
	var olds, news []IndexEntry
	var oldIndexed, newIndexed bool
	var err error
	if hasOld {
		if olds, oldIndexed, err = ix.Index(p.DB, e.Table, oldV, oldB); err != nil {
			return fmt.Errorf("partition %s/%d: index the pre-image of %s %x: %w", p.DB, p.ID, e.Table, e.Key, err)
		}
	}
	if hasNew {
		if news, newIndexed, err = ix.Index(p.DB, e.Table, newV, newB); err != nil {
			return fmt.Errorf("partition %s/%d: index %s %x: %w", p.DB, p.ID, e.Table, e.Key, err)
		}
	}
	// How many documents of each schema version the table holds: a query
	// may use an index only if no document's version lacks it.
	if hasOld && (!hasNew || oldV != newV) {
		if err := p.addVersionCount(b, e.Table, oldV, -1); err != nil {
			return err
		}
	}
	if hasNew && (!hasOld || oldV != newV) {
		if err := p.addVersionCount(b, e.Table, newV, 1); err != nil {
			return err
		}
	}
	if !oldIndexed && !newIndexed {
		return nil
	}
	coll, err := collectionOf(e.Key)
	if err != nil {
		return err
	}
	ordKey := append(idxPrefix(p.DB, p.ID, idxOrdinal, e.Table), e.Key...)
	ord, haveOrd, err := readUvarint(b, ordKey)
	if err != nil {
		return err
	}
	if newIndexed && !haveOrd {
		ckey := append(idxPrefix(p.DB, p.ID, idxCounter, e.Table), coll...)
		last, _, err := readUvarint(b, ckey)
		if err != nil {
			return err
		}
		ord = last + 1
		if err := b.Set(ckey, binary.AppendUvarint(nil, ord), nil); err != nil {
			return err
		}
		if err := b.Set(ordKey, binary.AppendUvarint(nil, ord), nil); err != nil {
			return err
		}
		if err := b.Set(ordinalKey(p.DB, p.ID, e.Table, coll, ord), e.Key, nil); err != nil {
			return err
		}
	}
	// Postings: remove what the new image does not have, write what is
	// new or changed. The batch copies each key and value, so one
	// buffer of each serves them all.
	var kb, vb []byte
	postings := newPostings(p.DB, p.ID, e.Table, e.Key)
	set := func(n *IndexEntry) error {
		kb = postings.key(kb[:0], n.Field, n.Term)
		vb = append(binary.AppendUvarint(vb[:0], ord), n.Payload...)
		return b.Set(kb, vb, nil)
	}
	if len(olds) == 0 {
		for i := range news {
			if err := set(&news[i]); err != nil {
				return err
			}
		}
	} else {
		// A field whose entries are the same before and after (a patch
		// of another field) changes no posting: only the others are
		// compared term by term.
		olds, news := changedFields(olds, news)
		type fieldTerm struct{ field, term string }
		keep := make(map[fieldTerm][]byte, len(news))
		for _, n := range news {
			keep[fieldTerm{n.Field, string(n.Term)}] = n.Payload
		}
		for _, o := range olds {
			pl, ok := keep[fieldTerm{o.Field, string(o.Term)}]
			if ok && bytes.Equal(pl, o.Payload) {
				delete(keep, fieldTerm{o.Field, string(o.Term)})
				continue
			}
			if !ok {
				kb = postings.key(kb[:0], o.Field, o.Term)
				if err := b.Delete(kb, nil); err != nil {
					return err
				}
			}
		}
		for i := range news {
			if _, ok := keep[fieldTerm{news[i].Field, string(news[i].Term)}]; ok {
				if err := set(&news[i]); err != nil {
					return err
				}
			}
		}
	}
	// Text statistics: documents having the field and their total length.
	oldLen, newLen := lengths(olds), lengths(news)
	for f, l := range oldLen {
		if newLen[f] != l {
			if err := p.addStats(b, e.Table, f, coll, -1, -int64(l)); err != nil {
				return err
			}
		}
	}
	for f, l := range newLen {
		if o, ok := oldLen[f]; !ok || o != l {
			if err := p.addStats(b, e.Table, f, coll, 1, int64(l)); err != nil {
				return err
			}
		}
	}
	if !newIndexed && haveOrd {
		if err := b.Delete(ordKey, nil); err != nil {
			return err
		}
		if err := b.Delete(ordinalKey(p.DB, p.ID, e.Table, coll, ord), nil); err != nil {
			return err
		}
	}
	return nil
}

// clearCollection removes collection coll's index entries in table by
// range: its postings and text statistics under each field, and its
// documents' ordinals. The ordinal counter stays (an ordinal is never
// handed out twice), as it does when the documents go one by one.
func (p *Partition) clearCollection(b *pebble.Batch, table string, coll []byte) error {
	for _, kind := range []byte{idxPosting, idxStats} {
		// Both are grouped by field, then collection: one range per
		// field, found by skipping from field to field.
		prefix := idxPrefix(p.DB, p.ID, kind, table)
		it, err := b.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: keys.PrefixEnd(prefix)})
		if err != nil {
			return err
		}
		for valid := it.First(); valid; {
			_, n, err := keys.DecodePart(it.Key()[len(prefix):])
			if err != nil {
				it.Close()
				return fmt.Errorf("index key %x: %w", it.Key(), keys.ErrCorrupt)
			}
			field := append([]byte(nil), it.Key()[:len(prefix)+n]...)
			start := append(append([]byte(nil), field...), coll...)
			if err := b.DeleteRange(start, keys.PrefixEnd(start), nil); err != nil {
				it.Close()
				return err
			}
			valid = it.SeekGE(keys.PrefixEnd(field))
		}
		if err := it.Close(); err != nil {
			return err
		}
	}
	for _, kind := range []byte{idxOrdinal, idxKey} {
		start := append(idxPrefix(p.DB, p.ID, kind, table), coll...)
		if err := b.DeleteRange(start, keys.PrefixEnd(start), nil); err != nil {
			return err
		}
	}
	return nil
}

func lengths(es []IndexEntry) map[string]uint32 {
	var m map[string]uint32
	for _, e := range es {
		if e.Length > 0 {
			if m == nil {
				m = map[string]uint32{}
			}
			m[e.Field] = e.Length
		}
	}
	return m
}

// postingKey is P|i|p|table|field|collection|term|rest; key is the whole
// encoded key (collection, rest).
func postingKey(db string, id int, table, field string, term, key []byte) []byte {
	return newPostings(db, id, table, key).key(nil, field, term)
}

// changedFields returns olds and news without the entries of the fields
// whose entries are the same, in the same order, in both. A field's
// entries are one run (Indexer.Index makes them field by field); a field
// in more than one run is kept.
func changedFields(olds, news []IndexEntry) ([]IndexEntry, []IndexEntry) {
	type run struct{ from, to int }
	runs := func(es []IndexEntry) map[string]run {
		m := map[string]run{}
		for i := 0; i < len(es); {
			j := i + 1
			for j < len(es) && es[j].Field == es[i].Field {
				j++
			}
			if _, twice := m[es[i].Field]; twice {
				m[es[i].Field] = run{-1, -1}
			} else {
				m[es[i].Field] = run{i, j}
			}
			i = j
		}
		return m
	}
	oldRuns, newRuns := runs(olds), runs(news)
	same := map[string]bool{}
	for f, n := range newRuns {
		o, ok := oldRuns[f]
		if !ok || o.from < 0 || n.from < 0 || o.to-o.from != n.to-n.from {
			continue
		}
		equal := true
		for i := range n.to - n.from {
			a, b := &olds[o.from+i], &news[n.from+i]
			if !bytes.Equal(a.Term, b.Term) || !bytes.Equal(a.Payload, b.Payload) {
				equal = false
				break
			}
		}
		same[f] = equal
	}
	drop := func(es []IndexEntry) []IndexEntry {
		out := make([]IndexEntry, 0, len(es))
		for _, e := range es {
			if !same[e.Field] {
				out = append(out, e)
			}
		}
		return out
	}
	for _, eq := range same {
		if eq {
			return drop(olds), drop(news)
		}
	}
	return olds, news
}

// postings makes the posting keys of one document.
type postings struct {
	db         string
	id         int
	table      string
	coll, rest []byte // the document's key: its collection, the rest
	field      string // the field prefix holds
	prefix     []byte
}

func newPostings(db string, id int, table string, key []byte) *postings {
	coll, err := collectionOf(key)
	if err != nil {
		coll = nil // not a key: never written, never found
	}
	return &postings{db: db, id: id, table: table, coll: coll, rest: key[len(coll):]}
}

// key appends to b the posting key of term in field.
func (ps *postings) key(b []byte, field string, term []byte) []byte {
	if ps.prefix == nil || field != ps.field {
		ps.field, ps.prefix = field, append(PostingPrefix(ps.db, ps.id, ps.table, field), ps.coll...)
	}
	b = append(append(b, ps.prefix...), term...)
	return append(b, ps.rest...)
}

func ordinalKey(db string, id int, table string, coll []byte, ord uint64) []byte {
	b := append(idxPrefix(db, id, idxKey, table), coll...)
	return binary.BigEndian.AppendUint64(b, ord)
}

func statsKey(db string, id int, table, field string, coll []byte) []byte {
	b := keys.AppendPart(idxPrefix(db, id, idxStats, table), keys.S(field))
	return append(b, coll...)
}

func (p *Partition) addStats(b *pebble.Batch, table, field string, coll []byte, docs, total int64) error {
	k := statsKey(p.DB, p.ID, table, field, coll)
	d, t, err := readStats(b, k)
	if err != nil {
		return err
	}
	d, t = uint64(int64(d)+docs), uint64(int64(t)+total)
	if d == 0 {
		return b.Delete(k, nil)
	}
	v := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, d), t)
	return b.Set(k, v, nil)
}

type reader interface {
	Get(key []byte) ([]byte, io.Closer, error)
}

func readStats(r reader, k []byte) (docs, total uint64, err error) {
	v, c, err := r.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	if len(v) != 16 {
		return 0, 0, fmt.Errorf("index statistics %x: %w", k, keys.ErrCorrupt)
	}
	return binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:]), nil
}

func readUvarint(r reader, k []byte) (uint64, bool, error) {
	v, c, err := r.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	defer c.Close()
	n, w := binary.Uvarint(v)
	if w <= 0 {
		return 0, false, fmt.Errorf("index ordinal %x: %w", k, keys.ErrCorrupt)
	}
	return n, true, nil
}

// IndexReader reads one partition's index at one point in time (a Pebble
// snapshot), with the documents it indexes. Close releases it.
type IndexReader struct {
	p    *Partition
	snap *pebble.Snapshot
	SCN  SCN
	// iters are the reader's iterators, one per key prefix (a field's
	// postings, its statistics), reused (iter); bounds is where their
	// bounds are built (the iterators copy them).
	iters  map[string]*pebble.Iterator
	bounds []byte
}

// IndexReader opens a reader of the partition's index and documents as
// they are now; SCN is the last commit it sees (which may not be durable
// yet: a master's reader waits for that before answering).
func (p *Partition) IndexReader() *IndexReader {
	p.mu.Lock()
	defer p.mu.Unlock()
	return &IndexReader{p: p, snap: p.e.db.NewSnapshot(), SCN: p.scn}
}

// Close releases the reader.
func (r *IndexReader) Close() error {
	var errs []error
	for _, it := range r.iters {
		errs = append(errs, r.p.e.closeIter(it))
	}
	return errors.Join(append(errs, r.snap.Close())...)
}

// iter returns the reader's iterator of the keys under prefix, bounded to
// [lower, upper) and to be positioned; an empty upper is no bound (what
// AppendPrefixEnd gives when no key is past the prefix's), and a lower
// past upper an empty range (a page token's key past a collection). There
// is one per prefix, reused: a query of every collection of a partition
// reads each of its fields once a collection, and a new iterator opens
// again every table it reads (about half of such a query's time,
// docs/performance.md).
func (r *IndexReader) iter(prefix, lower, upper []byte) (*pebble.Iterator, error) {
	if len(upper) == 0 {
		upper = nil
	} else if bytes.Compare(lower, upper) > 0 {
		upper = lower // Pebble's bounds are ordered; equal ones hold nothing
	}
	if it := r.iters[string(prefix)]; it != nil {
		it.SetBounds(lower, upper)
		return it, nil
	}
	it, err := r.snap.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, err
	}
	if r.iters == nil {
		r.iters = map[string]*pebble.Iterator{}
	}
	r.iters[string(prefix)] = it
	return it, nil
}

// seek reads key k, which starts with prefix, with the reader's iterator
// of prefix (iter): a point read that opens no iterator of its own. The
// value is valid until the reader's next read.
func (r *IndexReader) seek(prefix, k []byte) ([]byte, bool, error) {
	r.bounds = keys.AppendPrefixEnd(r.bounds[:0], prefix)
	it, err := r.iter(prefix, prefix, r.bounds)
	if err != nil {
		return nil, false, err
	}
	if !it.SeekGE(k) || !bytes.Equal(it.Key(), k) {
		return nil, false, it.Error()
	}
	v, err := it.ValueAndErr()
	return v, err == nil, err
}

// Postings calls fn for each posting of field in table with a term in
// [lo, hi) (nil: unbounded) and a key in collection coll (the encoded
// first key part), in term then key order (reverse: both backwards),
// until fn returns false. fn must not read the same field's postings or
// statistics (the reader's iterator of them is in use: iter).
func (r *IndexReader) Postings(table, field string, lo, hi, coll []byte, reverse bool, fn func(term, key []byte, ord uint64, payload []byte) bool) error {
	field0 := PostingPrefix(r.p.DB, r.p.ID, table, field)
	prefix := append(field0, coll...) // after field0's bytes, which stay
	b := append(append(r.bounds[:0], prefix...), lo...)
	n := len(b)
	if hi != nil {
		b = append(append(b, prefix...), hi...)
	} else {
		b = keys.AppendPrefixEnd(b, prefix)
	}
	r.bounds = b
	it, err := r.iter(field0, b[:n], b[n:])
	if err != nil {
		return err
	}
	// Forwards past a posting's older values at once (see scan): an
	// attribute toggled many times has as many values of its posting in
	// the memtable. Backwards there is no such step: Prev visits each.
	valid, step := it.First, it.NextPrefix
	if reverse {
		valid, step = it.Last, it.Prev
	}
	key := append([]byte(nil), coll...)
	for ok := valid(); ok; ok = step() {
		rest := it.Key()[len(prefix):]
		n, err := TermLength(rest)
		if err != nil {
			return err
		}
		term := rest[:n]
		key = append(key[:len(coll)], rest[n:]...)
		v := it.Value()
		ord, w := binary.Uvarint(v)
		if w <= 0 {
			return fmt.Errorf("posting %x: %w", it.Key(), keys.ErrCorrupt)
		}
		if !fn(term, key, ord, v[w:]) {
			break
		}
	}
	return it.Error()
}

// KeysInOrder calls fn with the indexed documents of collection coll in
// key order (their ordinals and keys), from the first key after after
// (nil: the start), until fn returns false.
func (r *IndexReader) KeysInOrder(table string, coll, after []byte, fn func(ord uint64, key []byte) bool) error {
	prefix := idxPrefix(r.p.DB, r.p.ID, idxOrdinal, table)
	b := append(r.bounds[:0], prefix...)
	if after != nil && bytes.Compare(after, coll) > 0 {
		b = append(append(b, after...), 0)
	} else {
		b = append(b, coll...)
	}
	n := len(b)
	b = keys.AppendPrefixEnd(b, append(prefix, coll...)) // after prefix's bytes, which stay
	r.bounds = b
	it, err := r.iter(prefix, b[:n], b[n:])
	if err != nil {
		return err
	}
	for ok := it.First(); ok; ok = it.NextPrefix() { // past a key's older values at once (see scan)
		ord, w := binary.Uvarint(it.Value())
		if w <= 0 {
			return fmt.Errorf("ordinal %x: %w", it.Key(), keys.ErrCorrupt)
		}
		if !fn(ord, it.Key()[len(prefix):]) {
			break
		}
	}
	return it.Error()
}

// Posting reads one posting: the ordinal and payload of key under term.
func (r *IndexReader) Posting(table, field string, term, key []byte) (uint64, []byte, bool, error) {
	v, ok, err := r.seek(PostingPrefix(r.p.DB, r.p.ID, table, field), postingKey(r.p.DB, r.p.ID, table, field, term, key))
	if !ok || err != nil {
		return 0, nil, false, err
	}
	ord, w := binary.Uvarint(v)
	if w <= 0 {
		return 0, nil, false, keys.ErrCorrupt
	}
	return ord, append([]byte(nil), v[w:]...), true, nil
}

// Ordinals calls fn with every indexed document of collection coll in
// table: its ordinal and key, in ordinal order. fn must not read keys by
// ordinal (Key: the reader's iterator of them is in use).
func (r *IndexReader) Ordinals(table string, coll []byte, fn func(ord uint64, key []byte) bool) error {
	table0 := idxPrefix(r.p.DB, r.p.ID, idxKey, table)
	prefix := append(table0, coll...) // after table0's bytes, which stay
	r.bounds = keys.AppendPrefixEnd(append(r.bounds[:0], prefix...), prefix)
	it, err := r.iter(table0, r.bounds[:len(prefix)], r.bounds[len(prefix):])
	if err != nil {
		return err
	}
	for valid := it.First(); valid; valid = it.NextPrefix() { // past a key's older values at once (see scan)
		k := it.Key()[len(prefix):]
		if len(k) != 8 {
			return fmt.Errorf("ordinal key %x: %w", it.Key(), keys.ErrCorrupt)
		}
		if !fn(binary.BigEndian.Uint64(k), it.Value()) {
			break
		}
	}
	return it.Error()
}

// Collections calls fn with each collection of table that has indexed
// documents (or had: a collection emptied keeps its counter), in key
// order.
func (r *IndexReader) Collections(table string, fn func(coll []byte) bool) error {
	prefix := idxPrefix(r.p.DB, r.p.ID, idxCounter, table)
	it, err := r.snap.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: keys.PrefixEnd(prefix)})
	if err != nil {
		return err
	}
	defer r.p.e.closeIter(it)
	// NextPrefix: each insert of a new document into a collection
	// rewrites its counter, so a busy collection's has as many values in
	// the memtable (see scan).
	for valid := it.First(); valid; valid = it.NextPrefix() {
		if !fn(append([]byte(nil), it.Key()[len(prefix):]...)) {
			break
		}
	}
	return it.Error()
}

// Key returns the key of the document with ordinal ord in coll.
func (r *IndexReader) Key(table string, coll []byte, ord uint64) ([]byte, bool, error) {
	v, ok, err := r.seek(idxPrefix(r.p.DB, r.p.ID, idxKey, table), ordinalKey(r.p.DB, r.p.ID, table, coll, ord))
	if !ok || err != nil {
		return nil, false, err
	}
	return append([]byte(nil), v...), true, nil
}

// Stats returns how many documents of coll have text field, and their
// total length in words.
func (r *IndexReader) Stats(table, field string, coll []byte) (docs, total uint64, err error) {
	k := statsKey(r.p.DB, r.p.ID, table, field, coll)
	v, ok, err := r.seek(k[:len(k)-len(coll)], k)
	if !ok || err != nil {
		return 0, 0, err
	}
	if len(v) != 16 {
		return 0, 0, fmt.Errorf("index statistics %x: %w", k, keys.ErrCorrupt)
	}
	return binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:]), nil
}

// Doc reads a document by encoded key.
func (r *IndexReader) Doc(table string, key []byte) (Doc, bool, error) {
	return getDoc(r.snap, append(keys.DataTablePrefix(r.p.DB, r.p.ID, table), key...))
}

// TermLength is the length of the term at the start of b (a posting key
// holds terms self-delimited): a key part, or a 9-byte double (tag 0x30,
// see internal/index's term encoding).
func TermLength(b []byte) (int, error) {
	if len(b) > 0 && b[0] == 0x30 {
		if len(b) < 9 {
			return 0, fmt.Errorf("short double term: %w", keys.ErrCorrupt)
		}
		return 9, nil
	}
	_, n, err := keys.DecodePart(b)
	return n, err
}

// IndexChecksum is a digest of the partition's index as queries see it —
// postings (field, term, key, payload) and text statistics, without the
// document ordinals, which are each replica's own — and how many entries
// it covers. Replicas at the same SCN have the same digest.
func (p *Partition) IndexChecksum() (uint32, int, error) {
	snap := p.e.db.NewSnapshot()
	defer snap.Close()
	return p.indexDigest(snap)
}

// indexDigest is IndexChecksum of what snap holds.
func (p *Partition) indexDigest(snap *pebble.Snapshot) (uint32, int, error) {
	h := crc32.NewIEEE()
	n := 0
	for _, kind := range []byte{idxPosting, idxStats} {
		prefix := append(keys.Partition(p.DB, p.ID), keys.SectionIdx, kind)
		it, err := snap.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: keys.PrefixEnd(prefix)})
		if err != nil {
			return 0, 0, err
		}
		for valid := it.First(); valid; valid = it.NextPrefix() { // past a key's older values at once (see scan)
			v := it.Value()
			if kind == idxPosting {
				_, w := binary.Uvarint(v)
				if w <= 0 {
					it.Close()
					return 0, 0, fmt.Errorf("posting %x: %w", it.Key(), keys.ErrCorrupt)
				}
				v = v[w:]
			}
			h.Write(binary.AppendUvarint(nil, uint64(len(it.Key()))))
			h.Write(it.Key())
			h.Write(binary.AppendUvarint(nil, uint64(len(v))))
			h.Write(v)
			n++
		}
		if err := it.Close(); err != nil {
			return 0, 0, err
		}
	}
	return h.Sum32(), n, nil
}

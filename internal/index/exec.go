package index

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/RoaringBitmap/roaring/v2"
)

// Reader is one partition's index at one point in time
// (storage.IndexReader).
type Reader interface {
	Postings(table, field string, lo, hi, coll []byte, reverse bool, fn func(term, key []byte, ord uint64, payload []byte) bool) error
	KeysInOrder(table string, coll, after []byte, fn func(ord uint64, key []byte) bool) error
	Posting(table, field string, term, key []byte) (ord uint64, payload []byte, ok bool, err error)
	Ordinals(table string, coll []byte, fn func(ord uint64, key []byte) bool) error
	Key(table string, coll []byte, ord uint64) ([]byte, bool, error)
	Stats(table, field string, coll []byte) (docs, total uint64, err error)
}

// Scored reports whether a plan has text words or phrases, whose hits
// have relevance scores.
func Scored(p Plan) bool {
	switch p := p.(type) {
	case *Leaf:
		return p.Scored
	case *PlanAnd:
		return slices.ContainsFunc(p.Items, Scored)
	case *PlanOr:
		return slices.ContainsFunc(p.Items, Scored)
	}
	return false
}

// EstimateCap is where counting a list for the planner stops.
const EstimateCap = 4096

// Estimate counts the postings of field in [lo, hi) in coll, up to
// EstimateCap.
func Estimate(r Reader, table string, coll []byte) Estimator {
	return func(field string, lo, hi []byte) int {
		n := 0
		r.Postings(table, field, lo, hi, coll, false, func(_, _ []byte, _ uint64, _ []byte) bool {
			n++
			return n < EstimateCap
		})
		return n
	}
}

// Order is how hits are sorted.
type Order struct {
	// Field sorts by an attribute-indexed field's value (documents
	// without one last); Desc reverses it.
	Field string
	Desc  bool
	// Relevance sorts by BM25 score, highest first.
	Relevance bool
	// Otherwise hits come in key order.
}

// Hit is one matching document.
type Hit struct {
	Key     []byte
	Score   float64
	Term    []byte // the sort field's term
	Missing bool   // no value of the sort field
}

// MaxMatches bounds how many documents one query may match: its hits are
// sorted in memory.
const MaxMatches = 1 << 17

// ErrTooBroad is a query matching more than MaxMatches documents.
var ErrTooBroad = fmt.Errorf("index: the query matches more than %d documents of the collection; narrow it", MaxMatches)

// Search is one query's execution over one collection.
type Search struct {
	// Ctx ends the search early (the caller went away).
	Ctx   context.Context
	R     Reader
	Table string
	Coll  []byte
	// Prefix, when longer than Coll, keeps only documents whose key
	// starts with it (a collection inside the document group).
	Prefix []byte

	keys   keyCache
	scores map[uint32]float64
	steps  int // postings and keys read, for cancelled
}

// cancelled is the search's context error, looked at every 1,024 reads.
func (s *Search) cancelled() error {
	if s.steps++; s.steps%1024 == 0 {
		return s.Ctx.Err()
	}
	return nil
}

// BM25 parameters (Lucene's defaults).
const (
	bm25K1 = 1.2
	bm25B  = 0.75
)

// Run evaluates p and returns up to limit hits in order, after the hit
// a previous page ended with (a token from Next; nil: from the start),
// and the token of the last hit when more follow.
func (s *Search) Run(p Plan, o Order, after []byte, limit int) ([]Hit, []byte, error) {
	s.keys, s.scores = keyCache{at: map[uint32]uint64{}}, nil
	if o.Relevance {
		s.scores = map[uint32]float64{}
	}
	if s.Ctx == nil {
		s.Ctx = context.Background()
	}
	var a *Hit
	if after != nil {
		h, err := decodeToken(after)
		if err != nil {
			return nil, nil, err
		}
		a = &h
	}
	bm, err := s.eval(p, o.Relevance)
	if err != nil {
		return nil, nil, err
	}
	var hits []Hit
	switch {
	case bm.IsEmpty():
	case o.Relevance:
		// Every hit's score is needed: they are all scored, and the
		// best of them kept.
		if bm.GetCardinality() > MaxMatches {
			return nil, nil, ErrTooBroad
		}
		if hits, err = s.scored(bm, o, a, limit); err != nil {
			return nil, nil, err
		}
	case o.Field != "":
		hits, err = s.byField(bm, o, a, limit)
	default:
		hits, err = s.byKey(bm, a, limit)
	}
	if err != nil {
		return nil, nil, err
	}
	var next []byte
	if len(hits) > limit {
		hits = hits[:limit]
		next = encodeToken(hits[limit-1])
	}
	return hits, next, nil
}

func (s *Search) eval(p Plan, scoring bool) (*roaring.Bitmap, error) {
	switch p := p.(type) {
	case *Leaf:
		return s.leaf(p, scoring)
	case *PlanOr:
		out := roaring.New()
		for _, it := range p.Items {
			bm, err := s.eval(it, scoring)
			if err != nil {
				return nil, err
			}
			out.Or(bm)
		}
		return out, nil
	case *PlanNot:
		bm, err := s.eval(p.Item, false)
		if err != nil {
			return nil, err
		}
		all, err := s.universe()
		if err != nil {
			return nil, err
		}
		all.AndNot(bm)
		return all, nil
	case *PlanAnd:
		var acc *roaring.Bitmap
		for _, it := range p.Items {
			if l, ok := it.(*Leaf); ok && l.Probe && acc != nil {
				if err := s.probe(acc, l); err != nil {
					return nil, err
				}
				continue
			}
			bm, err := s.eval(it, scoring)
			if err != nil {
				return nil, err
			}
			if acc == nil {
				acc = bm
			} else {
				acc.And(bm)
			}
			if acc.IsEmpty() {
				return acc, nil
			}
		}
		for _, it := range p.Not {
			bm, err := s.eval(it, false)
			if err != nil {
				return nil, err
			}
			acc.AndNot(bm)
		}
		return acc, nil
	}
	return nil, fmt.Errorf("index: cannot run %T", p)
}

func ord32(ord uint64) (uint32, error) {
	if ord > math.MaxUint32 {
		return 0, fmt.Errorf("index: ordinal %d out of range", ord)
	}
	return uint32(ord), nil
}

// leaf reads a leaf's postings into a bitmap, adding BM25 scores.
func (s *Search) leaf(l *Leaf, scoring bool) (*roaring.Bitmap, error) {
	if l.Words != nil {
		return s.phrase(l, scoring)
	}
	bm := roaring.New()
	type tfdl struct {
		ord    uint32
		tf, dl uint32
	}
	var scored []tfdl
	var bad error
	err := s.R.Postings(s.Table, l.Field, l.Lo, l.Hi, s.Coll, false, func(_, key []byte, ord uint64, payload []byte) bool {
		if bad = s.cancelled(); bad != nil {
			return false
		}
		o, err := ord32(ord)
		if err != nil {
			bad = err
			return false
		}
		bm.Add(o)
		s.remember(o, key)
		if scoring && l.Scored {
			dl, ps, err := decodeText(payload)
			if err != nil {
				bad = err
				return false
			}
			scored = append(scored, tfdl{o, uint32(len(ps)), dl})
		}
		return true
	})
	if err == nil {
		err = bad
	}
	if err != nil {
		return nil, err
	}
	if len(scored) > 0 {
		n, avg, err := s.fieldStats(l.Field)
		if err != nil {
			return nil, err
		}
		idf := idf(n, len(scored))
		for _, d := range scored {
			s.scores[d.ord] += bm25(idf, d.tf, d.dl, avg)
		}
	}
	return bm, nil
}

func (s *Search) fieldStats(field string) (n uint64, avg float64, err error) {
	docs, total, err := s.R.Stats(s.Table, field, s.Coll)
	if err != nil || docs == 0 {
		return docs, 1, err
	}
	return docs, float64(total) / float64(docs), nil
}

func idf(n uint64, df int) float64 {
	return math.Log(1 + (float64(n)-float64(df)+0.5)/(float64(df)+0.5))
}

func bm25(idf float64, tf, dl uint32, avg float64) float64 {
	t := float64(tf)
	return idf * t * (bm25K1 + 1) / (t + bm25K1*(1-bm25B+bm25B*float64(dl)/avg))
}

// phrase matches documents holding the words at consecutive positions.
func (s *Search) phrase(l *Leaf, scoring bool) (*roaring.Bitmap, error) {
	var acc *roaring.Bitmap
	for _, w := range l.Words {
		bm, err := s.leaf(&Leaf{Field: l.Field, Term: w, Lo: w, Hi: append(w[:len(w):len(w)], 0xFF)}, false)
		if err != nil {
			return nil, err
		}
		if acc == nil {
			acc = bm
		} else {
			acc.And(bm)
		}
	}
	out := roaring.New()
	n, avg, err := s.fieldStats(l.Field)
	if err != nil {
		return nil, err
	}
	it := acc.Iterator()
	for it.HasNext() {
		o := it.Next()
		key, err := s.key(o)
		if err != nil {
			return nil, err
		}
		var starts []uint32
		var dl uint32
		for i, w := range l.Words {
			_, payload, ok, err := s.R.Posting(s.Table, l.Field, w, key)
			if err != nil {
				return nil, err
			}
			if !ok {
				starts = nil
				break
			}
			var ps []uint32
			if dl, ps, err = decodeText(payload); err != nil {
				return nil, err
			}
			if i == 0 {
				starts = ps
				continue
			}
			starts = slices.DeleteFunc(starts, func(st uint32) bool {
				_, found := slices.BinarySearch(ps, st+l.Offsets[i])
				return !found
			})
			if len(starts) == 0 {
				break
			}
		}
		if len(starts) > 0 {
			out.Add(o)
			if scoring {
				// A phrase scores as one term occurring len(starts)
				// times, as rare as its rarest word.
				s.scores[o] += bm25(idf(n, max(1, l.Estimate)), uint32(len(starts)), dl, avg)
			}
		}
	}
	return out, nil
}

// probe keeps the candidates in acc that have l's term.
func (s *Search) probe(acc *roaring.Bitmap, l *Leaf) error {
	var drop []uint32
	it := acc.Iterator()
	for it.HasNext() {
		o := it.Next()
		key, err := s.key(o)
		if err != nil {
			return err
		}
		if _, _, ok, err := s.R.Posting(s.Table, l.Field, l.Term, key); err != nil {
			return err
		} else if !ok {
			drop = append(drop, o)
		}
	}
	for _, o := range drop {
		acc.Remove(o)
	}
	return nil
}

// remember caches a document's key while the cache is small: a list or
// a collection larger than MaxMatches is read, not kept.
func (s *Search) remember(o uint32, key []byte) {
	if _, ok := s.keys.at[o]; !ok && len(s.keys.at) < MaxMatches {
		s.keys.put(o, key)
	}
}

func (s *Search) key(o uint32) ([]byte, error) {
	if k, ok := s.keys.get(o); ok {
		return k, nil
	}
	k, ok, err := s.R.Key(s.Table, s.Coll, uint64(o))
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("index: ordinal %d has no document", o)
	}
	s.keys.put(o, k)
	return k, nil
}

// keyCache holds documents' keys by ordinal, one after another in one
// buffer: a key and a map entry each were most of what a query of a
// word in 130,000 documents allocated.
type keyCache struct {
	at  map[uint32]uint64 // offset in buf << 16 | length
	buf []byte
}

func (c *keyCache) get(o uint32) ([]byte, bool) {
	v, ok := c.at[o]
	if !ok {
		return nil, false
	}
	off, n := v>>16, v&0xffff
	return c.buf[off : off+n : off+n], true
}

// put caches k (a key is at most 4 KiB; a longer one is not kept).
func (c *keyCache) put(o uint32, k []byte) {
	if len(k) <= 0xffff {
		c.at[o] = uint64(len(c.buf))<<16 | uint64(len(k))
		c.buf = append(c.buf, k...)
	}
}

// universe is every indexed document of the collection.
func (s *Search) universe() (*roaring.Bitmap, error) {
	all := roaring.New()
	var bad error
	err := s.R.Ordinals(s.Table, s.Coll, func(ord uint64, key []byte) bool {
		o, err := ord32(ord)
		if err != nil {
			bad = err
			return false
		}
		all.Add(o)
		s.remember(o, key)
		return true
	})
	if err == nil {
		err = bad
	}
	return all, err
}

// scored returns every hit with its score, sorted, after a.
func (s *Search) scored(bm *roaring.Bitmap, o Order, a *Hit, limit int) ([]Hit, error) {
	// Keys: one scan of the collection's ordinals when many are
	// unknown, else point reads.
	unknown := 0
	it := bm.Iterator()
	for it.HasNext() {
		if _, ok := s.keys.at[it.Next()]; !ok {
			unknown++
		}
	}
	if unknown > 64 {
		if _, err := s.universe(); err != nil {
			return nil, err
		}
	}
	// The first limit+1 hits after a, in order: a heap of them whose
	// root is the last, so that a page costs a comparison a match and
	// holds limit+1 hits, not a sort of every match (all 130,000 of a
	// word every document has, for a page of 3).
	top := best{cmp: compare(o), n: limit + 1}
	it = bm.Iterator()
	for it.HasNext() {
		ord := it.Next()
		k, err := s.key(ord)
		if err != nil {
			return nil, err
		}
		if !bytes.HasPrefix(k, s.Prefix) {
			continue
		}
		h := Hit{Key: k, Score: s.scores[ord]}
		if a != nil && top.cmp(h, *a) <= 0 {
			continue
		}
		top.add(h)
	}
	slices.SortFunc(top.hits, top.cmp)
	return top.hits, nil
}

// best keeps the first n hits in cmp's order of those added: a heap
// whose root is the last of them.
type best struct {
	cmp  func(a, b Hit) int
	n    int
	hits []Hit
}

func (b *best) add(h Hit) {
	if len(b.hits) < b.n {
		b.hits = append(b.hits, h)
		for i := len(b.hits) - 1; i > 0; { // up
			parent := (i - 1) / 2
			if b.cmp(b.hits[i], b.hits[parent]) <= 0 {
				break
			}
			b.hits[i], b.hits[parent] = b.hits[parent], b.hits[i]
			i = parent
		}
		return
	}
	if len(b.hits) == 0 || b.cmp(h, b.hits[0]) >= 0 {
		return // after every kept one
	}
	b.hits[0] = h
	for i := 0; ; { // down
		last, l, r := i, 2*i+1, 2*i+2
		if l < len(b.hits) && b.cmp(b.hits[l], b.hits[last]) > 0 {
			last = l
		}
		if r < len(b.hits) && b.cmp(b.hits[r], b.hits[last]) > 0 {
			last = r
		}
		if last == i {
			return
		}
		b.hits[i], b.hits[last] = b.hits[last], b.hits[i]
		i = last
	}
}

// byKey returns up to limit+1 hits after a in key order, reading the
// collection's documents in key order and keeping those in bm.
func (s *Search) byKey(bm *roaring.Bitmap, a *Hit, limit int) ([]Hit, error) {
	var out []Hit
	var after []byte
	if a != nil {
		after = a.Key
	}
	var bad error
	err := s.R.KeysInOrder(s.Table, s.Coll, after, func(ord uint64, key []byte) bool {
		if bad = s.cancelled(); bad != nil {
			return false
		}
		if ord > math.MaxUint32 || !bm.Contains(uint32(ord)) || !bytes.HasPrefix(key, s.Prefix) {
			return true
		}
		out = append(out, Hit{Key: append([]byte(nil), key...)})
		return len(out) <= limit
	})
	if err == nil {
		err = bad
	}
	return out, err
}

// byField returns up to limit+1 hits after a in the sort field's order:
// it reads the collection's postings of the field in that order (ties of
// a term in key order), keeps those in bm, and stops once it has enough;
// documents without the field follow, in key order.
func (s *Search) byField(bm *roaring.Bitmap, o Order, a *Hit, limit int) ([]Hit, error) {
	cmp := compare(o)
	var out, tie []Hit
	keep := func(h Hit) bool { return a == nil || cmp(h, *a) > 0 }
	flush := func() {
		slices.SortFunc(tie, func(x, y Hit) int { return bytes.Compare(x.Key, y.Key) })
		for _, h := range tie {
			if keep(h) {
				out = append(out, h)
			}
		}
		tie = tie[:0]
	}
	seen := roaring.New()
	// Start near the token: terms before (after, descending) it are done.
	var lo, hi []byte
	if a != nil && !a.Missing {
		if o.Desc {
			hi = append(append([]byte(nil), a.Term...), 0xFF)
		} else {
			lo = a.Term
		}
	}
	complete := true
	var bad error
	err := s.R.Postings(s.Table, o.Field, lo, hi, s.Coll, o.Desc, func(term, key []byte, ord uint64, _ []byte) bool {
		if bad = s.cancelled(); bad != nil {
			return false
		}
		if ord > math.MaxUint32 || !bm.Contains(uint32(ord)) || !bytes.HasPrefix(key, s.Prefix) {
			return true
		}
		seen.Add(uint32(ord))
		if a != nil && a.Missing {
			return true // only which documents have the field matters
		}
		if len(tie) > 0 && !bytes.Equal(tie[0].Term, term) {
			flush()
			if len(out) > limit {
				complete = false
				return false
			}
		}
		tie = append(tie, Hit{Key: append([]byte(nil), key...), Term: append([]byte(nil), term...)})
		return true
	})
	if err == nil {
		err = bad
	}
	if err != nil {
		return nil, err
	}
	flush()
	if !complete || len(out) > limit {
		return out, nil
	}
	// Documents without a value of the field, after all others. A token
	// past the start means the postings before it were skipped: those
	// documents have the field too.
	if lo != nil || hi != nil {
		err := s.R.Postings(s.Table, o.Field, nil, nil, s.Coll, false, func(_, _ []byte, ord uint64, _ []byte) bool {
			if ord <= math.MaxUint32 {
				seen.Add(uint32(ord))
			}
			return true
		})
		if err != nil {
			return nil, err
		}
	}
	missing := roaring.AndNot(bm, seen)
	if missing.GetCardinality() > MaxMatches {
		return nil, ErrTooBroad
	}
	var rest []Hit
	it := missing.Iterator()
	for it.HasNext() {
		k, err := s.key(it.Next())
		if err != nil {
			return nil, err
		}
		if h := (Hit{Key: k, Missing: true}); bytes.HasPrefix(k, s.Prefix) && keep(h) {
			rest = append(rest, h)
		}
	}
	slices.SortFunc(rest, func(x, y Hit) int { return bytes.Compare(x.Key, y.Key) })
	return append(out, rest...), nil
}

// compare orders hits as o says; the key breaks ties, so the order is
// total and a token resumes exactly after its hit.
func compare(o Order) func(a, b Hit) int {
	return func(a, b Hit) int {
		switch {
		case o.Field != "":
			if a.Missing != b.Missing {
				if a.Missing {
					return 1
				}
				return -1
			}
			if c := bytes.Compare(a.Term, b.Term); c != 0 {
				if o.Desc {
					return -c
				}
				return c
			}
		case o.Relevance:
			if a.Score != b.Score {
				if a.Score > b.Score {
					return -1
				}
				return 1
			}
		}
		return bytes.Compare(a.Key, b.Key)
	}
}

// Position is a hit's place in its query's order, as a page token holds
// it.
func Position(h Hit) []byte { return encodeToken(h) }

// ComparePositions orders two positions (from Position) as o orders their
// hits; a position that does not decode sorts last.
func ComparePositions(o Order, a, b []byte) int {
	ha, erra := decodeToken(a)
	hb, errb := decodeToken(b)
	switch {
	case erra != nil && errb != nil:
		return bytes.Compare(a, b)
	case erra != nil:
		return 1
	case errb != nil:
		return -1
	}
	return compare(o)(ha, hb)
}

// Merge merges hit lists sorted in o's order into the first limit hits;
// more reports whether any hit was left out. The first list's array is
// reused for the result: the caller gives it up.
func Merge(o Order, lists [][]Hit, limit int) (hits []Hit, more bool) {
	cmp := compare(o)
	if len(lists) > 0 {
		hits = lists[0] // a partition's query merges each collection's hits into one list
		lists = lists[1:]
	}
	for _, l := range lists {
		hits = append(hits, l...)
	}
	slices.SortFunc(hits, cmp)
	if len(hits) > limit {
		return hits[:limit], true
	}
	return hits, false
}

// A token is the last hit of a page: missing flag, term, score, key.
func encodeToken(h Hit) []byte {
	b := []byte{0}
	if h.Missing {
		b[0] = 1
	}
	b = binary.AppendUvarint(b, uint64(len(h.Term)))
	b = append(b, h.Term...)
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(h.Score))
	return append(b, h.Key...)
}

// ErrBadToken is a continuation token this index did not give.
var ErrBadToken = fmt.Errorf("index: bad continuation token")

func decodeToken(b []byte) (Hit, error) {
	if len(b) < 1 || b[0] > 1 {
		return Hit{}, ErrBadToken
	}
	h := Hit{Missing: b[0] == 1}
	n, w := binary.Uvarint(b[1:])
	if w <= 0 || n > uint64(len(b)) {
		return Hit{}, ErrBadToken
	}
	b = b[1+w:]
	if uint64(len(b)) < n+8 {
		return Hit{}, ErrBadToken
	}
	h.Term, b = b[:n], b[n:]
	h.Score, h.Key = math.Float64frombits(binary.BigEndian.Uint64(b)), b[8:]
	if math.IsNaN(h.Score) {
		return Hit{}, ErrBadToken
	}
	return h, nil
}

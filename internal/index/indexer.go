package index

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
)

// Tables finds a table with at least a given schema version (the
// registry): Table from what it holds, TableAtLeast reading etcd when it
// holds an older one.
type Tables interface {
	Table(db, table string) (*schema.Table, error)
	TableAtLeast(ctx context.Context, db, table string, version int) (*schema.Table, error)
}

// Indexer is the storage.Indexer of a storage node: a document is indexed
// as the schema version it was written with annotates it, so every
// replica derives the same entries from the same commit.
type Indexer struct {
	Tables Tables
	Plans  *schema.Plans
}

var _ storage.Indexer = (*Indexer)(nil)

// Index implements storage.Indexer.
func (ix *Indexer) Index(db, table string, version int, value []byte) ([]storage.IndexEntry, bool, error) {
	t, err := ix.Tables.Table(db, table)
	if err != nil || len(t.Versions) < version {
		// A version registered through another process that this one
		// has not seen yet: read it. (Every write asks, indexed table
		// or not; the common case makes no context and no timer.)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if t, err = ix.Tables.TableAtLeast(ctx, db, table, version); err != nil {
			return nil, false, err
		}
	}
	v := t.Version(version)
	if v == nil || len(v.Indexes) == 0 {
		return nil, false, nil
	}
	fields := v.IndexedFields()
	plan, err := ix.Plans.Plan(t, version, version, fields)
	if err != nil {
		return nil, false, err
	}
	rd, err := ix.Plans.Reader(t, version, fields)
	if err != nil {
		return nil, false, err
	}
	projected, err := plan.Apply(nil, value)
	if err != nil {
		return nil, false, err
	}
	js, err := rd.JSON.Append(nil, projected)
	if err != nil {
		return nil, false, err
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return nil, false, fmt.Errorf("index: document as JSON: %w", err)
	}
	return Entries(v.Indexes, doc), true, nil
}

// Entries returns the index entries of a document (decoded from JSON with
// UseNumber) for the given indexes: one per distinct term and field.
func Entries(indexes []schema.Index, doc map[string]any) []storage.IndexEntry {
	var out []storage.IndexEntry
	for _, ix := range indexes {
		vals := []any{doc[ix.Field]}
		if ix.Array {
			vals, _ = doc[ix.Field].([]any)
		}
		if ix.Kind == schema.IndexText {
			out = append(out, textEntries(ix.Field, vals, ix.StopWords)...)
			continue
		}
		seen := map[string]bool{}
		for _, v := range vals {
			term, ok := EncodeTerm(ix.Type, v)
			if !ok || seen[string(term)] {
				continue
			}
			seen[string(term)] = true
			out = append(out, storage.IndexEntry{Field: ix.Field, Term: term})
		}
	}
	return out
}

// textEntries indexes the words of strings: each distinct word with its
// positions (array elements continue the numbering, with a gap so a
// phrase never spans two elements).
//
// With stopWords, common English words are left out; the others keep
// their positions, so a phrase query skips the same words.
func textEntries(field string, vals []any, stopWords bool) []storage.IndexEntry {
	// One map lookup a word (its id), the positions gathered by id
	// afterwards into one array, and every term and payload appended to
	// one buffer: a document of 250,000 distinct words allocated and
	// looked up a map several times a word before.
	words := make([][]string, len(vals))
	n := 0
	for i, v := range vals {
		if s, ok := v.(string); ok {
			words[i] = Words(s)
			n += len(words[i])
		}
	}
	ids := make(map[string]int32, n) // grown a word at a time, it was a third of the work
	var order []string               // the distinct words, by id
	occ := make([]int32, 0, n)       // the id of each word kept, in order
	at := make([]uint32, 0, n)       // and its position
	pos := uint32(0)
	for i, v := range vals {
		if _, ok := v.(string); !ok {
			continue
		}
		for _, w := range words[i] {
			if stopWords && IsStopWord(w) {
				pos++
				continue
			}
			id, ok := ids[w]
			if !ok {
				id = int32(len(order))
				ids[w] = id
				order = append(order, w)
			}
			occ = append(occ, id)
			at = append(at, pos)
			pos++
		}
		pos += 8
	}
	if len(order) == 0 {
		return nil
	}
	length := uint32(len(occ))
	// Counting sort of the positions by word: start[id] is where word
	// id's positions begin in byWord, in document order.
	start := make([]int32, len(order)+1)
	for _, id := range occ {
		start[id+1]++
	}
	for i := 1; i < len(start); i++ {
		start[i] += start[i-1]
	}
	byWord := make([]uint32, len(occ))
	next := append([]int32(nil), start[:len(order)]...)
	for i, id := range occ {
		byWord[next[id]] = at[i]
		next[id]++
	}
	size := 0
	for _, w := range order {
		size += len(w) + 4 + 2*binary.MaxVarintLen32
	}
	buf := make([]byte, 0, size+len(occ)*binary.MaxVarintLen32)
	out := make([]storage.IndexEntry, len(order))
	for id, w := range order {
		from := len(buf)
		buf = appendStringTerm(buf, w)
		term := buf[from:len(buf):len(buf)]
		from = len(buf)
		buf = binary.AppendUvarint(buf, uint64(length))
		buf = appendPositions(buf, byWord[start[id]:start[id+1]])
		out[id] = storage.IndexEntry{Field: field, Term: term, Payload: buf[from:len(buf):len(buf)], Length: length}
	}
	return out
}

// appendPositions appends the payload of a text posting after the
// field's length: the count, then the positions as deltas, all uvarints.
func appendPositions(b []byte, ps []uint32) []byte {
	b = binary.AppendUvarint(b, uint64(len(ps)))
	last := uint32(0)
	for _, p := range ps {
		b = binary.AppendUvarint(b, uint64(p-last))
		last = p
	}
	return b
}

// decodeText reads a text posting's payload: the field's length in
// words, then the word's positions.
func decodeText(b []byte) (length uint32, positions []uint32, err error) {
	l, w := binary.Uvarint(b)
	if w <= 0 {
		return 0, nil, fmt.Errorf("index: bad text posting")
	}
	positions, err = decodePositions(b[w:])
	return uint32(l), positions, err
}

func decodePositions(b []byte) ([]uint32, error) {
	n, w := binary.Uvarint(b)
	if w <= 0 || n > uint64(len(b)) {
		return nil, fmt.Errorf("index: bad positions")
	}
	b = b[w:]
	out := make([]uint32, 0, n)
	last := uint64(0)
	for range n {
		d, w := binary.Uvarint(b)
		if w <= 0 {
			return nil, fmt.Errorf("index: bad positions")
		}
		b = b[w:]
		last += d
		out = append(out, uint32(last))
	}
	return out, nil
}

package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/schema"
)

// multiGet is a multi-get's keys resolved and grouped by partition.
type multiGet struct {
	db    *schema.Database
	table *schema.Table
	spec  node.ReadSpec
	all   [][]keys.Part // every key, in request order
	order []int         // partitions, in the order of their first key
	keys  map[int][][]keys.Part
}

// planMultiGet resolves a multi-get's keys: every one a full key of the
// table, at most MaxLimit of them.
func (r *Router) planMultiGet(db, table string, keyTexts [][]string, f Format) (*multiGet, error) {
	if f.Avro {
		return nil, errAvroMulti
	}
	if len(keyTexts) == 0 {
		return nil, &keyError{fmt.Errorf("a multi-get needs at least one key")}
	}
	if len(keyTexts) > r.opts.MaxLimit {
		return nil, &keyError{fmt.Errorf("a multi-get takes at most %d keys", r.opts.MaxLimit)}
	}
	m := &multiGet{all: make([][]keys.Part, len(keyTexts)), keys: map[int][][]keys.Part{}}
	for i, kt := range keyTexts {
		tg, err := r.resolve(db, table, kt, false)
		if err != nil {
			return nil, err
		}
		if !r.full(tg) {
			return nil, &keyError{fmt.Errorf("multi-get key %d has %d of %d key parts", i, len(tg.key), len(tg.table.Key))}
		}
		m.db, m.table = tg.db, tg.table
		m.all[i] = tg.key
		if _, ok := m.keys[tg.part]; !ok {
			m.order = append(m.order, tg.part)
		}
		m.keys[tg.part] = append(m.keys[tg.part], tg.key)
	}
	var err error
	if m.spec, err = r.readSpec(m.table, f); err != nil {
		return nil, err
	}
	return m, nil
}

// streamChunkBytes bounds what a streamed multi-get holds of one
// partition's answer: it asks for the partition's keys in answers of
// about that many bytes of documents.
const streamChunkBytes = 1 << 20

// callMultiGet asks every partition for its keys, in answers bounded by
// maxBytes of documents (node.MultiGetRequest.MaxBytes), calling got
// with each answer and the keys it covers as it comes (concurrently for
// partitions on other processes: remote). It returns the partitions that
// did not answer (Prefer: partial-ok).
func (r *Router) callMultiGet(ctx context.Context, m *multiGet, f Format, maxBytes int, got func(part int, ks [][]keys.Part, items []*node.Item, remote bool) error) ([]int, error) {
	missing, err := r.fanOut(ctx, m.db.Name, m.order, f.PartialOK, func(ctx context.Context, i int, n node.Service) error {
		p := m.order[i]
		for ks := m.keys[p]; len(ks) > 0; {
			req := node.MultiGetRequest{DB: m.db.Name, Table: m.table.Name, Partition: p, Keys: ks, Read: m.spec, MaxBytes: maxBytes}
			items, err := n.MultiGet(ctx, req)
			if err != nil {
				return err
			}
			done := req.Answered(items)
			if err := got(p, ks[:done], items, !node.IsInProcess(n)); err != nil {
				return err
			}
			ks = ks[done:]
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	parts := make([]int, len(missing))
	for i, j := range missing {
		parts[i] = m.order[j]
	}
	slices.Sort(parts)
	return parts, nil
}

// MultiGet reads documents by full keys, fanning out to their partitions in
// parallel. Documents come back in request order; keys not found are
// listed under "missing".
func (r *Router) MultiGet(ctx context.Context, db, table string, keyTexts [][]string, f Format) (*Page, error) {
	m, err := r.planMultiGet(db, table, keyTexts, f)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	found := map[string]*node.Item{}
	limit := r.opts.MaxResponseBytes
	lacking, err := r.callMultiGet(ctx, m, f, limit, func(part int, ks [][]keys.Part, items []*node.Item, _ bool) error {
		if len(ks) < len(m.keys[part]) {
			// The partition's documents alone, before their conversion
			// to JSON, reached the page's bound.
			return &responseTooLarge{size: limit, limit: limit, partial: true, multiGet: true}
		}
		mu.Lock()
		defer mu.Unlock()
		for _, it := range items {
			found[string(keys.Encode(it.Key))] = it
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var items []*node.Item
	var missing [][]keys.Part
	for _, k := range m.all {
		if it, ok := found[string(keys.Encode(k))]; ok {
			items = append(items, it)
		} else if !slices.Contains(lacking, m.db.PartitionOf(k[0])) {
			missing = append(missing, k) // not found; a key of an unanswered partition is neither
		}
	}
	page, err := r.renderPage(m.table, items, missing, "", f)
	if rt := (*responseTooLarge)(nil); errors.As(err, &rt) {
		rt.multiGet = true
	}
	if err != nil {
		return nil, err
	}
	page.setMissingPartitions(lacking)
	if len(m.order) == 1 {
		// One partition: its SCNs are comparable; report the newest.
		for _, it := range items {
			if page.SCN.Less(it.SCN) {
				page.SCN = it.SCN
			}
		}
	}
	return page, nil
}

// StreamEnd is how a streamed multi-get ended: its counts, and the
// partitions a partial answer lacks.
type StreamEnd struct {
	Documents, Missing int
	MissingPartitions  []int
}

// AppendLine appends the stream's end line:
// {"end":true,"documents":N,"missingKeys":M}, with "missingPartitions"
// when a partial answer lacks some.
func (e *StreamEnd) AppendLine(b []byte) []byte {
	b = fmt.Appendf(b, `{"end":true,"documents":%d,"missingKeys":%d`, e.Documents, e.Missing)
	if len(e.MissingPartitions) > 0 {
		b = append(appendInts(append(b, `,"missingPartitions":[`...), e.MissingPartitions), ']')
	}
	return append(b, "}\n"...)
}

// StreamMultiGet is MultiGet answering partition by partition
// (Accept: application/x-ndjson): as each partition answers, emit gets
// one line per key of that partition, in request order — a document as
// in a page, or {"key":[…],"missing":true} — so the first documents
// leave before the slowest partition answers, and no page is held.
// Lines of different partitions come in the order the partitions
// answered. emit is called by one goroutine at a time; an error from it
// (the client went away) stops the read. remote says the lines came from
// another process: such answers arrive apart, and are worth sending at
// once; this process's nodes answer one after another in the request's
// goroutine, so their lines may wait for the next ones. After the last
// line the caller writes the end (StreamEnd); an error after lines were
// emitted means the stream is incomplete.
func (r *Router) StreamMultiGet(ctx context.Context, db, table string, keyTexts [][]string, f Format, emit func(lines []byte, remote bool) error) (*StreamEnd, error) {
	m, err := r.planMultiGet(db, table, keyTexts, f)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	end := &StreamEnd{}
	lacking, err := r.callMultiGet(ctx, m, f, streamChunkBytes, func(part int, ks [][]keys.Part, items []*node.Item, remote bool) error {
		found := make(map[string]*node.Item, len(items))
		for _, it := range items {
			found[string(keys.Encode(it.Key))] = it
		}
		buf := pageBuffers.get(renderedSize(items) + 32*(len(ks)-len(items)))
		b := (*buf)[:0]
		defer func() { pageBuffers.put(buf, b) }() // emit has written or copied the lines
		docs := 0
		for _, k := range ks {
			it, ok := found[string(keys.Encode(k))]
			if !ok {
				b = append(b, `{"key":`...)
				b = append(b, schema.KeyJSON(k)...)
				b = append(b, `,"missing":true}`+"\n"...)
				continue
			}
			var err error
			if b, err = r.appendItem(b, m.table, it, f); err != nil {
				return err
			}
			b = append(b, '\n')
			docs++
		}
		mu.Lock()
		defer mu.Unlock()
		end.Documents += docs
		end.Missing += len(ks) - docs
		return emit(b, remote)
	})
	if err != nil {
		return nil, err
	}
	end.MissingPartitions = lacking
	return end, nil
}

// appendItem appends a page's entry for it:
// {"key":…,"etag":…,"scn":…,"lastModified":…,"document":…}.
func (r *Router) appendItem(b []byte, t *schema.Table, it *node.Item, f Format) ([]byte, error) {
	b = append(b, `{"key":`...)
	b = append(b, schema.KeyJSON(it.Key)...)
	b = append(b, `,"etag":`...)
	b = strconv.AppendQuote(b, it.ETag)
	b = append(b, `,"scn":"`...)
	b = append(b, it.SCN.String()...)
	b = append(b, `","lastModified":"`...)
	b = it.Modified.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","document":`...)
	b, err := r.appendJSON(b, t, it, f)
	if err != nil {
		return nil, err
	}
	return append(b, '}'), nil
}

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
	// groups[g] are the keys of partition order[g], in request order,
	// and at[g] their places in all.
	groups [][][]keys.Part
	at     [][]int
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
	d, t, err := r.tableOf(db, table)
	if err != nil {
		return nil, err
	}
	// One allocation for the keys and one for the ints (each key's
	// group, each key's place in its group's array, the partitions, the
	// groups' sizes): a multi-get is as many allocations as partitions it
	// reads, not as keys.
	n := len(keyTexts)
	m := &multiGet{db: d, table: t}
	parts := make([][]keys.Part, 2*n)
	ints := make([]int, 4*n)
	m.all = parts[:n:n]
	ks := parts[n:]
	group, at, count := ints[:n:n], ints[n:2*n:2*n], ints[3*n:]
	m.order = ints[2*n : 2*n : 3*n]
	for i, kt := range keyTexts {
		key, err := t.ParseKey(kt)
		if err != nil {
			return nil, &keyError{err}
		}
		if len(key) != len(t.Key) {
			return nil, &keyError{fmt.Errorf("multi-get key %d has %d of %d key parts", i, len(key), len(t.Key))}
		}
		m.all[i] = key
		part := d.PartitionOf(key[0])
		// At most MaxLimit keys and as many partitions: a search, not a
		// map to make.
		g := slices.Index(m.order, part)
		if g < 0 {
			g = len(m.order)
			m.order = append(m.order, part)
		}
		group[i] = g
		count[g]++
	}
	// The groups are cut from one array of keys and one of places.
	m.groups, m.at = make([][][]keys.Part, len(m.order)), make([][]int, len(m.order))
	start := 0
	for g, c := range count[:len(m.order)] {
		m.groups[g], m.at[g] = ks[start:start:start+c], at[start:start:start+c]
		start += c
	}
	for i, g := range group {
		m.groups[g] = append(m.groups[g], m.all[i])
		m.at[g] = append(m.at[g], i)
	}
	if m.spec, err = r.readSpec(m.table, f); err != nil {
		return nil, err
	}
	return m, nil
}

// matchItems calls fn with the place in ks of each key and the item
// answered for it, nil for a key not found (a node answers in the order
// of the keys it was asked, leaving out those it did not find), until fn
// returns an error, which it returns.
func matchItems(ks [][]keys.Part, items []*node.Item, fn func(j int, it *node.Item) error) error {
	i := 0
	for j, k := range ks {
		var it *node.Item
		if i < len(items) && keys.Equal(items[i].Key, k) {
			it = items[i]
			i++
		}
		if err := fn(j, it); err != nil {
			return err
		}
	}
	return nil
}

// streamChunkBytes bounds what a streamed multi-get holds of one
// partition's answer: it asks for the partition's keys in answers of
// about that many bytes of documents.
const streamChunkBytes = 1 << 20

// callMultiGet asks every partition for its keys, in answers bounded by
// maxBytes of documents (node.MultiGetRequest.MaxBytes), calling got
// with each answer and the keys it covers as it comes (concurrently for
// partitions on other processes: remote): ks are m.groups[g][from:] as
// far as the answer goes, stale how far behind its master the slave
// that gave it may be (0 from a master). It returns the partitions that
// did not answer (Prefer: partial-ok), and whether slaves answered for
// some (Format.MaxStale: a slave takes up a partition's keys where its
// master stopped answering).
func (r *Router) callMultiGet(ctx context.Context, m *multiGet, f Format, maxBytes int, got func(g, from int, ks [][]keys.Part, items []*node.Item, stale time.Duration, remote bool) error) (lacking []int, slaves bool, err error) {
	// How far each partition's keys are answered: one call at a time
	// asks a partition (its master, then maybe its slaves).
	answered := make([]int, len(m.groups))
	missing, slaves, err := r.fanOut(ctx, m.db.Name, m.order, f.PartialOK, f.MaxStale, func(ctx context.Context, g int, n node.Service) error {
		ks := m.groups[g]
		for answered[g] < len(ks) {
			from := answered[g]
			req := node.MultiGetRequest{DB: m.db.Name, Table: m.table.Name, Partition: m.order[g], Keys: ks[from:], Read: m.spec, MaxBytes: maxBytes, MaxStale: f.MaxStale}
			res, err := n.MultiGet(ctx, req)
			if err != nil {
				return err
			}
			done := req.Answered(res.Items)
			if err := got(g, from, ks[from:from+done], res.Items, res.Stale, !node.IsInProcess(n)); err != nil {
				return err
			}
			answered[g] += done
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	parts := make([]int, len(missing))
	for i, j := range missing {
		parts[i] = m.order[j]
	}
	slices.Sort(parts)
	return parts, slaves, nil
}

// MultiGet reads documents by full keys, fanning out to their partitions in
// parallel. Documents come back in request order; keys not found are
// listed under "missing".
func (r *Router) MultiGet(ctx context.Context, db, table string, keyTexts [][]string, f Format) (_ *Page, err error) {
	defer readFailed(&err)
	m, err := r.planMultiGet(db, table, keyTexts, f)
	if err != nil {
		return nil, err
	}
	found := make([]*node.Item, len(m.all)) // by place in m.all; each partition's calls fill their own
	limit := r.opts.MaxResponseBytes
	var mu sync.Mutex
	var stale time.Duration // the most an answering slave may be behind
	lacking, slaves, err := r.callMultiGet(ctx, m, f, limit, func(g, from int, ks [][]keys.Part, items []*node.Item, behind time.Duration, _ bool) error {
		mu.Lock()
		stale = max(stale, behind)
		mu.Unlock()
		if from+len(ks) < len(m.groups[g]) {
			// The partition's documents alone, before their conversion
			// to JSON, reached the page's bound.
			return &responseTooLarge{size: limit, limit: limit, partial: true, multiGet: true}
		}
		at := m.at[g][from:]
		return matchItems(ks, items, func(j int, it *node.Item) error {
			found[at[j]] = it
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	var items []*node.Item
	var missing [][]keys.Part
	for i, k := range m.all {
		if it := found[i]; it != nil {
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
	if slaves {
		page.fromSlave(items, stale)
	}
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
	// FromSlave says slaves answered for partitions whose master could
	// not (Format.MaxStale); Stale is then the most any answering slave
	// may be behind, whether or not it sent documents.
	FromSlave bool
	Stale     time.Duration
}

// AppendLine appends the stream's end line:
// {"end":true,"documents":N,"missingKeys":M}, with "missingPartitions"
// when a partial answer lacks some.
func (e *StreamEnd) AppendLine(b []byte) []byte {
	b = fmt.Appendf(b, `{"end":true,"documents":%d,"missingKeys":%d`, e.Documents, e.Missing)
	if len(e.MissingPartitions) > 0 {
		b = append(appendInts(append(b, `,"missingPartitions":[`...), e.MissingPartitions), ']')
	}
	if e.FromSlave {
		b = fmt.Appendf(b, `,"replica":"slave","age":%d`, AgeSeconds(e.Stale))
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
func (r *Router) StreamMultiGet(ctx context.Context, db, table string, keyTexts [][]string, f Format, emit func(lines []byte, remote bool) error) (_ *StreamEnd, err error) {
	defer readFailed(&err)
	m, err := r.planMultiGet(db, table, keyTexts, f)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	end := &StreamEnd{}
	lacking, slaves, err := r.callMultiGet(ctx, m, f, streamChunkBytes, func(_, _ int, ks [][]keys.Part, items []*node.Item, behind time.Duration, remote bool) error {
		buf := pageBuffers.get(renderedSize(items) + 32*(len(ks)-len(items)))
		b := (*buf)[:0]
		defer func() { pageBuffers.put(buf, b) }() // emit has written or copied the lines
		docs := 0
		err := matchItems(ks, items, func(j int, it *node.Item) error {
			if it == nil {
				b = append(b, `{"key":`...)
				b = schema.AppendKeyJSON(b, ks[j])
				b = append(b, `,"missing":true}`+"\n"...)
				return nil
			}
			var err error
			if b, err = r.appendItem(b, m.table, it, f); err != nil {
				return err
			}
			b = append(b, '\n')
			docs++
			return nil
		})
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		end.Documents += docs
		end.Missing += len(ks) - docs
		end.Stale = max(end.Stale, behind)
		for _, it := range items {
			end.Stale = max(end.Stale, it.Stale)
		}
		return emit(b, remote)
	})
	if err != nil {
		return nil, err
	}
	end.MissingPartitions = lacking
	end.FromSlave = slaves
	return end, nil
}

// appendItem appends a page's entry for it:
// {"key":…,"etag":…,"scn":…,"lastModified":…,"document":…}.
func (r *Router) appendItem(b []byte, t *schema.Table, it *node.Item, f Format) ([]byte, error) {
	b = append(b, `{"key":`...)
	b = schema.AppendKeyJSON(b, it.Key)
	b = append(b, `,"etag":`...)
	b = strconv.AppendQuote(b, it.ETag)
	b = append(b, `,"scn":"`...)
	b = it.SCN.Append(b)
	b = append(b, `","lastModified":"`...)
	b = it.Modified.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","document":`...)
	b, err := r.appendJSON(b, t, it, f)
	if err != nil {
		return nil, err
	}
	return append(b, '}'), nil
}

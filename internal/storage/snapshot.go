package storage

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cortado-db/cortado/internal/keys"
)

// Snapshot is a consistent view of one partition paired with the SCN it
// is consistent at: the rows, the auto-increment marks, and the timeline's
// history up to that SCN. It is what bootstraps a change-stream consumer
// and rebuilds a replica whose position the log no longer holds. Close
// releases it (it pins Pebble's files while open).
type Snapshot struct {
	p    *Partition
	snap *pebble.Snapshot
	// SCN is the last commit the snapshot holds.
	SCN SCN
	// History is the timeline's generations with their last SCNs, up to
	// SCN (see Partition.History).
	History []SCN
	// Acked is the acknowledged watermark when it was taken.
	Acked SCN
}

// Snapshot takes a consistent snapshot of the partition, once every
// commit it holds is durable (a snapshot ships nothing a crash of this
// replica could still undo).
func (p *Partition) Snapshot(ctx context.Context) (*Snapshot, error) {
	p.mu.Lock()
	s := &Snapshot{p: p, snap: p.e.db.NewSnapshot(), SCN: p.scn, History: p.ends(), Acked: p.acked}
	p.mu.Unlock()
	if err := p.AwaitDurable(ctx, s.SCN); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Close releases the snapshot.
func (s *Snapshot) Close() error { return s.snap.Close() }

// Row is one stored document row: its table, its encoded key, and the
// stored bytes (header and Avro document), exactly as a replica stores
// them.
type Row struct {
	Table string
	Key   []byte
	Value []byte
}

// Doc decodes the row's header and document.
func (r *Row) Doc() (Doc, error) { return decodeRow(r.Value) }

// Rows calls fn for each document row of the snapshot in key order (by
// table, then key). The row's slices are valid only during the call.
func (s *Snapshot) Rows(fn func(Row) error) error {
	prefix := append(keys.Partition(s.p.DB, s.p.ID), keys.SectionData)
	it, err := s.snap.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: keys.PrefixEnd(prefix)})
	if err != nil {
		return err
	}
	defer it.Close()
	for valid := it.First(); valid; valid = it.NextPrefix() { // past a key's older values at once (see scan)
		k := it.Key()
		tp, n, err := keys.DecodePart(k[len(prefix):])
		if err != nil {
			return fmt.Errorf("partition %s/%d: row key %x: %w", s.p.DB, s.p.ID, k, err)
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		if err := fn(Row{Table: tp.Str, Key: k[len(prefix)+n:], Value: v}); err != nil {
			return err
		}
	}
	return it.Error()
}

// Mark is a collection's auto-increment high-water mark: Key is the
// meta key's suffix after the partition's autoinc prefix.
type Mark struct {
	Key, Value []byte
}

// Marks returns the snapshot's auto-increment marks.
func (s *Snapshot) Marks() ([]Mark, error) {
	prefix := keys.Meta(s.p.DB, s.p.ID, "autoinc")
	it, err := s.snap.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: keys.PrefixEnd(prefix)})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []Mark
	for valid := it.First(); valid; valid = it.NextPrefix() { // past a key's older values at once (see scan)
		v, err := it.ValueAndErr()
		if err != nil {
			return nil, err
		}
		out = append(out, Mark{Key: append([]byte(nil), it.Key()[len(prefix):]...), Value: append([]byte(nil), v...)})
	}
	return out, it.Error()
}

// Install replaces a replica's contents with a snapshot's, streamed in:
// BeginInstall empties the partition (durably marked as being rebuilt, so
// a crash midway leaves it empty, never half of two states), Row adds
// rows, and Finish sets the snapshot's SCN, history and marks. The log
// then starts after the snapshot's SCN. Only a slave is rebuilt; its
// follower is the only writer while it runs.
type Install struct {
	p    *Partition
	b    *pebble.Batch
	rows int
	done bool
}

// Rows returns how many rows were added.
func (in *Install) Rows() int { return in.rows }

// installBatchBytes is how much an Install buffers before writing.
const installBatchBytes = 1 << 20

// BeginInstall empties the partition for an Install.
func (p *Partition) BeginInstall() (*Install, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// The epoch is odd from here until the install ends, so nothing is
	// put in the row cache or served from it meanwhile (rowcache.go).
	p.moveEpoch()
	if err := p.wipe(); err != nil {
		p.moveEpoch()
		return nil, err
	}
	return &Install{p: p, b: p.e.db.NewIndexedBatch()}, nil
}

// wipe removes the partition's rows, log, history, marks and positions,
// leaving the "rebuilding" marker; the caller holds mu.
func (p *Partition) wipe() error {
	b := p.e.db.NewBatch()
	defer b.Close()
	base := keys.Partition(p.DB, p.ID)
	for _, section := range []byte{keys.SectionData, keys.SectionLog, keys.SectionIdx} {
		lo := append(append([]byte(nil), base...), section)
		if err := b.DeleteRange(lo, keys.PrefixEnd(lo), nil); err != nil {
			return err
		}
	}
	for _, name := range []string{"hist", "autoinc", "logfrom"} {
		lo := keys.Meta(p.DB, p.ID, name)
		if err := b.DeleteRange(lo, keys.PrefixEnd(lo), nil); err != nil {
			return err
		}
	}
	for _, name := range []string{"scn", "acked", "logstart"} {
		if err := b.Delete(keys.Meta(p.DB, p.ID, name), nil); err != nil {
			return err
		}
	}
	if err := b.Set(keys.Meta(p.DB, p.ID, "rebuilding"), nil, nil); err != nil {
		return err
	}
	_, err := p.emptyLocked(b, "empty for a rebuild")
	return err
}

// emptyLocked adds the deletion of the partition's whole log to b (which
// holds the caller's other deletions), commits it, and forgets what the
// partition held; the caller holds mu. It returns the epochs of the log
// space the log was in.
func (p *Partition) emptyLocked(b *pebble.Batch, what string) ([]logEpoch, error) {
	es, err := p.epochs(SCN{}, maxSCN)
	if err != nil {
		return nil, err
	}
	if err := p.deleteLog(b, es, SCN{}, maxSCN); err != nil {
		return nil, err
	}
	if err := p.e.commit(b); err != nil {
		return nil, fmt.Errorf("partition %s/%d: %s: %w", p.DB, p.ID, what, err)
	}
	p.acked, p.stored, p.logStart, p.logBytes = SCN{}, SCN{}, SCN{}, 0
	p.logAt = logCursor{}
	p.setSCN(SCN{})
	clear(p.hist)
	return es, nil
}

// Row adds one row (as Snapshot.Rows gives it).
func (in *Install) Row(r Row) error {
	k := append(keys.DataTablePrefix(in.p.DB, in.p.ID, r.Table), r.Key...)
	if _, err := keys.Decode(r.Key); err != nil {
		return fmt.Errorf("partition %s/%d: install row %x: %w", in.p.DB, in.p.ID, k, err)
	}
	d, err := decodeRow(r.Value)
	if err != nil {
		return fmt.Errorf("partition %s/%d: install row %x: %w", in.p.DB, in.p.ID, k, err)
	}
	if err := in.b.Set(k, r.Value, nil); err != nil {
		return err
	}
	// The index is this replica's own: built from the rows as they come.
	if err := in.p.indexEvent(in.b, &Event{Op: OpInsert, Table: r.Table, Key: r.Key, Version: d.Version, Value: d.Value}, false, nil); err != nil {
		return err
	}
	in.rows++
	if in.b.Len() >= installBatchBytes {
		if err := in.b.Commit(pebble.NoSync); err != nil {
			return err
		}
		in.b.Close()
		in.b = in.p.e.db.NewIndexedBatch()
	}
	return nil
}

// ErrBadSnapshot is returned by Finish for a snapshot whose positions do
// not make a timeline.
var ErrBadSnapshot = errors.New("storage: the snapshot's positions do not make a timeline")

// Finish makes the installed rows the partition's state at scn, with the
// timeline's history (generations with their last SCNs, the last one
// being scn), the acknowledged watermark and the auto-increment marks;
// it returns how many rows were installed.
func (in *Install) Finish(scn SCN, history []SCN, acked SCN, marks []Mark) (int, error) {
	defer in.Abort()
	p := in.p
	if len(history) > 0 && history[len(history)-1] != scn {
		return 0, fmt.Errorf("%w: history ends at %s, not %s", ErrBadSnapshot, history[len(history)-1], scn)
	}
	for i := 1; i < len(history); i++ {
		if !history[i-1].Less(history[i]) || history[i-1].Gen == history[i].Gen {
			return 0, fmt.Errorf("%w: history out of order", ErrBadSnapshot)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	b := in.b
	for _, m := range marks {
		if err := b.Set(append(keys.Meta(p.DB, p.ID, "autoinc"), m.Key...), m.Value, nil); err != nil {
			return 0, err
		}
	}
	hist := map[uint32]uint64{}
	for _, e := range history {
		if e.Gen != scn.Gen {
			hist[e.Gen] = e.Seq
			if err := b.Set(histKey(p.DB, p.ID, e.Gen), binary.BigEndian.AppendUint64(nil, e.Seq), nil); err != nil {
				return 0, err
			}
		}
	}
	if scn.Less(acked) {
		acked = scn
	}
	for name, v := range map[string]SCN{"scn": scn, "logstart": scn, "acked": acked} {
		if err := b.Set(keys.Meta(p.DB, p.ID, name), encodeSCN(v), nil); err != nil {
			return 0, err
		}
	}
	if err := b.Delete(keys.Meta(p.DB, p.ID, "rebuilding"), nil); err != nil {
		return 0, err
	}
	// The history is the snapshot's, whole: kept, not built again from
	// the log (which holds only its end) when the node restarts. (A drop
	// deletes the mark with everything else in the partition's range.)
	if err := b.Set(historyMark(p.DB, p.ID), nil, nil); err != nil {
		return 0, err
	}
	if err := p.e.commit(b); err != nil {
		return 0, fmt.Errorf("partition %s/%d: finish the rebuild at %s: %w", p.DB, p.ID, scn, err)
	}
	p.logStart, p.acked, p.stored, p.hist = scn, acked, acked, hist
	p.setSCN(scn)
	return in.rows, nil
}

// Abort leaves an unfinished install: the partition stays empty (and
// marked), to be rebuilt again.
func (in *Install) Abort() {
	if !in.done {
		in.done = true
		in.b.Close()
		in.p.mu.Lock()
		in.p.moveEpoch() // to even: the install ended
		in.p.mu.Unlock()
	}
}

// Holds reports whether the engine holds anything of partition db/id:
// rows, index, marks (every partition that ever committed or was rebuilt
// has marks in its range). It opens no Partition.
func (e *Engine) Holds(db string, id int) (bool, error) {
	base := keys.Partition(db, id)
	it, err := e.db.NewIter(&pebble.IterOptions{LowerBound: base, UpperBound: keys.PrefixEnd(base)})
	if err != nil {
		return false, err
	}
	held := it.First()
	return held, errors.Join(it.Error(), it.Close())
}

// Drop deletes partition db/id from the engine: rows, index, log and every
// mark, the generation it saw too, in one synced batch. The Partition
// stays, empty, as a new replica's would be (the same one, so that the
// row cache, whose entries are tied to its epoch, serves none of the old
// rows). The caller makes sure nothing writes it meanwhile: it is no
// replica on this node.
//
// compact then compacts the ranges the partition's keys were in (its own,
// and its log's in each epoch of the log space), so that the tables stop
// referring to the blob files its documents and log entries are in,
// which become garbage that Pebble rewrites away (Options: blob files 5
// minutes old, once 20 % of all blob bytes are garbage). Without it the
// deleted keys would stay in the tables, still referring to the blob
// files, until compactions reached them: in a store that takes few
// writes, for good. It flushes the memtable if that holds the deletion.
func (e *Engine) Drop(db string, id int) (compact func(context.Context) error, err error) {
	p, err := e.Partition(db, id)
	if err != nil {
		return nil, err
	}
	ranges, err := p.drop()
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		for _, r := range ranges {
			if err := e.guarded(func() error { return e.db.Compact(ctx, r[0], r[1], false) }); err != nil {
				return err
			}
		}
		return nil
	}, nil
}

// drop empties the partition entirely (Engine.Drop) and returns the key
// ranges it deleted.
func (p *Partition) drop() (ranges [][2][]byte, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// The row cache's entries of the partition are of the old epoch from
	// here on, and none is served or put while the epoch is odd.
	p.moveEpoch()
	defer p.moveEpoch()
	b := p.e.db.NewBatch()
	defer b.Close()
	base := keys.Partition(p.DB, p.ID)
	if err := b.DeleteRange(base, keys.PrefixEnd(base), nil); err != nil {
		return nil, err
	}
	es, err := p.emptyLocked(b, "drop")
	if err != nil {
		return nil, err
	}
	// The generation it saw too: a replica of it again is rebuilt.
	p.gen, p.durableAt = 0, nil
	ranges = append(ranges, [2][]byte{base, keys.PrefixEnd(base)})
	for _, ep := range es {
		lo := keys.LogPrefix(ep.epoch, p.DB, p.ID)
		ranges = append(ranges, [2][]byte{lo, keys.PrefixEnd(lo)})
	}
	return ranges, nil
}

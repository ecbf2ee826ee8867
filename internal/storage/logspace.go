package storage

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cortado-db/cortado/internal/keys"
)

// The commit log lives in the log space (keys.LogSpace), before every
// partition's rows, keyed by epoch, then partition, then SCN. The epoch
// is the engine's: it moves on at every memtable flush, so a flush holds
// the log entries of about one epoch, and the L0 tables it writes do not
// span the older epochs' entries, which compactions out of level 0 then
// leave where they are. (With the log inside each partition's range, a
// flush spanned every partition's whole log, and every compaction out of
// level 0 rewrote the keys of all of it.)
//
// A partition's log is the concatenation of its entries in each epoch it
// wrote in, in epoch order: the engine's epoch never goes back, and a
// partition writes a commit in the engine's current epoch or, if later,
// the one it last wrote in. The partition records each epoch it writes
// in, keyed by the first SCN it wrote there (meta "logfrom"|generation|
// sequence → epoch), in the batch of that first commit, so a reader
// finds the epoch that holds an SCN with one seek. A trim drops the
// records of the epochs it emptied, a truncation those it emptied, a
// wipe all of them.

// logEpoch is one epoch a partition wrote log entries in: every entry of
// the partition in it is at or after first, and before the next epoch's
// first.
type logEpoch struct {
	epoch uint32
	first SCN
}

// maxSCN is after every SCN: reading the log up to it reads all of it.
var maxSCN = SCN{Gen: math.MaxUint32, Seq: math.MaxUint64}

// The record of an epoch is keyed by the first SCN the partition wrote in
// it (so the records are in SCN order too) and holds the epoch: the one
// holding an SCN is the last record at or before it, found with one seek,
// and a partition keeps only its last epoch in memory, however many its
// retained log spans.
func epochsPrefix(db string, id int) []byte { return keys.Meta(db, id, "logfrom") }

func epochKey(db string, id int, first SCN) []byte {
	return keys.Meta(db, id, "logfrom", keys.I(int64(first.Gen)), keys.I(int64(first.Seq)))
}

func epochValue(epoch uint32) []byte { return binary.BigEndian.AppendUint32(nil, epoch) }

// logCursor is the epoch a partition last wrote a log entry in, if it
// wrote one.
type logCursor struct {
	epoch uint32
	wrote bool
}

// loadEpochs reads the epoch the partition last wrote in, at open.
func (p *Partition) loadEpochs() error {
	p.logAt = logCursor{}
	return p.eachEpoch(maxSCN, func(ep logEpoch) (bool, error) {
		p.logAt = logCursor{ep.epoch, true}
		return false, nil
	})
}

// logKey returns the key of the log entry of the commit at scn, about to
// be added to b after the entry *at was written in: in the engine's
// current epoch or *at's, whichever is later. A new epoch is recorded in
// b and moves *at. The caller starts from a copy of p.logAt and stores it
// back once b is committed; it holds mu.
func (p *Partition) logKey(b *pebble.Batch, scn SCN, at *logCursor) ([]byte, error) {
	epoch := p.e.logEpoch.Load()
	if at.wrote && epoch <= at.epoch {
		epoch = at.epoch
	} else {
		if err := b.Set(epochKey(p.DB, p.ID, scn), epochValue(epoch), nil); err != nil {
			return nil, err
		}
		*at = logCursor{epoch, true}
	}
	return keys.Log(epoch, p.DB, p.ID, scn.Gen, scn.Seq), nil
}

// eachEpoch calls fn with the partition's epochs, from its records, in
// order, from the last one that starts at or before from (or the first,
// if none does; the last, if from is maxSCN) until fn returns false.
func (p *Partition) eachEpoch(from SCN, fn func(logEpoch) (bool, error)) error {
	lo := epochsPrefix(p.DB, p.ID)
	it, err := p.e.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: keys.PrefixEnd(lo)})
	if err != nil {
		return err
	}
	defer it.Close()
	var valid bool
	switch {
	case from == maxSCN:
		valid = it.Last()
	case it.SeekLT(keys.PrefixEnd(epochKey(p.DB, p.ID, from))):
		valid = true
	default:
		valid = it.First()
	}
	for ; valid; valid = it.Next() {
		parts, err := keys.Decode(it.Key()[len(lo):])
		v, verr := it.ValueAndErr()
		if err != nil || verr != nil || len(parts) != 2 || !parts[0].IsInt || !parts[1].IsInt || len(v) != 4 {
			return fmt.Errorf("partition %s/%d: corrupt log epoch record %x", p.DB, p.ID, it.Key())
		}
		ep := logEpoch{binary.BigEndian.Uint32(v), SCN{uint32(parts[0].Int), uint64(parts[1].Int)}}
		if ok, err := fn(ep); err != nil || !ok {
			return err
		}
	}
	return it.Error()
}

// epochs returns the epochs that may hold commits after from and at or
// before upTo.
func (p *Partition) epochs(from, upTo SCN) ([]logEpoch, error) {
	var out []logEpoch
	err := p.eachEpoch(from, func(ep logEpoch) (bool, error) {
		if upTo.Less(ep.first) {
			return false, nil
		}
		out = append(out, ep)
		return true, nil
	})
	return out, err
}

// epochAt returns the epoch that holds the commit at scn, if the
// partition wrote it.
func (p *Partition) epochAt(scn SCN) (ep logEpoch, ok bool, err error) {
	err = p.eachEpoch(scn, func(e logEpoch) (bool, error) {
		ep, ok = e, !scn.Less(e.first)
		return false, nil
	})
	return ep, ok, err
}

// storedLogKey returns the key a stored commit at scn has.
func (p *Partition) storedLogKey(scn SCN) ([]byte, bool, error) {
	ep, ok, err := p.epochAt(scn)
	if err != nil || !ok {
		return nil, false, err
	}
	return keys.Log(ep.epoch, p.DB, p.ID, scn.Gen, scn.Seq), true, nil
}

// logValue is the value of the log entry a scan is at: its length is
// known without reading it (values this large are in blob files, and a
// read fetches a block of one), the value is read on demand.
type logValue struct{ it *pebble.Iterator }

// Len returns the value's length.
func (v logValue) Len() int {
	lv := v.it.LazyValue()
	return lv.Len()
}

// Read returns the value, valid until the scan moves on.
func (v logValue) Read() ([]byte, error) { return v.it.ValueAndErr() }

// scanLog calls fn with each stored log entry after from and at or
// before upTo, in SCN order, until fn returns false or an error, reading
// the epochs' records as it goes. The key and value are valid only
// during the call.
func (p *Partition) scanLog(from, upTo SCN, fn func(scn SCN, k []byte, v logValue) (bool, error)) error {
	it, err := p.e.db.NewIter(nil)
	if err != nil {
		return err
	}
	defer it.Close()
	return p.eachEpoch(from, func(ep logEpoch) (bool, error) {
		if upTo.Less(ep.first) {
			return false, nil
		}
		prefix := keys.LogPrefix(ep.epoch, p.DB, p.ID)
		it.SetBounds(keys.Log(ep.epoch, p.DB, p.ID, from.Gen, from.Seq), keys.PrefixEnd(prefix))
		for valid := it.First(); valid; valid = it.Next() {
			gen, seq, err := keys.ParseLog(it.Key(), len(prefix))
			if err != nil {
				return false, err
			}
			scn := SCN{gen, seq}
			if scn == from {
				continue
			}
			if upTo.Less(scn) {
				return false, it.Error()
			}
			if ok, err := fn(scn, it.Key(), logValue{it}); err != nil || !ok {
				return false, err
			}
		}
		return true, it.Error()
	})
}

// deleteLog adds to b the deletion of every log entry after from and at
// or before upTo in the epochs es; the caller holds mu.
func (p *Partition) deleteLog(b *pebble.Batch, es []logEpoch, from, upTo SCN) error {
	for i, ep := range es {
		if upTo.Less(ep.first) {
			break
		}
		if i+1 < len(es) && !from.Less(es[i+1].first) {
			continue // every entry of this epoch is before es[i+1].first, at or before from
		}
		lo := keys.Log(ep.epoch, p.DB, p.ID, from.Gen, from.Seq+1)
		var hi []byte
		if upTo == maxSCN {
			hi = keys.PrefixEnd(keys.LogPrefix(ep.epoch, p.DB, p.ID))
		} else {
			hi = keys.Log(ep.epoch, p.DB, p.ID, upTo.Gen, upTo.Seq+1)
		}
		if err := b.DeleteRange(lo, hi, nil); err != nil {
			return err
		}
	}
	return nil
}

// migrateBatchBytes is how much of a legacy log one batch moves.
const migrateBatchBytes = 4 << 20

// migrateLog moves a log stored inside the partition's range (before the
// log space: keys.SectionLog) to epoch 0 of the log space, which sorts
// before every epoch the engine writes in, at open. It moves it in
// batches, each deleting what it moved: one interrupted by a crash is
// taken up again at the next open.
func (p *Partition) migrateLog() error {
	prefix := keys.LegacyLogPrefix(p.DB, p.ID)
	it, err := p.e.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: keys.PrefixEnd(prefix)})
	if err != nil {
		return err
	}
	defer it.Close()
	if !it.First() {
		return it.Error()
	}
	// A move a crash interrupted recorded epoch 0 with its first batch.
	recorded := false
	if err := p.eachEpoch(SCN{}, func(ep logEpoch) (bool, error) {
		recorded = ep.epoch == 0
		return false, nil
	}); err != nil {
		return err
	}
	b := p.e.db.NewBatch()
	defer func() { b.Close() }()
	for valid := true; valid; valid = it.Next() {
		gen, seq, err := keys.ParseLog(it.Key(), len(prefix))
		if err != nil {
			return fmt.Errorf("partition %s/%d: move the log: %w", p.DB, p.ID, err)
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		if !recorded {
			if err := b.Set(epochKey(p.DB, p.ID, SCN{gen, seq}), epochValue(0), nil); err != nil {
				return err
			}
			recorded = true
		}
		if err := b.Set(keys.Log(0, p.DB, p.ID, gen, seq), v, nil); err != nil {
			return err
		}
		if err := b.Delete(it.Key(), nil); err != nil {
			return err
		}
		if b.Len() >= migrateBatchBytes {
			if err := b.Commit(pebble.NoSync); err != nil {
				return err
			}
			b.Close()
			b = p.e.db.NewBatch()
		}
	}
	if err := it.Error(); err != nil {
		return err
	}
	if err := p.e.commit(b); err != nil {
		return fmt.Errorf("partition %s/%d: move the log: %w", p.DB, p.ID, err)
	}
	return nil
}

// lastLogEpoch returns the latest epoch of any log entry in the log
// space (zero if there is none), at the engine's open.
func lastLogEpoch(db *pebble.DB) (uint32, error) {
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{keys.LogSpace}, UpperBound: []byte{keys.LogSpace + 1}})
	if err != nil {
		return 0, err
	}
	defer it.Close()
	if !it.Last() {
		return 0, it.Error()
	}
	return keys.ParseLogEpoch(it.Key())
}

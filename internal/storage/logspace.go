package storage

import (
	"errors"
	"fmt"
	"math"
	"sort"

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
// in, with the first SCN it wrote there (meta "logepoch"|epoch), in the
// batch of that first commit, so a reader finds the epoch that holds an
// SCN without a scan. A trim drops the record of an epoch it emptied, a
// truncation those it emptied, a wipe all of them.

// logEpoch is one epoch a partition wrote log entries in: every entry of
// the partition in it is at or after first, and before the next epoch's
// first.
type logEpoch struct {
	epoch uint32
	first SCN
}

// maxSCN is after every SCN: reading the log up to it reads all of it.
var maxSCN = SCN{Gen: math.MaxUint32, Seq: math.MaxUint64}

func epochKey(db string, id int, epoch uint32) []byte {
	return keys.Meta(db, id, "logepoch", keys.I(int64(epoch)))
}

// loadEpochs reads the epochs the partition's log is in, at open.
func (p *Partition) loadEpochs() error {
	lo := keys.Meta(p.DB, p.ID, "logepoch")
	it, err := p.e.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: keys.PrefixEnd(lo)})
	if err != nil {
		return err
	}
	defer it.Close()
	p.logEpochs = nil
	for valid := it.First(); valid; valid = it.Next() {
		parts, err := keys.Decode(it.Key()[len(lo):])
		v, verr := it.ValueAndErr()
		if err != nil || verr != nil || len(parts) != 1 || !parts[0].IsInt || len(v) != 12 {
			return fmt.Errorf("partition %s/%d: corrupt log epoch %x", p.DB, p.ID, it.Key())
		}
		p.logEpochs = append(p.logEpochs, logEpoch{uint32(parts[0].Int), decodeSCN(v)})
	}
	return it.Error()
}

// logKey returns the key of the log entry of the commit at scn, about to
// be added to b, in the engine's current epoch or the partition's last,
// whichever is later. A new epoch is recorded in b and appended to
// *opened, which the caller adds to p.logEpochs once b is committed
// (addEpochs); the caller holds mu.
func (p *Partition) logKey(b *pebble.Batch, scn SCN, opened *[]logEpoch) ([]byte, error) {
	epoch := p.e.logEpoch.Load()
	last, ok := uint32(0), false
	if n := len(*opened); n > 0 {
		last, ok = (*opened)[n-1].epoch, true
	} else if n := len(p.logEpochs); n > 0 {
		last, ok = p.logEpochs[n-1].epoch, true
	}
	if ok && epoch <= last {
		epoch = last
	} else {
		if err := b.Set(epochKey(p.DB, p.ID, epoch), encodeSCN(scn), nil); err != nil {
			return nil, err
		}
		*opened = append(*opened, logEpoch{epoch, scn})
	}
	return keys.Log(epoch, p.DB, p.ID, scn.Gen, scn.Seq), nil
}

// addEpochs records epochs a committed batch opened; the caller holds mu.
func (p *Partition) addEpochs(opened []logEpoch) {
	p.logEpochs = append(p.logEpochs, opened...)
}

// epochsAfter returns the epochs that may hold commits after from, a
// copy; the caller holds mu.
func (p *Partition) epochsAfter(from SCN) []logEpoch {
	i := sort.Search(len(p.logEpochs), func(i int) bool { return from.Less(p.logEpochs[i].first) })
	return append([]logEpoch(nil), p.logEpochs[max(i-1, 0):]...)
}

// storedLogKey returns the key a stored commit at scn has; the caller
// holds mu.
func (p *Partition) storedLogKey(scn SCN) ([]byte, bool) {
	i := sort.Search(len(p.logEpochs), func(i int) bool { return scn.Less(p.logEpochs[i].first) })
	if i == 0 {
		return nil, false
	}
	return keys.Log(p.logEpochs[i-1].epoch, p.DB, p.ID, scn.Gen, scn.Seq), true
}

// scanLog calls fn with each stored log entry of the epochs es that is
// after from and at or before upTo, in SCN order, until fn returns false
// or an error. The key and value are valid only during the call.
func (p *Partition) scanLog(es []logEpoch, from, upTo SCN, fn func(scn SCN, k, v []byte) (bool, error)) error {
	it, err := p.e.db.NewIter(nil)
	if err != nil {
		return err
	}
	defer it.Close()
	for _, ep := range es {
		if upTo.Less(ep.first) {
			break
		}
		prefix := keys.LogPrefix(ep.epoch, p.DB, p.ID)
		it.SetBounds(keys.Log(ep.epoch, p.DB, p.ID, from.Gen, from.Seq), keys.PrefixEnd(prefix))
		for valid := it.First(); valid; valid = it.Next() {
			gen, seq, err := keys.ParseLog(it.Key(), len(prefix))
			if err != nil {
				return err
			}
			scn := SCN{gen, seq}
			if scn == from {
				continue
			}
			if upTo.Less(scn) {
				return it.Error()
			}
			v, err := it.ValueAndErr()
			if err != nil {
				return err
			}
			if ok, err := fn(scn, it.Key(), v); err != nil || !ok {
				return err
			}
		}
		if err := it.Error(); err != nil {
			return err
		}
	}
	return nil
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

// lastLogEntry returns the SCN of the partition's last stored log entry
// (zero if it has none), at open.
func (p *Partition) lastLogEntry() (SCN, error) {
	for i := len(p.logEpochs) - 1; i >= 0; i-- {
		prefix := keys.LogPrefix(p.logEpochs[i].epoch, p.DB, p.ID)
		it, err := p.e.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: keys.PrefixEnd(prefix)})
		if err != nil {
			return SCN{}, err
		}
		if !it.Last() {
			if err := it.Close(); err != nil {
				return SCN{}, err
			}
			continue
		}
		gen, seq, err := keys.ParseLog(it.Key(), len(prefix))
		if cerr := it.Close(); err == nil {
			err = cerr
		}
		return SCN{gen, seq}, err
	}
	return SCN{}, nil
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
	_, closer, err := p.e.db.Get(epochKey(p.DB, p.ID, 0))
	recorded := err == nil
	if recorded {
		closer.Close()
	} else if !errors.Is(err, pebble.ErrNotFound) {
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
			if err := b.Set(epochKey(p.DB, p.ID, 0), encodeSCN(SCN{gen, seq}), nil); err != nil {
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

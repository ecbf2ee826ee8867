package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cortado-db/cortado/internal/keys"
)

// ErrTrimmed is returned when an operation needs commits the log no longer
// holds: they were trimmed by retention. A replica in that position is
// rebuilt from a snapshot (see Partition.Snapshot and Install).
var ErrTrimmed = errors.New("storage: the commit log no longer holds the commits needed")

// The timeline's shape outlives the commits themselves. Every generation
// of a timeline starts at sequence 1 (see follows), so a timeline is its
// generations in order, each with its last sequence: (g, s) is on it if g
// is one of them and 1 ≤ s ≤ that last sequence. history keeps the last
// sequence of every generation before the current one (meta "hist"|gen);
// the current one ends at the partition's SCN. With it a replica tells
// whether an SCN is on its timeline, and where another timeline left it,
// after the commits themselves were trimmed.

func histKey(db string, id int, gen uint32) []byte {
	return keys.Meta(db, id, "hist", keys.I(int64(gen)))
}

// historyMark is the meta key whose presence says the partition's
// generation history is kept (meta "hist"): written when the history is
// first built, and by a rebuild's install (a drop deletes it with the
// rest of the partition).
func historyMark(db string, id int) []byte { return keys.Meta(db, id, "histv") }

// loadHistory reads the generation history, building it from the log
// once for a partition stored before the history existed.
func (p *Partition) loadHistory() error {
	p.hist = map[uint32]uint64{}
	lo := keys.Meta(p.DB, p.ID, "hist")
	it, err := p.e.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: keys.PrefixEnd(lo)})
	if err != nil {
		return err
	}
	for valid := it.First(); valid; valid = it.Next() {
		parts, err := keys.Decode(it.Key()[len(lo):])
		v, verr := it.ValueAndErr()
		if err != nil || verr != nil || len(parts) != 1 || len(v) != 8 {
			it.Close()
			return fmt.Errorf("partition %s/%d: corrupt generation history", p.DB, p.ID)
		}
		p.hist[uint32(parts[0].Int)] = binary.BigEndian.Uint64(v)
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return err
	}
	marker := historyMark(p.DB, p.ID)
	_, closer, err := p.e.db.Get(marker)
	switch {
	case err == nil:
		closer.Close()
		return nil
	case !errors.Is(err, pebble.ErrNotFound):
		return err
	}
	// Build it from the log (never trimmed before the history existed),
	// beside what is kept of it: a partition dropped and rebuilt by a
	// release that lost the mark holds its whole history in its keys,
	// and its log only the end of it.
	if err := p.scanLog(SCN{}, maxSCN, func(scn SCN, _ []byte, _ logValue) (bool, error) {
		if scn.Gen != p.scn.Gen {
			p.hist[scn.Gen] = max(p.hist[scn.Gen], scn.Seq)
		}
		return true, nil
	}); err != nil {
		return err
	}
	b := p.e.db.NewBatch()
	defer b.Close()
	for g, s := range p.hist {
		b.Set(histKey(p.DB, p.ID, g), binary.BigEndian.AppendUint64(nil, s), nil)
	}
	b.Set(marker, nil, nil)
	return p.e.commit(b)
}

// noteGeneration adds to b the end of the current generation when c opens
// a new one; the caller holds mu and updates p.hist after the commit.
func (p *Partition) noteGeneration(b *pebble.Batch, last, next SCN) (closed bool, err error) {
	if next.Gen == last.Gen || last.IsZero() {
		return false, nil
	}
	return true, b.Set(histKey(p.DB, p.ID, last.Gen), binary.BigEndian.AppendUint64(nil, last.Seq), nil)
}

// onTimeline reports whether scn is on this replica's timeline; the caller
// holds mu.
func (p *Partition) onTimeline(scn SCN) bool {
	if scn.IsZero() {
		return true
	}
	if scn.Seq == 0 {
		return false
	}
	if scn.Gen == p.scn.Gen {
		return scn.Seq <= p.scn.Seq
	}
	end, ok := p.hist[scn.Gen]
	return ok && scn.Seq <= end
}

// OnTimeline reports whether scn is on this replica's timeline: a commit
// it holds or held before its log was trimmed (zero always is).
func (p *Partition) OnTimeline(scn SCN) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.onTimeline(scn)
}

// LastOnTimelineBefore returns the newest SCN of this replica's timeline
// before scn (zero if none): where a timeline that holds scn, which this
// one does not, left this one.
func (p *Partition) LastOnTimelineBefore(scn SCN) SCN {
	p.mu.Lock()
	defer p.mu.Unlock()
	var best SCN
	for _, e := range p.ends() {
		if e.Gen < scn.Gen {
			best = e
			continue
		}
		if e.Gen == scn.Gen && scn.Seq > 1 {
			best = SCN{Gen: e.Gen, Seq: min(e.Seq, scn.Seq-1)}
		}
		break
	}
	return best
}

// ends lists each generation of the timeline with its last SCN, oldest
// first; the caller holds mu.
func (p *Partition) ends() []SCN {
	out := make([]SCN, 0, len(p.hist)+1)
	for g, s := range p.hist {
		out = append(out, SCN{Gen: g, Seq: s})
	}
	if !p.scn.IsZero() {
		out = append(out, p.scn)
	}
	slices.SortFunc(out, func(a, b SCN) int {
		if a.Less(b) {
			return -1
		}
		if b.Less(a) {
			return 1
		}
		return 0
	})
	return out
}

// History returns the timeline's generations with their last SCNs, oldest
// first: what a replica rebuilt from a snapshot needs to judge SCNs it
// never held.
func (p *Partition) History() []SCN {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ends()
}

// LogStart returns the SCN the log starts after: every commit at or
// before it was trimmed (zero: the log is whole).
func (p *Partition) LogStart() SCN {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logStart
}

// LogBytes returns about how many bytes the partition's log entries take.
func (p *Partition) LogBytes() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logBytes
}

// measureLog adds up the sizes of the log's entries (their lengths, not
// their values) and returns the last entry's SCN (zero if the log is
// empty), at open.
func (p *Partition) measureLog() (last SCN, err error) {
	if err := p.scanLog(p.logStart, maxSCN, func(scn SCN, k []byte, v logValue) (bool, error) {
		p.logBytes += int64(len(k) + v.Len())
		last = scn
		return true, nil
	}); err != nil {
		return SCN{}, err
	}
	return last, nil
}

// RetentionPolicy says how much of a partition's log to keep.
type RetentionPolicy struct {
	// MaxAge trims commits older than this (0: no limit by age).
	MaxAge time.Duration
	// MaxBytes trims the oldest commits while the log is larger (0: no
	// limit by size).
	MaxBytes int64
	// Keep is the newest SCN that must stay readable (a live slave's
	// position): nothing after it is trimmed. Zero pins nothing.
	Keep SCN
	// Now is the time MaxAge counts from (default time.Now()).
	Now time.Time
}

// TrimPoint returns the newest SCN the policy lets go (zero: none), never
// past the acknowledged watermark (a truncation needs the pre-images of
// what is not acknowledged) nor past o.Keep.
func (p *Partition) TrimPoint(o RetentionPolicy) (SCN, error) {
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	p.mu.Lock()
	limit, start, total := p.acked, p.logStart, p.logBytes
	p.mu.Unlock()
	if !o.Keep.IsZero() && o.Keep.Less(limit) {
		limit = o.Keep
	}
	if !start.Less(limit) || (o.MaxAge <= 0 && (o.MaxBytes <= 0 || total <= o.MaxBytes)) {
		return SCN{}, nil
	}
	var aged SCN // the last commit older than MaxAge (zero: none)
	if o.MaxAge > 0 {
		var err error
		if aged, err = p.agePoint(start, limit, o.Now.Add(-o.MaxAge).UnixNano()); err != nil {
			return SCN{}, err
		}
	}
	if o.MaxBytes <= 0 || total <= o.MaxBytes {
		return aged, nil // aged is a commit in (start, limit], or zero
	}
	var point SCN
	// Up to aged, and on while the log is over its size: lengths come
	// from the entries' blob handles, unread.
	err := p.scanLog(start, limit, func(scn SCN, k []byte, v logValue) (bool, error) {
		over := o.MaxBytes > 0 && total > o.MaxBytes
		if !over && aged.Less(scn) {
			return false, nil
		}
		point = scn
		total -= int64(len(k) + v.Len())
		return true, nil
	})
	return point, err
}

// agePoint returns the last commit after start and at or before limit
// that is older than cutoff (zero: none). A partition's commit times
// follow its SCNs, so it reads the first commit of each epoch to find the
// last epoch whose first commit is old (or else the one holding start),
// and searches that epoch by halves: its commits of one generation have
// consecutive sequence numbers. A few reads, where reading each commit
// would fetch a block of a blob file for each.
func (p *Partition) agePoint(start, limit SCN, cutoff int64) (SCN, error) {
	var in logEpoch
	found := false
	err := p.eachEpoch(start, func(ep logEpoch) (bool, error) {
		if limit.Less(ep.first) {
			return false, nil
		}
		if !start.Less(ep.first) {
			in, found = ep, true // it holds start
			return true, nil
		}
		ts, err := p.entryTime(ep.epoch, ep.first)
		if errors.Is(err, pebble.ErrNotFound) {
			return false, nil // not expected: a record is written with its first entry
		}
		if err != nil || ts >= cutoff {
			return false, err
		}
		in, found = ep, true
		return true, nil
	})
	if err != nil || !found {
		return SCN{}, err
	}
	prefix := keys.LogPrefix(in.epoch, p.DB, p.ID)
	it, err := p.e.db.NewIter(&pebble.IterOptions{
		LowerBound: keys.Log(in.epoch, p.DB, p.ID, start.Gen, start.Seq+1),
		UpperBound: keys.Log(in.epoch, p.DB, p.ID, limit.Gen, limit.Seq+1),
	})
	if err != nil {
		return SCN{}, err
	}
	defer it.Close()
	scnAt := func() (SCN, error) {
		gen, seq, err := keys.ParseLog(it.Key(), len(prefix))
		return SCN{gen, seq}, err
	}
	if !it.Last() {
		return SCN{}, it.Error()
	}
	hi, err := scnAt()
	if err != nil {
		return SCN{}, err
	}
	it.First()
	lo, err := scnAt()
	if err != nil {
		return SCN{}, err
	}
	if lo.Gen == hi.Gen {
		if point, ok, err := p.searchAge(in.epoch, lo, hi, cutoff); err != nil || ok {
			return point, err
		}
	}
	// Generations change within the epoch (or a commit is missing): read
	// the commits in order.
	var point SCN
	for valid := true; valid; valid = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return SCN{}, err
		}
		if entryTimeOf(v) >= cutoff {
			break
		}
		if point, err = scnAt(); err != nil {
			return SCN{}, err
		}
	}
	return point, it.Error()
}

// searchAge returns the last commit from lo to hi (of one generation,
// in epoch) older than cutoff, by halves; false if a commit between them
// is missing.
func (p *Partition) searchAge(epoch uint32, lo, hi SCN, cutoff int64) (SCN, bool, error) {
	old := func(seq uint64) (bool, bool, error) {
		ts, err := p.entryTime(epoch, SCN{lo.Gen, seq})
		if errors.Is(err, pebble.ErrNotFound) {
			return false, false, nil
		}
		return ts < cutoff, true, err
	}
	// Invariant: a is old (or lo-1), b is not (or hi+1).
	a, b := lo.Seq-1, hi.Seq+1
	for b-a > 1 {
		m := a + (b-a)/2
		isOld, held, err := old(m)
		if err != nil || !held {
			return SCN{}, false, err
		}
		if isOld {
			a = m
		} else {
			b = m
		}
	}
	if a < lo.Seq {
		return SCN{}, true, nil
	}
	return SCN{lo.Gen, a}, true, nil
}

// entryTime returns the commit time (Unix nanoseconds) of the log entry
// of scn in epoch; an entry without one reads as the newest.
func (p *Partition) entryTime(epoch uint32, scn SCN) (int64, error) {
	v, closer, err := p.e.db.Get(keys.Log(epoch, p.DB, p.ID, scn.Gen, scn.Seq))
	if err != nil {
		return 0, err
	}
	defer closer.Close()
	return entryTimeOf(v), nil
}

// entryTimeOf returns the commit time (Unix nanoseconds) at the head of
// a log entry; an entry without one reads as the newest, so retention
// by age never takes it as old.
func entryTimeOf(entry []byte) int64 {
	ts, n := binary.Varint(entry)
	if n <= 0 {
		return math.MaxInt64
	}
	return ts
}

// Trim removes every commit at or before upTo from the log (retention).
// It refuses to pass the acknowledged watermark: a truncation undoes
// unacknowledged commits with the pre-images their entries hold.
func (p *Partition) Trim(upTo SCN) (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.acked.Less(upTo) {
		return 0, fmt.Errorf("partition %s/%d: trim through %s past the acknowledged %s: %w", p.DB, p.ID, upTo, p.acked, ErrTruncateAcknowledged)
	}
	if !p.logStart.Less(upTo) || !p.onTimeline(upTo) {
		return 0, nil
	}
	es, err := p.epochs(p.logStart, upTo)
	if err != nil {
		return 0, err
	}
	var freed int64
	if err := p.scanLog(p.logStart, upTo, func(_ SCN, k []byte, v logValue) (bool, error) {
		freed += int64(len(k) + v.Len())
		return true, nil
	}); err != nil {
		return 0, err
	}
	b := p.e.db.NewBatch()
	defer b.Close()
	if err := p.deleteLog(b, es, p.logStart, upTo); err != nil {
		return 0, err
	}
	// An epoch whose successor starts at or before upTo is empty now:
	// the records before the last one at or before upTo (es's last) go.
	if len(es) > 0 {
		if err := b.DeleteRange(epochsPrefix(p.DB, p.ID), epochKey(p.DB, p.ID, es[len(es)-1].first), nil); err != nil {
			return 0, err
		}
	}
	if err := b.Set(keys.Meta(p.DB, p.ID, "logstart"), encodeSCN(upTo), nil); err != nil {
		return 0, err
	}
	// Commits do not store the partition's SCN: a restart takes it from
	// the log's last entry (openPartition). A trim may remove that entry,
	// so it stores the SCN.
	if err := b.Set(keys.Meta(p.DB, p.ID, "scn"), encodeSCN(p.scn), nil); err != nil {
		return 0, err
	}
	// Not synced: a trim lost in a crash is done again.
	if err := b.Commit(pebble.NoSync); err != nil {
		return 0, fmt.Errorf("partition %s/%d: trim through %s: %w", p.DB, p.ID, upTo, err)
	}
	p.logStart = upTo
	p.logBytes -= freed
	p.tail.trim(upTo)
	return freed, nil
}

// CommitTime returns when the commit at scn was made, if the log holds it.
func (p *Partition) CommitTime(scn SCN) (time.Time, bool, error) {
	k, ok, err := p.storedLogKey(scn)
	if err != nil || !ok {
		return time.Time{}, false, err
	}
	v, closer, err := p.e.db.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, err
	}
	defer closer.Close()
	ts, n := binary.Varint(v)
	if n <= 0 {
		return time.Time{}, false, errCorruptLog
	}
	return time.Unix(0, ts), true, nil
}

package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"hash/fnv"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cortado-db/cortado/internal/keys"
)

// ErrTruncateAcknowledged is returned by TruncateAfter when the commits it
// would remove include one acknowledged to a client: removing it would
// lose an acknowledged write, so the replica refuses and keeps its data.
// It is an alarm, never a normal event (see DESIGN.md §5).
var ErrTruncateAcknowledged = errors.New("storage: truncation would remove acknowledged commits")

// ErrTimeline is returned when a replicated commit does not follow the
// partition's last SCN: a gap, a repeat, or an older generation. Applying
// it would let two replicas pass through different sequences of states.
var ErrTimeline = errors.New("storage: commit does not follow the partition's timeline")

// follows reports whether next may be committed after last: the next
// sequence of the same generation, or sequence 1 of a later generation.
func follows(last, next SCN) bool {
	if next.Gen == last.Gen {
		return next.Seq == last.Seq+1
	}
	return next.Gen > last.Gen && next.Seq == 1
}

// Apply commits, on a slave, a commit read from its master's log: the same
// rows, the same log entry, the same SCN, in one batch with fsync. It
// refuses (ErrTimeline) a commit that does not directly follow the last
// one, so every replica passes through the same sequence of states.
func (p *Partition) Apply(c Commit) error { return p.ApplyAll([]Commit{c}) }

// ApplyAll applies consecutive commits as Apply does, in one batch and
// one fsync: a slave that is behind catches up at the cost of one sync per
// batch, not per commit. Each commit must follow the one before it.
func (p *Partition) ApplyAll(cs []Commit) error { return p.ApplyAcknowledged(cs, SCN{}) }

// ApplyAcknowledged is ApplyAll for a slave whose master says every commit
// up to acked was acknowledged to clients: the part of that this replica
// now holds is recorded (durably, in the same batch) so that a later
// truncation of it is refused as an alarm.
func (p *Partition) ApplyAcknowledged(cs []Commit, acked SCN) error {
	wait, err := p.ApplyAcknowledgedAsync(cs, acked)
	if err != nil {
		return err
	}
	return wait()
}

// ApplyAcknowledgedAsync is ApplyAcknowledged returning once the commits
// are applied — visible to reads, and in the write-ahead log's queue
// ahead of any later batch — without waiting for their fsync: wait
// returns once they are durable, and only then does the partition's SCN
// (what it acknowledges, ships and reports) move to them. A slave applies
// the next commits it receives while the last ones sync, and they share
// the next fsync. The caller applies the next commits only after this
// returns, and truncates only once every wait has returned.
func (p *Partition) ApplyAcknowledgedAsync(cs []Commit, acked SCN) (wait func() error, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(cs) == 0 {
		p.noteAcked(acked)
		return func() error { return nil }, nil
	}
	b := p.e.db.NewIndexedBatch() // the index reads what earlier commits of the batch wrote
	queued := false
	defer func() {
		if !queued {
			b.Close() // once queued, after its fsync (wait)
		}
	}()
	last := p.scn
	rows := rowWrites{p: p, leaveEmpty: true}
	var closed []SCN
	at := p.logAt
	var added int64
	entries := make([]tailEntry, 0, len(cs))
	for i := range cs {
		c := &cs[i]
		if !follows(last, c.SCN) {
			return nil, fmt.Errorf("partition %s/%d: apply %s after %s: %w", p.DB, p.ID, c.SCN, last, ErrTimeline)
		}
		for j := range c.Events {
			e := &c.Events[j]
			var prev *Event
			if j > 0 {
				prev = &c.Events[j-1]
			}
			if err := p.indexEvent(b, e, false, prev); err != nil {
				return nil, err
			}
			k := append(keys.DataTablePrefix(p.DB, p.ID, e.Table), e.Key...)
			switch e.Op {
			case OpInsert, OpUpdate:
				d := Doc{Version: e.Version, SCN: c.SCN, Modified: c.Timestamp, CRC: crc32.ChecksumIEEE(e.Value), Value: e.Value}
				if err := b.Set(k, p.encodeRow(&d), nil); err != nil {
					return nil, err
				}
				rows.put(k, d)
			case OpDelete:
				if err := b.Delete(k, nil); err != nil {
					return nil, err
				}
				rows.del(k)
			case OpAutoIncrement:
				if err := b.Set(autoIncrementKey(p.DB, p.ID, e.Table, e.Key), e.Value, nil); err != nil {
					return nil, err
				}
			default:
				return nil, fmt.Errorf("partition %s/%d: scn %s: unknown op %q", p.DB, p.ID, c.SCN, e.Op)
			}
		}
		lk, err := p.logKey(b, c.SCN, &at)
		if err != nil {
			return nil, err
		}
		entry := c.entry
		if entry == nil {
			entry = encodeCommit(c)
		}
		if err := b.Set(lk, entry, nil); err != nil {
			return nil, err
		}
		added += int64(len(lk) + len(entry))
		entries = append(entries, tailEntry{c.SCN, entry})
		if ok, err := p.noteGeneration(b, last, c.SCN); err != nil {
			return nil, err
		} else if ok {
			closed = append(closed, last)
		}
		last = c.SCN
	}
	// The master's acknowledged SCN is on the timeline this replica now
	// follows: the replica holds it as far as it has applied.
	if last.Less(acked) {
		acked = last
	}
	acked = later(p.acked, acked)
	stored, err := p.storeAcked(b, acked)
	if err != nil {
		return nil, err
	}
	rows.begin() // the row cache (rowcache.go)
	synced, err := p.e.apply(b)
	rows.end(err == nil)
	if err != nil {
		return nil, fmt.Errorf("partition %s/%d: commit through scn %s: %w", p.DB, p.ID, last, err)
	}
	for _, e := range closed {
		p.hist[e.Gen] = e.Seq
	}
	p.logAt = at
	p.logBytes += added
	prev := p.scn
	for _, t := range entries {
		p.tail.add(prev, t.scn, t.entry)
		prev = t.scn
	}
	queued = true
	p.scn = last
	p.acked, p.stored = acked, stored
	return func() error {
		defer b.Close()
		if err := synced(); err != nil {
			return fmt.Errorf("partition %s/%d: commit through scn %s: %w", p.DB, p.ID, last, err)
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if !p.scn.Less(last) { // not truncated meanwhile (the caller's to prevent)
			p.markDurableLocked(last)
		}
		return nil
	}, nil
}

// commitLog adds the log entry, the new SCN and the acknowledged SCN (if
// it moved) to b and commits it with fsync; the caller holds mu and moves
// the partition to c.SCN.
func (p *Partition) commitLog(b *pebble.Batch, c *Commit) error {
	wait, err := p.writeLog(b, c, false)
	if err != nil {
		return err
	}
	return wait()
}

// writeLog is commitLog, returning once b is applied when async: wait
// returns once it is durable. The caller holds mu until it has set p.scn,
// and marks the commit durable after wait.
func (p *Partition) writeLog(b *pebble.Batch, c *Commit, async bool) (wait func() error, err error) {
	at := p.logAt
	lk, err := p.logKey(b, c.SCN, &at)
	if err != nil {
		return nil, err
	}
	entry := encodeCommit(c)
	if err := b.Set(lk, entry, nil); err != nil {
		return nil, err
	}
	closed, err := p.noteGeneration(b, p.scn, c.SCN)
	if err != nil {
		return nil, err
	}
	stored, err := p.storeAcked(b, p.acked)
	if err != nil {
		return nil, err
	}
	wait = func() error { return nil }
	if async {
		wait, err = p.e.apply(b)
	} else {
		err = p.e.commit(b)
	}
	if err != nil {
		return nil, fmt.Errorf("partition %s/%d: commit scn %s: %w", p.DB, p.ID, c.SCN, err)
	}
	if closed {
		p.hist[p.scn.Gen] = p.scn.Seq
	}
	p.logAt = at
	p.logBytes += int64(len(lk) + len(entry))
	p.stored = stored
	p.tail.add(p.scn, c.SCN, entry)
	return wait, nil
}

// Acknowledged records that every commit of this replica's timeline up to
// scn has been acknowledged to a client (a master learns it from its
// slaves). It is made durable with the partition's next batch — a
// watermark that may lag, never lead: TruncateAfter refuses to remove
// anything at or below it.
func (p *Partition) Acknowledged(scn SCN) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.noteAcked(scn)
}

// noteAcked raises the in-memory watermark; the caller holds mu.
func (p *Partition) noteAcked(scn SCN) {
	if p.scn.Less(scn) {
		scn = p.scn
	}
	p.acked = later(p.acked, scn)
}

// DurableSCN returns the newest commit this replica has made durable.
func (p *Partition) DurableSCN() SCN {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.durable
}

// AcknowledgedSCN returns the acknowledged watermark (see Acknowledged).
func (p *Partition) AcknowledgedSCN() SCN {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.acked
}

// storeAcked adds acked to b if it is newer than what is stored, and
// the stored value is of another generation or ackedEvery old, and
// returns what will be stored once b commits. Storing it with every
// commit was one of four keys each commit put in Pebble's memtable on
// each replica. The watermark may lag: a crash forgets what was
// acknowledged since the last store (up to ackedEvery of commits under
// load; an acknowledgement after the partition's last commit waited for
// a next one before too), and a clean close stores it (Engine.Close).
func (p *Partition) storeAcked(b *pebble.Batch, acked SCN) (SCN, error) {
	if !p.stored.Less(acked) {
		return p.stored, nil
	}
	now := time.Now()
	if p.stored.Gen == acked.Gen && now.Sub(p.storedAt) < ackedEvery {
		return p.stored, nil
	}
	p.storedAt = now
	if err := b.Set(keys.Meta(p.DB, p.ID, "acked"), encodeSCN(acked), nil); err != nil {
		return SCN{}, err
	}
	return acked, nil
}

// ackedEvery is how often, at most, a partition stores its acknowledged
// watermark within one generation (storeAcked).
const ackedEvery = 50 * time.Millisecond

func later(a, b SCN) SCN {
	if a.Less(b) {
		return b
	}
	return a
}

func encodeSCN(s SCN) []byte {
	b := binary.BigEndian.AppendUint32(nil, s.Gen)
	return binary.BigEndian.AppendUint64(b, s.Seq)
}

// StartGeneration opens generation gen on a replica promoted to master:
// it commits (gen, 1), a commit without events that marks where the new
// master's timeline leaves the old one, before it takes any write. gen
// must be later than every generation the partition has seen. It is
// durable before it returns, so a restarted master never reuses a
// generation.
//
// The marker is what makes the new timeline win: once replicas hold it,
// they rank above any replica holding an older generation's commits the
// new master lacks (a failover chooses the replica furthest along), so
// what the new master serves, including older commits it confirmed,
// cannot be lost to such a replica (Raft's no-op entry; see
// docs/architecture.md, timeline and replication).
func (p *Partition) StartGeneration(gen uint32) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if seen := max(p.gen, p.scn.Gen); gen <= seen {
		return fmt.Errorf("partition %s/%d: generation %d is not after %d: %w", p.DB, p.ID, gen, seen, ErrTimeline)
	}
	b := p.e.db.NewBatch()
	defer b.Close()
	if err := b.Set(keys.Meta(p.DB, p.ID, "gen"), binary.BigEndian.AppendUint32(nil, gen), nil); err != nil {
		return err
	}
	c := Commit{SCN: SCN{Gen: gen, Seq: 1}, Timestamp: time.Now()}
	if err := p.commitLog(b, &c); err != nil {
		return fmt.Errorf("partition %s/%d: start generation %d: %w", p.DB, p.ID, gen, err)
	}
	p.gen = gen
	p.setSCN(c.SCN)
	return nil
}

// TruncateAfter removes every commit after keep from the log and undoes
// its effects with the pre-images it recorded, newest first, in one batch.
// A replica rejoining after a failover calls it with the last SCN the new
// timeline shares with it, so it can follow the new master. It returns how
// many events it undid. It refuses (ErrTruncateAcknowledged) to remove a
// commit at or below the acknowledged watermark.
func (p *Partition) TruncateAfter(keep SCN) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if keep.Less(p.acked) {
		return 0, fmt.Errorf("partition %s/%d: truncate after %s, but commits up to %s were acknowledged: %w", p.DB, p.ID, keep, p.acked, ErrTruncateAcknowledged)
	}
	if keep.Less(p.logStart) {
		return 0, fmt.Errorf("partition %s/%d: truncate after %s, but the log starts after %s: %w", p.DB, p.ID, keep, p.logStart, ErrTrimmed)
	}
	var commits []Commit
	var logKeys [][]byte
	var freed int64
	if err := p.scanLog(keep, maxSCN, func(scn SCN, k []byte, lv logValue) (bool, error) {
		v, err := lv.Read()
		if err != nil {
			return false, err
		}
		c, err := decodeCommit(scn, append([]byte(nil), v...))
		if err != nil {
			return false, err
		}
		freed += int64(len(k) + len(v))
		commits = append(commits, c)
		logKeys = append(logKeys, append([]byte(nil), k...))
		return true, nil
	}); err != nil {
		return 0, err
	}
	if len(commits) == 0 {
		return 0, nil
	}
	b := p.e.db.NewIndexedBatch()
	defer b.Close()
	undone := 0
	for i := len(commits) - 1; i >= 0; i-- {
		c := commits[i]
		for j := len(c.Events) - 1; j >= 0; j-- {
			e := c.Events[j]
			if err := p.indexEvent(b, &e, true, nil); err != nil {
				return 0, err
			}
			k := append(keys.DataTablePrefix(p.DB, p.ID, e.Table), e.Key...)
			if e.Op == OpAutoIncrement {
				mk := autoIncrementKey(p.DB, p.ID, e.Table, e.Key)
				var err error
				if len(e.PrevValue) == 0 {
					err = b.Delete(mk, nil)
				} else {
					err = b.Set(mk, e.PrevValue, nil)
				}
				if err != nil {
					return 0, err
				}
			} else if e.Op == OpInsert {
				if err := b.Delete(k, nil); err != nil {
					return 0, err
				}
			} else {
				d := Doc{Version: e.PrevVersion, SCN: e.PrevSCN, Modified: e.PrevModified, CRC: crc32.ChecksumIEEE(e.PrevValue), Value: e.PrevValue}
				if err := b.Set(k, encodeRow(nil, &d), nil); err != nil {
					return 0, err
				}
			}
			undone++
		}
		if err := b.Delete(logKeys[i], nil); err != nil {
			return 0, err
		}
	}
	// The epochs that start after keep are empty now; the partition's
	// last is the one keep is in, if any.
	if err := b.DeleteRange(keys.PrefixEnd(epochKey(p.DB, p.ID, keep)), keys.PrefixEnd(epochsPrefix(p.DB, p.ID)), nil); err != nil {
		return 0, err
	}
	last, wrote, err := p.epochAt(keep)
	if err != nil {
		return 0, err
	}
	if err := b.Set(keys.Meta(p.DB, p.ID, "scn"), encodeSCN(keep), nil); err != nil {
		return 0, err
	}
	// The generations after keep's are gone from the timeline, and keep's
	// is open again.
	var dropped []uint32
	for g := range p.hist {
		if g >= keep.Gen {
			if err := b.Delete(histKey(p.DB, p.ID, g), nil); err != nil {
				return 0, err
			}
			dropped = append(dropped, g)
		}
	}
	p.moveEpoch() // to odd: any row may change (rowcache.go)
	err = p.e.commit(b)
	p.moveEpoch()
	if err != nil {
		return 0, fmt.Errorf("partition %s/%d: truncate after %s: %w", p.DB, p.ID, keep, err)
	}
	for _, g := range dropped {
		delete(p.hist, g)
	}
	p.logAt = logCursor{last.epoch, wrote}
	p.logBytes -= freed
	p.setSCN(keep)
	return undone, nil
}

// Changed returns a channel closed at the partition's next durable commit
// (of any kind: local, applied, truncation), for long-polling readers of
// the log.
func (p *Partition) Changed() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changedLocked()
}

// changedLocked is Changed; the caller holds mu.
func (p *Partition) changedLocked() <-chan struct{} {
	if p.changed == nil {
		p.changed = make(chan struct{})
	}
	return p.changed
}

// notify wakes the readers waiting in Changed (whenever the durable SCN
// moves); the caller holds mu.
func (p *Partition) notify() {
	if p.changed != nil {
		close(p.changed)
		p.changed = nil
	}
}

// Sums are checksums of a partition's rows at one SCN: of all of them,
// and of each table's key range, to say where two replicas differ.
type Sums struct {
	SCN    SCN
	Total  uint64
	Tables map[string]uint64
}

// Checksum returns a checksum of every document row of the partition (keys
// and stored bytes, headers included) with the SCN it was taken at, from
// one snapshot. Replicas that passed through the same timeline to the same
// SCN have equal checksums.
func (p *Partition) Checksum() (SCN, uint64, error) {
	s, err := p.Sums()
	return s.SCN, s.Total, err
}

// IndexSum names, in Sums.Tables, the digest of the partition's index
// (IndexChecksum), which Sums.Total leaves out.
const IndexSum = "_index"

// Sums is Checksum with the checksum of each table's range.
func (p *Partition) Sums() (Sums, error) {
	p.mu.Lock()
	snap := p.e.db.NewSnapshot()
	scn := p.scn
	p.mu.Unlock()
	return p.checksum(snap, scn)
}

// ErrPassed is returned by ChecksumAt when the partition is already past
// the asked SCN (or on another generation): the caller takes a new
// reference checksum and asks again.
var ErrPassed = errors.New("storage: partition is past the asked SCN")

// ChecksumAt waits until the partition reaches exactly at (a slave
// catching up to its master's reference point), then checksums it there.
// It fails with ErrPassed if the partition went past at, and with the
// done channel's closing if that comes first.
func (p *Partition) ChecksumAt(at SCN, done <-chan struct{}) (Sums, error) {
	for {
		p.mu.Lock()
		scn := p.scn
		if scn == at {
			snap := p.e.db.NewSnapshot()
			p.mu.Unlock()
			return p.checksum(snap, scn)
		}
		if at.Less(scn) {
			p.mu.Unlock()
			return Sums{}, fmt.Errorf("partition %s/%d at %s, asked %s: %w", p.DB, p.ID, scn, at, ErrPassed)
		}
		changed := p.changedLocked()
		p.mu.Unlock()
		select {
		case <-changed:
		case <-done:
			return Sums{}, fmt.Errorf("partition %s/%d at %s did not reach %s", p.DB, p.ID, scn, at)
		}
	}
}

func (p *Partition) checksum(snap *pebble.Snapshot, scn SCN) (Sums, error) {
	defer snap.Close()
	prefix := append(keys.Partition(p.DB, p.ID), keys.SectionData)
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: keys.PrefixEnd(prefix)})
	if err != nil {
		return Sums{}, err
	}
	defer it.Close()
	s := Sums{SCN: scn, Tables: map[string]uint64{}}
	total := fnv.New64a()
	var table hash.Hash64
	var tableName string
	for valid := it.First(); valid; valid = it.NextPrefix() { // past a key's older values at once (see scan)
		k := it.Key()
		v, err := it.ValueAndErr()
		if err != nil {
			return Sums{}, err
		}
		tp, _, err := keys.DecodePart(k[len(prefix):])
		if err != nil {
			return Sums{}, err
		}
		if table == nil || tp.Str != tableName {
			if table != nil {
				s.Tables[tableName] = table.Sum64()
			}
			table, tableName = fnv.New64a(), tp.Str
		}
		for _, h := range []hash.Hash64{total, table} {
			h.Write(k)
			h.Write(v)
		}
	}
	if table != nil {
		s.Tables[tableName] = table.Sum64()
	}
	if err := it.Error(); err != nil {
		return Sums{}, err
	}
	// The auto-increment marks are replicated state too.
	marks := keys.Meta(p.DB, p.ID, "autoinc")
	mit, err := snap.NewIter(&pebble.IterOptions{LowerBound: marks, UpperBound: keys.PrefixEnd(marks)})
	if err != nil {
		return Sums{}, err
	}
	defer mit.Close()
	auto := fnv.New64a()
	n := 0
	for valid := mit.First(); valid; valid = mit.NextPrefix() { // past a key's older values at once (see scan)
		v, err := mit.ValueAndErr()
		if err != nil {
			return Sums{}, err
		}
		for _, h := range []hash.Hash64{total, auto} {
			h.Write(mit.Key())
			h.Write(v)
		}
		n++
	}
	if n > 0 {
		s.Tables["_autoincrement"] = auto.Sum64()
	}
	// The index, as queries see it: beside the total, not in it, so that
	// a node of a version before it still compares equal by the total
	// (the checker compares it where both sides have it).
	idx, _, err := p.indexDigest(snap)
	if err != nil {
		return Sums{}, err
	}
	s.Tables[IndexSum] = uint64(idx)
	s.Total = total.Sum64()
	return s, mit.Error()
}

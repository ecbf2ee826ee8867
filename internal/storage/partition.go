package storage

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cortado-db/cortado/internal/keys"
)

// Partition is one partition's slice of the engine.
type Partition struct {
	e  *Engine
	DB string
	ID int

	// mu serializes commits, and so SCN assignment and every
	// read-modify-write (conditionals, patches, auto-increment).
	mu      sync.Mutex
	scn     SCN           // last committed (applied; see durable)
	gen     uint32        // generation of the next local commit (StartGeneration)
	changed chan struct{} // closed at the next durable commit; see Changed

	// durable is the last commit known to be durable: scn, or behind it
	// while a master's commits wait for their shared fsync (Update). Only
	// durable commits are shipped to replicas or reported; changed is
	// closed when it moves.
	durable SCN

	// acked is the newest SCN of this replica's timeline known to have
	// been acknowledged to a client (see Acknowledged); stored is the
	// value last made durable, written with a later batch (storeAcked),
	// at storedAt.
	acked, stored SCN
	storedAt      time.Time

	// row is where a commit or an apply encodes a row for its batch,
	// which copies it (under mu).
	row []byte

	// hist is the generation history (see retention.go); logStart the
	// SCN the log starts after; logBytes about what its entries take.
	hist     map[uint32]uint64
	logStart SCN
	logBytes int64

	// logAt is the epoch of the log space the partition last wrote in
	// (logspace.go).
	logAt logCursor

	// tail is the newest part of the log, in memory (logtail.go); it
	// ends at scn or is not read.
	tail logTail

	// stripes and epoch guard the row cache (rowcache.go); moved under
	// mu. The stripes are made at their first use (stripeArray): 4 KiB a
	// partition that no read or write touched would not hold.
	stripes atomic.Pointer[[rowStripes]rowStripe]
	epoch   atomic.Uint64

	// durableAt is when this replica's last commits as master became
	// durable, by sequence modulo its size (DurableAt); made at the first
	// such commit, so that a partition that never took a write as master
	// (most of a node's, with many databases) does not hold its 24 KiB.
	durableAt *[DurableRing]durableMark
}

// durableMark is when one commit became durable (Unix nanoseconds:
// pointer-free, so the collector does not scan the ring).
type durableMark struct {
	scn SCN
	at  int64
}

// DurableRing is how many of a master's newest commits DurableAt knows.
const DurableRing = 1024

func openPartition(e *Engine, db string, id int) (*Partition, error) {
	p := &Partition{e: e, DB: db, ID: id}
	if err := p.migrateLog(); err != nil {
		return nil, err
	}
	if err := p.loadEpochs(); err != nil {
		return nil, err
	}
	var err error
	if p.logStart, err = readMetaSCN(e, db, id, "logstart"); err != nil {
		return nil, err
	}
	// A commit does not store the SCN it moves the partition to: its log
	// entry says it. The meta key holds what the log's last entry does
	// not (a truncation's, an install's, a trim's SCN).
	if p.scn, err = readMetaSCN(e, db, id, "scn"); err != nil {
		return nil, err
	}
	last, err := p.measureLog()
	if err != nil {
		return nil, fmt.Errorf("partition %s/%d: measure the log: %w", db, id, err)
	}
	p.scn = later(p.scn, last)
	p.durable = p.scn
	if p.acked, err = readMetaSCN(e, db, id, "acked"); err != nil {
		return nil, err
	}
	p.stored = p.acked
	if err := p.loadHistory(); err != nil {
		return nil, fmt.Errorf("partition %s/%d: generation history: %w", db, id, err)
	}
	if _, closer, err := e.db.Get(keys.Meta(db, id, "rebuilding")); err == nil {
		// A rebuild from a snapshot did not finish: start it over from
		// empty.
		closer.Close()
		if err := p.wipe(); err != nil {
			return nil, err
		}
	} else if !errors.Is(err, pebble.ErrNotFound) {
		return nil, err
	}
	g, closer, err := e.db.Get(keys.Meta(db, id, "gen"))
	switch {
	case errors.Is(err, pebble.ErrNotFound):
	case err != nil:
		return nil, fmt.Errorf("partition %s/%d: read generation: %w", db, id, err)
	default:
		defer closer.Close()
		if len(g) != 4 {
			return nil, fmt.Errorf("partition %s/%d: corrupt generation", db, id)
		}
		p.gen = binary.BigEndian.Uint32(g)
	}
	return p, nil
}

// readMetaSCN reads an SCN kept in the partition's meta section (zero if
// absent).
func readMetaSCN(e *Engine, db string, id int, name string) (SCN, error) {
	v, closer, err := e.db.Get(keys.Meta(db, id, name))
	if errors.Is(err, pebble.ErrNotFound) {
		return SCN{}, nil
	}
	if err != nil {
		return SCN{}, fmt.Errorf("partition %s/%d: read %s: %w", db, id, name, err)
	}
	defer closer.Close()
	if len(v) != 12 {
		return SCN{}, fmt.Errorf("partition %s/%d: corrupt %s", db, id, name)
	}
	return SCN{Gen: binary.BigEndian.Uint32(v), Seq: binary.BigEndian.Uint64(v[4:])}, nil
}

// Generation returns the latest generation the partition has seen: of its
// last commit, or a later one started since.
func (p *Partition) Generation() uint32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return max(p.gen, p.scn.Gen)
}

// SCN returns the last durable commit's SCN: what the partition holds
// for certain, and all it ships to replicas or reports.
func (p *Partition) SCN() SCN {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.durable
}

// setSCN moves the partition to scn after a synchronous commit (durable,
// and so every commit before it too), or back after a truncation or a
// rebuild; the caller holds mu.
func (p *Partition) setSCN(scn SCN) {
	if p.tail.last() != scn {
		p.tail.reset(scn) // a truncation or a rebuild
	}
	p.scn, p.durable = scn, scn
	p.notify()
}

// markDurableLocked records that every commit up to scn is durable; the
// caller holds mu.
func (p *Partition) markDurableLocked(scn SCN) {
	if p.durable.Less(scn) {
		p.durable = scn
		p.notify()
	}
}

// AwaitDurable waits until the commit at scn (and so every commit before
// it) is durable, or ctx ends, or the engine fails. A reader of a master
// awaits what it read, so it never returns a write a crash could still
// undo.
func (p *Partition) AwaitDurable(ctx context.Context, scn SCN) error {
	for {
		p.mu.Lock()
		if !p.durable.Less(scn) || p.scn.Less(scn) {
			// Durable, or not a commit of this replica's (a read of
			// another timeline's SCN has nothing to wait for).
			p.mu.Unlock()
			return nil
		}
		ch := p.changedLocked()
		p.mu.Unlock()
		select {
		case <-ch:
		case <-p.e.FailedC():
			// A commit whose fsync failed never becomes durable.
			return p.e.Failed()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (p *Partition) dataKey(table string, key []keys.Part) []byte {
	return keys.Data(p.DB, p.ID, table, key)
}

// Get reads one document.
func (p *Partition) Get(table string, key []keys.Part) (Doc, bool, error) {
	return p.cachedGet(p.e.db, p.dataKey(table, key))
}

type getter interface {
	Get(key []byte) ([]byte, io.Closer, error)
}

func getDoc(r getter, k []byte) (Doc, bool, error) {
	v, closer, err := r.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return Doc{}, false, nil
	}
	if err != nil {
		return Doc{}, false, err
	}
	defer closer.Close()
	d, err := decodeRow(v)
	if err != nil {
		return Doc{}, false, fmt.Errorf("key %x: %w", k, err)
	}
	d.Value = append([]byte(nil), d.Value...)
	return d, true, nil
}

// ScanOptions selects documents of one collection.
type ScanOptions struct {
	Table string
	// Prefix is the leading key parts of the collection (may be empty:
	// the whole table in this partition).
	Prefix []keys.Part
	// After resumes after this full encoded key (a continuation token).
	After []byte
	// Limit stops after this many documents (0: no limit).
	Limit int
}

// Scan calls fn for each document of a collection in key order, with its
// key parts and its encoded key, from one consistent snapshot. fn returns
// false to stop.
func (p *Partition) Scan(o ScanOptions, fn func(key []keys.Part, encoded []byte, d Doc) bool) error {
	return scan(p.e.db, p.e, p.DB, p.ID, o, fn)
}

type iterable interface {
	NewIter(*pebble.IterOptions) (*pebble.Iterator, error)
}

func scan(r iterable, e *Engine, db string, id int, o ScanOptions, fn func([]keys.Part, []byte, Doc) bool) error {
	tablePrefix := keys.DataTablePrefix(db, id, o.Table)
	lower := keys.AppendParts(append([]byte(nil), tablePrefix...), o.Prefix)
	upper := keys.PrefixEnd(lower)
	if o.After != nil {
		after := append(append([]byte(nil), tablePrefix...), o.After...)
		// The smallest key after `after` is after+0x00.
		if start := append(after, 0); string(start) > string(lower) {
			lower = start
		}
	}
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return err
	}
	defer e.closeIter(it)
	n := 0
	// NextPrefix, not Next: a document rewritten many times has as many
	// values in the memtable, and Next steps over each of them (a
	// collection of 20 read in 5.8 ms after 74,000 writes of one of
	// its documents, 0.4 ms before), where NextPrefix seeks past them.
	// Every key is its own prefix (the default comparer's Split).
	for valid := it.First(); valid; valid = it.NextPrefix() {
		encoded := it.Key()[len(tablePrefix):]
		parts, err := keys.Decode(encoded)
		if err != nil {
			return fmt.Errorf("key %x: %w", it.Key(), err)
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		d, err := decodeRow(v)
		if err != nil {
			return fmt.Errorf("key %x: %w", it.Key(), err)
		}
		d.Value = append([]byte(nil), d.Value...)
		if !fn(parts, append([]byte(nil), encoded...), d) {
			break
		}
		if n++; o.Limit > 0 && n >= o.Limit {
			break
		}
	}
	return it.Error()
}

// ReadLog calls fn for each durable commit with an SCN after from, in SCN
// order, until fn returns false. The newest commits come from the log's
// tail in memory, older ones from Pebble. From before the log's start it
// reads from the start. It fails with ErrTrimmed when a trim passed where
// it read from while it read (fn may then have been given commits after
// a gap, to be dropped).
func (p *Partition) ReadLog(from SCN, fn func(Commit) bool) error {
	p.mu.Lock()
	upTo := p.durable
	from = later(from, p.logStart)
	var tail []tailEntry
	inTail := false
	if p.tail.last() == p.scn {
		tail, inTail = p.tail.after(from, upTo)
	}
	p.mu.Unlock()
	if !inTail {
		if err := p.readStoredLog(from, upTo, fn); err != nil {
			return err
		}
		// A trim past from after it was taken above and before the read
		// took its view of the log may have left a gap in what fn was
		// given.
		p.mu.Lock()
		defer p.mu.Unlock()
		if from.Less(p.logStart) {
			return fmt.Errorf("partition %s/%d: the log was trimmed past %s during a read: %w", p.DB, p.ID, from, ErrTrimmed)
		}
		return nil
	}
	for _, t := range tail {
		c, err := decodeCommit(t.scn, append([]byte(nil), t.entry...))
		if err != nil {
			return fmt.Errorf("partition %s/%d: scn %s: %w", p.DB, p.ID, t.scn, err)
		}
		if !fn(c) {
			break
		}
	}
	return nil
}

// readStoredLog is ReadLog from Pebble, up to upTo (what is after it is
// not durable yet).
func (p *Partition) readStoredLog(from, upTo SCN, fn func(Commit) bool) error {
	return p.scanLog(from, upTo, func(scn SCN, _ []byte, lv logValue) (bool, error) {
		v, err := lv.Read()
		if err != nil {
			return false, err
		}
		c, err := decodeCommit(scn, append([]byte(nil), v...))
		if err != nil {
			return false, fmt.Errorf("partition %s/%d: scn %s: %w", p.DB, p.ID, scn, err)
		}
		return fn(c), nil
	})
}

// Update runs fn in a transaction of this partition. Everything fn writes
// commits as one batch under the next SCN, with fsync; if fn fails nothing
// is written. A transaction that writes nothing commits nothing and
// returns the current SCN. Update returns once the commit is durable.
//
// Group commit: the partition's lock is held while the SCN is assigned
// and the batch applied (so commits reach the write-ahead log in SCN
// order, and each transaction reads the ones before it), then released
// for the fsync, which concurrent commits of this and other partitions
// share. A commit is shipped to replicas and reported by SCN only once
// durable (ReadLog, SCN), and readers of a master wait for the durability
// of what they read (AwaitDurable).
func (p *Partition) Update(fn func(tx *Tx) error) (SCN, error) {
	p.mu.Lock()
	next := SCN{Gen: p.scn.Gen, Seq: p.scn.Seq + 1}
	switch {
	case p.gen > p.scn.Gen:
		// The first commit of a generation this replica started.
		next = SCN{Gen: p.gen, Seq: 1}
	case next.Gen == 0:
		// A partition that was never given a generation (single-node
		// mode) opens generation 1 with its first commit.
		next.Gen = 1
	}
	tx := &Tx{p: p, b: p.e.db.NewIndexedBatch(), scn: next, now: time.Now(), rows: rowWrites{p: p}}
	defer tx.b.Close()
	if err := fn(tx); err != nil {
		p.mu.Unlock()
		return SCN{}, err
	}
	if len(tx.events) == 0 {
		cur := p.scn
		p.mu.Unlock()
		return cur, p.AwaitDurable(context.Background(), cur)
	}
	var prev *Event
	for i := range tx.events {
		e := &tx.events[i]
		err := p.indexEvent(tx.b, e, false, prev)
		prev = e
		if err != nil {
			p.mu.Unlock()
			return SCN{}, err
		}
	}
	c := Commit{SCN: next, Timestamp: tx.now, Events: tx.events}
	tx.rows.begin() // the row cache (rowcache.go)
	wait, err := p.writeLog(tx.b, &c, true)
	if rowsApplied != nil {
		rowsApplied()
	}
	tx.rows.end(err == nil)
	if err != nil {
		p.mu.Unlock()
		return SCN{}, err
	}
	p.scn = next
	p.mu.Unlock()
	if err := wait(); err != nil {
		return SCN{}, fmt.Errorf("partition %s/%d: commit scn %s: %w", p.DB, p.ID, next, err)
	}
	p.mu.Lock()
	p.markDurableLocked(next)
	if p.durableAt == nil {
		p.durableAt = new([DurableRing]durableMark)
	}
	p.durableAt[next.Seq%DurableRing] = durableMark{next, time.Now().UnixNano()}
	p.mu.Unlock()
	return next, nil
}

// DurableBetween calls fn, in order, with each of this replica's commits
// after after and up to upTo (of upTo's generation) that is among the
// last DurableRing it made as master, and when it became durable: what
// replication lag is measured from, as PostgreSQL measures its replicas'
// lag from the primary's flush. fn runs under the partition's lock and
// must not call it.
func (p *Partition) DurableBetween(after, upTo SCN, fn func(scn SCN, at time.Time)) {
	from := uint64(1)
	if after.Gen == upTo.Gen {
		from = after.Seq + 1
	}
	if upTo.Seq >= DurableRing {
		from = max(from, upTo.Seq-DurableRing+1)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.durableAt == nil {
		return
	}
	for seq := from; seq <= upTo.Seq; seq++ {
		if d := p.durableAt[seq%DurableRing]; d.scn == (SCN{Gen: upTo.Gen, Seq: seq}) {
			fn(d.scn, time.Unix(0, d.at))
		}
	}
}

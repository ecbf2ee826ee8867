package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cortado-db/cortado/internal/keys"
)

// Tx is a transaction of one partition, open inside Partition.Update. Reads
// see the transaction's own writes.
type Tx struct {
	p      *Partition
	b      *pebble.Batch
	scn    SCN
	now    time.Time
	events []Event
	size   int       // the events' Commit.Size so far
	rows   rowWrites // the rows it writes, for the row cache
	// read is the last document Get read, until anything is written: a
	// write of the document just read (preconditions, then the write)
	// takes its pre-image from here instead of reading it again.
	read struct {
		key    []byte
		doc    Doc
		exists bool
	}
}

// prev reads the document at data key k as the transaction sees it.
func (tx *Tx) prev(k []byte) (Doc, bool, error) {
	if tx.read.key != nil && string(tx.read.key) == string(k) {
		return tx.read.doc, tx.read.exists, nil
	}
	return tx.get(k)
}

// get reads the document at data key k as the transaction sees it:
// through the row cache until the transaction writes anything (its batch
// holds only what the partition does; its lock keeps the stamps still).
func (tx *Tx) get(k []byte) (Doc, bool, error) {
	if tx.b.Empty() {
		return tx.p.cachedGet(tx.b, k)
	}
	return getDoc(tx.b, k)
}

// SCN is the SCN this transaction commits under.
func (tx *Tx) SCN() SCN { return tx.scn }

// Now is the transaction's timestamp, the Last-Modified of what it writes.
func (tx *Tx) Now() time.Time { return tx.now }

// Get reads a document as the transaction sees it.
func (tx *Tx) Get(table string, key []keys.Part) (Doc, bool, error) {
	k := tx.p.dataKey(table, key)
	d, ok, err := tx.get(k)
	if err == nil {
		tx.read.key, tx.read.doc, tx.read.exists = k, d, ok
	}
	return d, ok, err
}

// Scan reads a collection as the transaction sees it.
func (tx *Tx) Scan(o ScanOptions, fn func(key []keys.Part, encoded []byte, d Doc) bool) error {
	return scan(tx.b, tx.p.e, tx.p.DB, tx.p.ID, o, fn)
}

// Put writes a document (Avro bytes of schema version) and returns what
// was stored.
func (tx *Tx) Put(table string, key []keys.Part, version int, value []byte) (Doc, error) {
	k := tx.p.dataKey(table, key)
	prev, existed, err := tx.prev(k)
	if err != nil {
		return Doc{}, err
	}
	tx.read.key = nil
	e := Event{Op: OpInsert, Table: table, Key: keys.Encode(key), Version: version, Value: value}
	if existed {
		e.Op, e.PrevVersion, e.PrevValue, e.PrevSCN, e.PrevModified = OpUpdate, prev.Version, prev.Value, prev.SCN, prev.Modified
	}
	if err := tx.fits(&e); err != nil {
		return Doc{}, err
	}
	d := Doc{Version: version, SCN: tx.scn, Modified: tx.now, CRC: crc32.ChecksumIEEE(value), Value: value}
	if err := tx.b.Set(k, tx.p.encodeRow(&d), nil); err != nil {
		return Doc{}, err
	}
	tx.rows.put(k, d)
	tx.events = append(tx.events, e)
	return d, nil
}

// MaxCommitBytes bounds one commit (Commit.Size: its documents, their
// pre-images and keys). Every replica applies a commit whole, the
// relay and the change stream hold it whole, and a log answer carries
// it in one message (64 MiB, wire.MaxMessageBytes, with up to 16 MiB of
// commits before it, node.MaxLogBytes): a commit past that would be
// durable on its master and never reach a slave, and every later write
// of its partition would wait for it. A transaction that would grow past
// it fails with ErrCommitTooLarge before anything is written. It holds
// the replacement of a document of the largest request body a router
// takes (16 MiB) by another.
const MaxCommitBytes = 40 << 20

// ErrCommitTooLarge is a transaction whose commit would be over
// MaxCommitBytes.
var ErrCommitTooLarge = errors.New("storage: commit too large")

// fits counts e into the commit, or says it would take it over
// MaxCommitBytes.
func (tx *Tx) fits(e *Event) error {
	n := eventSize(e)
	if tx.size+n > MaxCommitBytes-commitOverhead {
		return fmt.Errorf("%w: its documents, their previous versions and keys come to %d bytes or more, over the limit of %d", ErrCommitTooLarge, tx.size+n+commitOverhead, MaxCommitBytes)
	}
	tx.size += n
	return nil
}

// Delete removes a document; it reports whether it existed.
func (tx *Tx) Delete(table string, key []keys.Part) (bool, error) {
	k := tx.p.dataKey(table, key)
	prev, existed, err := tx.prev(k)
	if err != nil || !existed {
		return false, err
	}
	tx.read.key = nil
	e := Event{Op: OpDelete, Table: table, Key: keys.Encode(key),
		PrevVersion: prev.Version, PrevValue: prev.Value, PrevSCN: prev.SCN, PrevModified: prev.Modified}
	if err := tx.fits(&e); err != nil {
		return false, err
	}
	if err := tx.b.Delete(k, nil); err != nil {
		return false, err
	}
	tx.rows.del(k)
	tx.events = append(tx.events, e)
	return true, nil
}

// DeleteCollection deletes every document of table whose key starts with
// prefix and returns how many. When prefix is a whole collection (the
// key's first part, the document group), the deletes are marked so, and
// the collection's index entries go by range instead of one by one.
// With keepMarks (a table whose last key part auto-increments), each
// collection a deleted key was in keeps its auto-increment mark at least
// at that key (KeepMark).
func (tx *Tx) DeleteCollection(table string, prefix []keys.Part, keepMarks bool) (int, error) {
	var doomed [][]keys.Part
	// The deletes' size is known from the scan: a collection too large
	// to delete in one commit is refused before its keys are gathered.
	size := tx.size + commitOverhead
	err := tx.Scan(ScanOptions{Table: table, Prefix: prefix}, func(k []keys.Part, encoded []byte, d Doc) bool {
		size += eventSize(&Event{Table: table, Key: encoded, PrevValue: d.Value})
		if size > MaxCommitBytes {
			return false
		}
		doomed = append(doomed, k)
		return true
	})
	if err != nil {
		return 0, err
	}
	if size > MaxCommitBytes {
		return 0, fmt.Errorf("%w: the collection holds more than %d documents, whose deletes and previous versions come to %d bytes or more, over the limit of %d; delete it in parts (transactions deleting some of its documents each)",
			ErrCommitTooLarge, len(doomed), size, MaxCommitBytes)
	}
	first := len(tx.events)
	for _, k := range doomed {
		if _, err := tx.Delete(table, k); err != nil {
			return 0, err
		}
	}
	if len(prefix) == 1 {
		for i := first; i < len(tx.events); i++ {
			tx.events[i].WholeCollection = true
		}
	}
	if keepMarks {
		// Keys come in key order: the last of each collection is its
		// largest.
		for i, k := range doomed {
			if i+1 < len(doomed) && slices.Equal(k[:len(k)-1], doomed[i+1][:len(k)-1]) {
				continue
			}
			if err := tx.KeepMark(table, k); err != nil {
				return 0, err
			}
		}
	}
	return len(doomed), nil
}

// KeepMark records, for a table whose last key part auto-increments,
// that key (just deleted) was in use: its collection's auto-increment
// mark moves up to it, so that an insert never hands out a key a deleted
// document had, whether an insert or a put made it.
func (tx *Tx) KeepMark(table string, key []keys.Part) error {
	if len(key) == 0 || !key[len(key)-1].IsInt {
		return nil
	}
	prefix := key[:len(key)-1]
	metaKey := autoIncrementKey(tx.p.DB, tx.p.ID, table, keys.AppendParts(nil, prefix))
	last, prev, err := tx.mark(metaKey)
	if err != nil || last >= key[len(key)-1].Int {
		return err
	}
	return tx.setMark(table, prefix, metaKey, key[len(key)-1].Int, prev)
}

// mark reads a collection's auto-increment mark: its value (0 if none)
// and stored bytes (nil if none).
func (tx *Tx) mark(metaKey []byte) (int64, []byte, error) {
	v, closer, err := tx.b.Get(metaKey)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		return 0, nil, nil
	case err != nil:
		return 0, nil, err
	}
	defer closer.Close()
	return int64(binary.BigEndian.Uint64(v)), append([]byte(nil), v...), nil
}

// setMark sets a collection's auto-increment mark to next (prev: its
// stored bytes before) in the transaction and its commit.
func (tx *Tx) setMark(table string, prefix []keys.Part, metaKey []byte, next int64, prev []byte) error {
	value := binary.BigEndian.AppendUint64(nil, uint64(next))
	// The high-water mark travels in the commit, so a replica promoted
	// later never hands out a key its master handed out before.
	e := Event{Op: OpAutoIncrement, Table: table, Key: keys.AppendParts(nil, prefix), Value: value, PrevValue: prev}
	if err := tx.fits(&e); err != nil {
		return err
	}
	if err := tx.b.Set(metaKey, value, nil); err != nil {
		return err
	}
	tx.events = append(tx.events, e)
	return nil
}

// ErrKeysExhausted is an insert into a collection whose auto-increment
// key part has reached the largest value of its type: the next would
// wrap to the smallest, or not fit the type.
var ErrKeysExhausted = errors.New("storage: auto-increment keys exhausted")

// NextAutoIncrement returns the next value of the auto-increment last key
// part under collection prefix: one more than both the largest value ever
// handed out there (or deleted: KeepMark) and the largest key present, so
// deleted keys are never reused. Past most (the largest value of the
// part's type) it is ErrKeysExhausted, and nothing is recorded.
func (tx *Tx) NextAutoIncrement(table string, prefix []keys.Part, most int64) (int64, error) {
	metaKey := autoIncrementKey(tx.p.DB, tx.p.ID, table, keys.AppendParts(nil, prefix))
	last, prev, err := tx.mark(metaKey)
	if err != nil {
		return 0, err
	}
	// The largest present key: the last entry of the collection.
	lower := keys.AppendParts(keys.DataTablePrefix(tx.p.DB, tx.p.ID, table), prefix)
	it, err := tx.b.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: keys.PrefixEnd(lower)})
	if err != nil {
		return 0, err
	}
	if it.Last() {
		parts, err := keys.Decode(it.Key()[len(lower):])
		if err == nil && len(parts) == 1 && parts[0].IsInt && parts[0].Int > last {
			last = parts[0].Int
		}
	}
	if err := it.Close(); err != nil {
		return 0, err
	}
	if last >= most {
		return 0, fmt.Errorf("%w: the largest key here is %d, the most its type holds", ErrKeysExhausted, last)
	}
	next := last + 1
	if err := tx.setMark(table, prefix, metaKey, next, prev); err != nil {
		return 0, err
	}
	return next, nil
}

// autoIncrementKey is where a collection's auto-increment high-water mark
// lives: prefix is the collection's encoded leading key parts.
func autoIncrementKey(db string, id int, table string, prefix []byte) []byte {
	return append(keys.Meta(db, id, "autoinc", keys.S(table)), prefix...)
}

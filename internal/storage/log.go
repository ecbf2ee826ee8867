package storage

import (
	"encoding/binary"
	"errors"
	"time"
)

// Op is the kind of change an event records.
type Op byte

// Event kinds.
const (
	OpInsert Op = 'i'
	OpUpdate Op = 'u'
	OpDelete Op = 'd'
	// OpAutoIncrement records a collection's auto-increment high-water
	// mark (Key: the collection's encoded prefix; Value and PrevValue:
	// the new and the old mark, 8 bytes big-endian, PrevValue empty if
	// none). It is no document change: change streams skip it.
	OpAutoIncrement Op = 'a'
)

func (o Op) String() string {
	switch o {
	case OpInsert:
		return "insert"
	case OpUpdate:
		return "update"
	case OpDelete:
		return "delete"
	case OpAutoIncrement:
		return "auto-increment"
	}
	return "unknown"
}

// Event is one document change inside a commit: what the change stream and
// replicas consume.
type Event struct {
	Op    Op
	Table string
	// Key is the encoded key (keys.Encode) of the document.
	Key []byte
	// Version and Value are the post-image (absent for deletes).
	Version int
	Value   []byte
	// PrevVersion, PrevValue, PrevSCN and PrevModified are the pre-image
	// and the header it had (absent for inserts), enough to restore the
	// row exactly when a commit is truncated.
	PrevVersion  int
	PrevValue    []byte
	PrevSCN      SCN
	PrevModified time.Time
	// WholeCollection marks a delete that is part of deleting the whole
	// collection of its key (its first part) in one operation: every
	// document of it then has such an event, one after another. Replicas
	// remove the collection's index entries by range on the first of
	// them; a replica that does not know the mark removes them document
	// by document, to the same state.
	WholeCollection bool
}

// Commit is one entry of a partition's commit log: every event of one
// transaction, under one SCN.
type Commit struct {
	SCN       SCN
	Timestamp time.Time
	Events    []Event
	// entry is the log entry the commit was read from, when it was read
	// from a log of this process (ReadLog): a replica that applies it
	// stores these bytes, the master's own, instead of encoding the
	// commit again (1.6 % of serve --nodes 3's CPU under PUTs, and an
	// entry's allocation a slave a write). Commits that came over the
	// wire have none.
	entry []byte
}

// Size is about how many bytes the commit takes: what bounds a batch of
// them.
func (c *Commit) Size() int {
	n := commitOverhead
	for i := range c.Events {
		n += eventSize(&c.Events[i])
	}
	return n
}

// commitOverhead and eventSize make up Commit.Size: an event's bytes,
// and at least what its encodings (the log entry's, the internal
// protocol's: tags, lengths, versions, the pre-image's SCN and time)
// take beside them, so that a commit's size bounds its message
// (node.TestLargestCommitFitsAMessage).
const commitOverhead = 32

func eventSize(e *Event) int {
	return 48 + len(e.Table) + len(e.Key) + len(e.Value) + len(e.PrevValue)
}

var errCorruptLog = errors.New("storage: corrupt commit log entry")

func encodeCommit(c *Commit) []byte {
	// One allocation of the most the entry can take: growing it as the
	// documents are appended copied each 1 KB document and its
	// pre-image several times.
	n := 3 * binary.MaxVarintLen64
	for i := range c.Events {
		e := &c.Events[i]
		n += 1 + len(e.Table) + len(e.Key) + len(e.Value) + len(e.PrevValue) + 10*binary.MaxVarintLen64
	}
	b := binary.AppendVarint(make([]byte, 0, n), c.Timestamp.UnixNano())
	b = binary.AppendUvarint(b, uint64(len(c.Events)))
	for _, e := range c.Events {
		b = append(b, byte(e.Op))
		b = appendBytes(b, []byte(e.Table))
		b = appendBytes(b, e.Key)
		b = binary.AppendUvarint(b, uint64(e.Version))
		b = appendBytes(b, e.Value)
		b = binary.AppendUvarint(b, uint64(e.PrevVersion))
		b = appendBytes(b, e.PrevValue)
		b = binary.AppendUvarint(b, uint64(e.PrevSCN.Gen))
		b = binary.AppendUvarint(b, e.PrevSCN.Seq)
		b = binary.AppendVarint(b, e.PrevModified.UnixNano())
	}
	// After the events, the indexes of those deleting a whole
	// collection, if any: a decoder that does not know this trailer
	// ignores it (the deletes are whole without it).
	var whole []int
	for i := range c.Events {
		if c.Events[i].WholeCollection {
			whole = append(whole, i)
		}
	}
	if len(whole) > 0 {
		b = binary.AppendUvarint(b, uint64(len(whole)))
		for _, i := range whole {
			b = binary.AppendUvarint(b, uint64(i))
		}
	}
	return b
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

type logReader struct {
	b   []byte
	err error
}

func (r *logReader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errCorruptLog
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *logReader) varint() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errCorruptLog
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *logReader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil || n > uint64(len(r.b)) {
		r.err = errCorruptLog
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func decodeCommit(scn SCN, b []byte) (Commit, error) {
	ts, n := binary.Varint(b)
	if n <= 0 {
		return Commit{}, errCorruptLog
	}
	r := logReader{b: b[n:]}
	c := Commit{SCN: scn, Timestamp: time.Unix(0, ts), entry: b}
	count := r.uvarint()
	for i := uint64(0); i < count && r.err == nil; i++ {
		if len(r.b) == 0 {
			return Commit{}, errCorruptLog
		}
		e := Event{Op: Op(r.b[0])}
		r.b = r.b[1:]
		e.Table = string(r.bytes())
		e.Key = r.bytes()
		e.Version = int(r.uvarint())
		e.Value = r.bytes()
		e.PrevVersion = int(r.uvarint())
		e.PrevValue = r.bytes()
		e.PrevSCN = SCN{Gen: uint32(r.uvarint()), Seq: r.uvarint()}
		e.PrevModified = time.Unix(0, r.varint())
		c.Events = append(c.Events, e)
	}
	if r.err == nil && len(r.b) > 0 {
		n := r.uvarint()
		for j := uint64(0); j < n && r.err == nil; j++ {
			i := r.uvarint()
			if i >= uint64(len(c.Events)) || c.Events[i].Op != OpDelete {
				r.err = errCorruptLog
				break
			}
			c.Events[i].WholeCollection = true
		}
	}
	if r.err != nil {
		return Commit{}, r.err
	}
	return c, nil
}

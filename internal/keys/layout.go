package keys

import (
	"encoding/binary"
	"fmt"
)

// Sections of a partition's key range. Every key of a storage node but the
// commit log's starts with Partition(db, id), so a partition's rows, index
// and metadata are one contiguous range that can be scanned or deleted on
// its own.
const (
	SectionData byte = 'd' // P|d|table|key… → document row
	SectionIdx  byte = 'i' // P|i|kind|table|… → index postings, ordinals, statistics (storage/index.go)
	SectionMeta byte = 'm' // P|m|name… → partition metadata
	// SectionLog held a partition's commit log (P|l|generation|sequence)
	// before the log moved to the log space; storage moves what it finds
	// there when it opens the partition.
	SectionLog byte = 'l'
)

// LogSpace starts every commit-log key: L|epoch|P|generation|sequence → one
// commit's events. It sorts before every partition's keys (their first
// byte is a string part's tag), and the epoch, an engine-wide counter that
// only grows, comes before the partition: new log entries sort after all
// older epochs' and before every row. So a memtable's flush, which holds
// the newest epoch's entries and rows of every partition, spans no older
// entry, and compactions out of level 0 leave the retained log alone
// instead of rewriting every partition's log keys each time.
const LogSpace byte = 0x08

// EngineSpace starts the keys that describe a storage node's whole
// keyspace rather than a partition: E|name → value. It sorts before the
// log space and every partition.
const EngineSpace byte = 0x04

// Engine returns the key of a named piece of engine-wide metadata.
func Engine(name string) []byte { return append([]byte{EngineSpace}, name...) }

// Partition returns the key prefix of partition id of database db, with
// room for what is usually appended (a section, a table, a short key, an
// SCN): a key is built in one allocation, not one per part.
func Partition(db string, id int) []byte {
	return appendPartition(make([]byte, 0, len(db)+keyRoom), db, id)
}

const keyRoom = 64

func appendPartition(dst []byte, db string, id int) []byte {
	dst = AppendPart(dst, S(db))
	return binary.BigEndian.AppendUint32(dst, uint32(id))
}

// Data returns the key of a document row: P|d|table|key parts, sized for
// its parts (a long key too is built in one allocation).
func Data(db string, id int, table string, key []Part) []byte {
	n := len(db) + len(table) + 16
	for _, p := range key {
		n += len(p.Str) + 10
	}
	b := append(appendPartition(make([]byte, 0, n), db, id), SectionData)
	b = AppendPart(b, S(table))
	return AppendParts(b, key)
}

// DataTablePrefix returns the prefix of all rows of one table in a partition.
func DataTablePrefix(db string, id int, table string) []byte {
	b := append(Partition(db, id), SectionData)
	return AppendPart(b, S(table))
}

// Log returns the commit-log key of an SCN of partition id of db, written
// in epoch.
func Log(epoch uint32, db string, id int, gen uint32, seq uint64) []byte {
	b := binary.BigEndian.AppendUint32(LogPrefix(epoch, db, id), gen)
	return binary.BigEndian.AppendUint64(b, seq)
}

// LogPrefix returns the prefix of a partition's log entries of one epoch:
// they follow it in SCN order. Its length does not depend on the epoch.
func LogPrefix(epoch uint32, db string, id int) []byte {
	b := make([]byte, 0, 5+len(db)+keyRoom)
	b = binary.BigEndian.AppendUint32(append(b, LogSpace), epoch)
	return appendPartition(b, db, id)
}

// LegacyLogPrefix returns the prefix of a partition's commit log as stored
// before the log space (SectionLog).
func LegacyLogPrefix(db string, id int) []byte {
	return append(Partition(db, id), SectionLog)
}

// ParseLog returns the SCN of a commit-log key produced by Log, whose
// prefix (LogPrefix, LegacyLogPrefix) is prefixLen bytes.
func ParseLog(k []byte, prefixLen int) (gen uint32, seq uint64, err error) {
	if len(k) != prefixLen+12 {
		return 0, 0, fmt.Errorf("log key of length %d: %w", len(k), ErrCorrupt)
	}
	return binary.BigEndian.Uint32(k[prefixLen:]), binary.BigEndian.Uint64(k[prefixLen+4:]), nil
}

// ParseLogEpoch returns the epoch of a key in the log space.
func ParseLogEpoch(k []byte) (uint32, error) {
	if len(k) < 5 || k[0] != LogSpace {
		return 0, fmt.Errorf("log key %x: %w", k, ErrCorrupt)
	}
	return binary.BigEndian.Uint32(k[1:]), nil
}

// Meta returns the key of a named piece of partition metadata.
func Meta(db string, id int, name string, rest ...Part) []byte {
	b := append(Partition(db, id), SectionMeta)
	b = AppendPart(b, S(name))
	return AppendParts(b, rest)
}

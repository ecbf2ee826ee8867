package keys

import (
	"encoding/binary"
	"fmt"
)

// Sections of a partition's key range. Every key of a storage node starts
// with Partition(db, id), so one partition is one contiguous range that can be
// scanned, checkpointed, or deleted on its own.
const (
	SectionData byte = 'd' // P|d|table|key… → document row
	SectionLog  byte = 'l' // P|l|generation|sequence → one commit's events
	SectionIdx  byte = 'i' // P|i|kind|table|… → index postings, ordinals, statistics (storage/index.go)
	SectionMeta byte = 'm' // P|m|name… → partition metadata
)

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

// Log returns the commit-log key of an SCN.
func Log(db string, id int, gen uint32, seq uint64) []byte {
	b := append(Partition(db, id), SectionLog)
	b = binary.BigEndian.AppendUint32(b, gen)
	return binary.BigEndian.AppendUint64(b, seq)
}

// LogPrefix returns the prefix of a partition's commit log.
func LogPrefix(db string, id int) []byte {
	return append(Partition(db, id), SectionLog)
}

// ParseLog returns the SCN of a commit-log key produced by Log.
func ParseLog(k []byte, prefixLen int) (gen uint32, seq uint64, err error) {
	if len(k) != prefixLen+12 {
		return 0, 0, fmt.Errorf("log key of length %d: %w", len(k), ErrCorrupt)
	}
	return binary.BigEndian.Uint32(k[prefixLen:]), binary.BigEndian.Uint64(k[prefixLen+4:]), nil
}

// Meta returns the key of a named piece of partition metadata.
func Meta(db string, id int, name string, rest ...Part) []byte {
	b := append(Partition(db, id), SectionMeta)
	b = AppendPart(b, S(name))
	return AppendParts(b, rest)
}

// Package storage owns a storage node's Pebble instance: the partitioned
// keyspace (every key but the commit log's and the engine's records of
// its layout, FormatVersion, and of its cluster, starts with the
// partition, see package keys; the log is in the log space, logspace.go),
// document
// rows with their header, the per-partition commit log and its retention
// (with the timeline's generation history, which outlives trimmed
// commits), SCN assignment, partition snapshots and their install, and the
// keys of local secondary indexes (postings, document ordinals, text
// statistics), whose entries an Indexer derives from documents, and the
// row cache of documents read by key in front of Pebble (rowcache.go).
//
// Invariants:
//   - One commit of a partition is one Pebble batch that holds the document
//     rows, their index entries, the commit-log entry and the partition's
//     new SCN, fsynced before Update returns; a crash leaves all of it or
//     none of it. A slave applies a commit the same way, deriving the index
//     entries itself from the commit's images.
//   - A commit is at most MaxCommitBytes of documents, pre-images and
//     keys: what every replica applies whole and a log answer carries in
//     one message. A transaction that would grow past it fails before
//     anything is written.
//   - Commits of one partition are serialized (the partition's lock is
//     held while the SCN is assigned and the batch applied, and released
//     for the fsync, which concurrent commits share) and take consecutive
//     sequence numbers; all events of a commit share its SCN. Only durable
//     commits are shipped, reported as the partition's SCN, or read from
//     the log.
//   - The log's newest entries are also held in memory, exactly as
//     stored (logtail.go); a commit, an apply, a truncation, a trim or a
//     rebuild changes that copy with the log, and a copy that does not
//     end at the partition's SCN is not read.
//   - A document row is never read without checking its CRC (the row
//     cache holds rows checked when read from Pebble, and rows as a
//     commit or an apply wrote them).
//   - The row cache never answers with a row Pebble no longer holds: a
//     batch that writes rows empties their entries before it is applied,
//     a read puts what it read only if no such batch began meanwhile, and
//     a truncation or an install makes every entry of the partition stale
//     (rowcache.go).
//   - A truncation never removes a commit at or below the partition's
//     acknowledged watermark (ErrTruncateAcknowledged), nor does a trim
//     remove one above it. The stored watermark may lag the one in
//     memory (storeAcked), never lead it.
//   - A partition's log entries are in SCN order across the epochs of
//     the log space: a commit goes to the engine's epoch or to the
//     partition's last, whichever is later, and the batch of the first
//     commit in an epoch records it (logspace.go).
//   - A commit's SCN is stored only in its log entry's key: a partition
//     opens at the later of its log's last entry and the SCN stored by
//     what may leave the log behind it (a truncation, a trim, an install).
//   - Once Pebble meets a write error it cannot go on from (or the disk
//     probe fails), the engine fails: every later write is ErrFailed.
//   - Scans step past a key's older values at once (NextPrefix), and a
//     read that still stepped over many values it did not return asks for
//     a memtable flush, at most one every Options.ReadFlushInterval
//     (engine.go): a key rewritten many times costs reads until then only.
package storage

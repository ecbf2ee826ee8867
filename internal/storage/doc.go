// Package storage owns a storage node's Pebble instance: the partitioned
// keyspace (every key starts with the partition, see package keys), document
// rows with their header, the per-partition commit log and its retention
// (with the timeline's generation history, which outlives trimmed
// commits), SCN assignment, and partition snapshots and their install.
//
// Invariants:
//   - One commit of a partition is one Pebble batch that holds the document
//     rows, the commit-log entry and the partition's new SCN, fsynced
//     before Update returns; a crash leaves all of it or none of it.
//   - Commits of one partition are serialized (the partition's lock is
//     held through the fsync) and take consecutive sequence numbers; all
//     events of a commit share its SCN. Commits of different partitions
//     share fsyncs in Pebble's commit pipeline.
//   - A document row is never read without checking its CRC.
//   - A truncation never removes a commit at or below the partition's
//     acknowledged watermark (ErrTruncateAcknowledged), nor does a trim
//     remove one above it.
//   - Once Pebble meets a write error it cannot go on from (or the disk
//     probe fails), the engine fails: every later write is ErrFailed.
package storage

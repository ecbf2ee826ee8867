// Package backup owns Cortado's backup format and both ends of it: Dump
// writes a database — its definition, every table's schema versions, and
// each partition's documents and auto-increment marks as of one SCN of
// that partition — as NDJSON lines; Read turns such lines (the body of a
// restore request) into a Plan of per-partition write requests, checking
// every line against the registry first, so that a restore body with one
// bad line writes nothing.
//
// Documents travel as written: the Avro bytes and the schema version of
// the stored row, never converted, so a restored database reads back what
// the backed-up one did. A partition's section is a snapshot consistent
// at its SCN (the one a change stream's snapshot is); the backup's last
// line holds a change-stream token positioned at every partition's SCN, so
// a consumer (or a later restore's catch-up) follows on from exactly what
// the backup holds.
//
// It never writes to storage and never reaches a node but through the
// Snapshotters it is given; the caller sends a Plan's write requests.
package backup

// Package node is the storage node: it executes document operations on the
// partitions it hosts — reads through resolution plans (up-conversion and
// projection), writes with HTTP preconditions evaluated atomically with the
// write, partial updates, auto-increment inserts, collection deletes and
// document-group transactions, each as one storage commit. It also serves
// its partitions' logs to slaves, relays and change streams, streams
// partition snapshots, rebuilds a replica from its master's snapshot when
// its position is behind the retained log, trims its logs by their
// databases' retention, and deletes an OFFLINE copy of a partition when
// told its replicas hold all of it (never a copy with another role, nor
// one that refused to undo acknowledged commits). It bounds the bytes of
// documents its writes handle at once (gate.go), as a count of requests
// does not bound what they cost.
// A slave answers a read that accepts staleness only when it knows, from
// its master's answers to its acknowledgements and on its own clock, that
// it held all its master had within that long; it never takes a source's
// word for it.
//
// The router reaches a node only through the Service interface, whose
// requests and results are plain data so that the call can cross a network;
// Remote is that interface over the internal protocol, and guards its
// caller against a node that stops answering (stall.go). A node never
// routes: it serves exactly the partition a request names, and refuses a
// write of a key that partition does not hold. It takes nothing else on
// trust from the wire either: documents are checked against their
// schema, and what callers can make it keep (acknowledgements from
// replicas that are not its slaves, log streams and long polls, a
// stream whose reader stopped reading, a snapshot whose reader reads too
// slowly, the bytes of log streams' answers waiting for their readers)
// is bounded.
package node

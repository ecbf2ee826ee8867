// Package changes owns the change stream: it turns partitions' commit logs
// (read from a relay, or a storage node) and, when a consumer is behind
// the retained log, partition snapshots into events in a
// Debezium-compatible envelope, with per-partition resume tokens,
// resolved (heartbeat) events, rollback events for positions a failover
// took off the timeline, and transaction boundaries.
//
// It sends only commits acknowledged to their writers: it asks its
// sources for those alone (node.LogRequest.AckedOnly), so no failover
// undoes a change it sent. A source of an earlier release sends every
// commit, and a failover may then bring a rollback.
//
// Per partition, events keep the commit order; the events of one
// transaction are contiguous and share its SCN. A token names, per
// partition, the last SCN delivered and how many events of the next
// commit were, so a resumed stream repeats nothing and skips nothing.
//
// It never writes: it reads logs and snapshots through the Sources it is
// given. What a stream holds is bounded (Feed.StreamBytes): its events on
// their way to the consumer, and the room its partitions' readers reserve
// for the log answers they read next, which they ask for in shares of
// that bound (an answer holds at least one commit). A reader reads an
// answer only with room reserved for it, or under one of the feed's
// backlog slots (its first answer), and never waits for room holding
// one: it lets the answer go and asks again from where it was (a
// snapshot's reader, which cannot start again midway, waits holding one
// chunk and its stream's catch-up slot, not the feed's). Of a
// stream's partitions, only a few read a backlog at once
// (catchUpReaders); the others either are current or wait their turn. A
// consumer that does not read holds its stream's events, no log answer
// and no log stream.
package changes

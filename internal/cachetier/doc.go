// Package cachetier is the distributed cache tier (DESIGN §8): whole
// documents in Redis, keyed by database, partition, table and key, each
// stored with the SCN that wrote it, for routers to answer reads that
// accept staleness (Cache-Control: max-stale) without a storage node.
//
// It owns three parts:
//
//   - Tier, a router's reader: one Redis round trip (a script) returns
//     an entry and how stale its partition's entries may be, measured on
//     Redis's own clock; a health monitor stops asking a Redis that
//     fails or is slow, answering every read as a miss at once, and
//     probes it until it answers again.
//   - Updater, which follows each partition's commit log (from a relay,
//     or the master) and writes what each commit left, last writer wins
//     by SCN (a compare in a server-side script), deletes as tombstones,
//     every entry with a finite TTL. It writes only commits its source
//     says were acknowledged to their writers, so a read never sees a
//     commit a failover could discard. After each batch it asks the
//     partition's master for its newest commit, and once it has written
//     everything up to that commit it records the Redis time taken
//     before it asked: every commit acknowledged before that time is in
//     Redis. A read's staleness is Redis's time now less that one.
//   - a bootstrapper inside the Updater that walks each partition's
//     snapshot more often than the TTL, refreshing what is current and
//     filling what the cache lost.
//
// It never answers a read older than the read accepts, never writes an
// entry that an older commit could make newer than what the store holds
// (each partition has an epoch; an updater that lost its place, or
// finds Redis lost its writes, starts a new epoch and the old entries
// count for nothing), and never makes a request wait on an unhealthy
// Redis. Every goroutine it starts is stopped and waited for by Close or
// by Run's return.
package cachetier

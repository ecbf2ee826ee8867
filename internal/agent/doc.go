// Package agent carries out the routing tables on a storage node: for
// each partition the table gives this node, it takes up the role — master
// in the table's generation (after draining the old master or the relay),
// slave following the master through the relay or directly, or offline —
// a bounded number at a time, tables in order. A take-over's drain runs in
// the background, ended by a table that changes it: tables that come
// meanwhile are carried out at once. A copy it keeps of a
// partition it is no replica of shows in the node's status until a table
// names the node in the partition's Drop list, and is then deleted. When
// the node's membership lease is lost it fences every partition before
// anything else.
//
// It never decides a role: the controller does. It never takes over a
// partition before the drain the table asks for has completed.
package agent

// DefaultMaxTransitions bounds the partitions changing role at once on a
// storage node unless Agent.MaxTransitions says otherwise.
const DefaultMaxTransitions = 16

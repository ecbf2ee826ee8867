// Package topo owns the cluster's topology in etcd, the one shared
// record every role reads through this package: the key layout, the
// cluster's identity (ClusterID), storage nodes' registrations under
// leases (Member), the relays' and routers' leased registrations, every
// relay's, router's and controller's process record (Process: its build,
// for operators), and the routing tables (which replica of each partition is master, in which
// generation).
//
// It never decides anything: the controller writes routing tables, the
// agents and routers follow them; the identity is made once, by whichever
// process asks first.
package topo

// DefaultLeaseTTL is how many seconds a storage node or the leading
// controller may be silent before it is taken for dead.
const DefaultLeaseTTL = 5

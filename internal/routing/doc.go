// Package routing is the routers' view of the cluster: it keeps every
// database's routing table by watching etcd and sends each partition's
// work to its master (or, for reads that allow staleness, its slaves; or,
// when the master it knows has become a slave of a newer master, to the
// one that slave names; a request refused during a planned hand-over is
// asked again until the new master has taken over, for up to
// HandOverWait), ends the calls waiting on a node that a new
// table no longer lists (it left the cluster), and reports storage nodes
// the router keeps failing to reach, so the controller can treat a node
// clients cannot use as failed. For change
// streams it names where each partition's log is read (a relay, else the
// master) and who streams its snapshot (the master).
//
// It never changes a routing table; only the controller does.
package routing

// Package cluster owns the cluster manager's decisions and the roles that
// carry them out: where each partition's replicas live (IdealState) and
// which replica is master (decideMaster) are pure functions, tested
// without a cluster; around them, the controller reads etcd and the
// replicas' statuses and publishes routing tables, each storage node's
// agent carries them out, members keep their leases, and routers watch the
// tables.
//
// It never makes a replica master that may lack an acknowledged write:
// a hand-back goes only to a caught-up replica that drains the old master,
// and a failover only proceeds when enough replicas answered to include
// one of every minInSync set.
package cluster

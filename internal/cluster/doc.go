// Package cluster owns the cluster manager's decisions: where each
// partition's replicas live and which replica is master (the ideal state).
// Placement is a pure function of the live nodes, their racks, the
// partition count, the replica count and the current assignment, so it can
// be property-tested without a cluster; the controller that reads etcd,
// issues transitions and publishes the routing table is thin around it.
//
// It never talks to etcd, storage or the network.
package cluster

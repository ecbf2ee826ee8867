// Package placement holds the cluster manager's pure decisions: where
// each partition's replicas live (IdealState: spread evenly, no two on one
// node or rack, fewest moves), which replica masters it next
// (DecideMaster), and which replicas leaving the set stay until the new
// ones have caught up and which copies left on nodes that are no longer
// its replicas may be deleted (DecideCopies). They take what the controller read
// and return what it should publish, and are tested without a cluster
// (datadriven cases in testdata/, tables in Go).
//
// It never talks to etcd or to a node, never chooses a master that may
// lack an acknowledged commit, and never lets a copy go that holds a
// commit some wanted replica lacks.
package placement

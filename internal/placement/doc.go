// Package placement holds the cluster manager's pure decisions: where
// each partition's replicas live (IdealState: spread evenly, no two on one
// node or rack, fewest moves) and which replica masters it next
// (DecideMaster). They take what the controller read and return what it
// should publish, and are tested without a cluster (datadriven cases in
// testdata/).
//
// It never talks to etcd or to a node, and never chooses a master that
// may lack an acknowledged commit.
package placement

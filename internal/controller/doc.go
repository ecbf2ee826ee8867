// Package controller is the cluster manager (Helix's role in the Espresso
// design): one controller is elected on etcd, watches the storage nodes
// and the routers' reports, computes each database's ideal state and
// masters (package placement), and publishes routing tables — every
// transition of a database in one etcd transaction fenced on still
// leading. It also settles a raise of a database's minInSync once the
// writes of before it are held by as many replicas (settleRaise), and
// answers the operator's questions: cluster status and the consistency
// check of replicas against their masters.
//
// It never makes a replica master that may lack an acknowledged write
// (placement.DecideMaster, counting by the least minInSync any write may
// have been acknowledged by), and never writes a routing table once it
// has lost the election.
package controller

import "time"

// DefaultCheckInterval is how often the leading controller runs the
// consistency check unless told otherwise.
const DefaultCheckInterval = 10 * time.Minute

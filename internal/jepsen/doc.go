// Package jepsen is a Jepsen-style test of Cortado as a source of truth:
// it runs a real multi-process cluster on loopback (etcd, a relay, three
// storage nodes, two controllers, two routers), drives a workload through
// both routers while a nemesis kills -9, pauses and restarts processes,
// cuts a master off the network (toxiproxy), and fills or stalls a storage
// node's disk, and then checks what clients were told against what the cluster
// holds: no acknowledged write lost, no increment lost or applied twice,
// no read going back in time, no 404 for an acknowledged key, single-key
// registers linearizable (porcupine), every replica on the same
// timeline, a change-stream consumer ending with every acknowledged
// write and nothing the database does not hold, and backups taken during
// the run holding every write acknowledged before they began (one of
// them restored, under the faults, into a copy that holds what it does).
//
// It is a test harness: nothing in the product imports it. The short run
// (fixed seeds) is part of ./scripts/test; scripts/jepsen runs a long
// randomized one and writes its result table to docs/jepsen.md.
package jepsen

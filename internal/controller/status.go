package controller

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/storage"
	"github.com/cortado-db/cortado/internal/topo"
)

// Status is the cluster as `cortado cluster status` and GET /_cluster show
// it: the leading controller, the nodes, and every partition's replicas
// with their roles, SCNs and replication lag.
type Status struct {
	// Single says the process is one storage node that masters every
	// partition itself (`serve` without --nodes): there are no other
	// nodes, replicas or controller to show.
	Single     bool             `json:"single,omitempty"`
	Controller string           `json:"controller"` // the leader's ID, "" if none
	Nodes      []NodeStatus     `json:"nodes"`
	Databases  []DatabaseStatus `json:"databases"`
	// Processes are the registered relays, routers and controllers, by
	// role and ID, with their builds (topo.Processes); processes of
	// releases up to 99f8c6e register none.
	Processes []topo.Process `json:"processes"`
}

// NodeStatus is one storage node.
type NodeStatus struct {
	ID   string `json:"id"`
	URL  string `json:"url"`
	Rack string `json:"rack,omitempty"`
	// Live: the node holds its membership lease.
	Live bool `json:"live"`
	// Build and Protocol are what the node registered (topo.NodeInfo):
	// its binary's commit and newest protocol version; absent for nodes
	// of releases before 2026-12-01 and nodes not live.
	Build    string `json:"build,omitempty"`
	Protocol uint32 `json:"protocol,omitempty"`
	Masters  int    `json:"masters"`
	Slaves   int    `json:"slaves"`
	Error    string `json:"error,omitempty"` // why it could not be asked
}

// DatabaseStatus is one database's routing table and replicas.
type DatabaseStatus struct {
	Name    string `json:"name"`
	Version int64  `json:"routingVersion"`
	// Replicas, MinInSync and FailoverInSync are the database's
	// definition's (schema.Database), filled in by an asker that holds
	// the registry (a router or serve): FailoverInSync, set while a raise
	// of minInSync is under way, is what failovers still count by.
	Replicas       int               `json:"replicas,omitempty"`
	MinInSync      int               `json:"minInSync,omitempty"`
	FailoverInSync int               `json:"failoverInSync,omitempty"`
	Partitions     []PartitionStatus `json:"partitions"`
}

// PartitionStatus is one partition: the generation its master writes in,
// and each replica as its node reports it.
type PartitionStatus struct {
	Partition  int             `json:"partition"`
	Generation uint32          `json:"generation"`
	Replicas   []ReplicaStatus `json:"replicas"` // the routing table's order: master first
	// Copies are the partition's copies kept by nodes that are no
	// replica of it (its replicas moved), OFFLINE: each is deleted once
	// every replica holds all of it (placement.DecideCopies).
	Copies []ReplicaStatus `json:"copies,omitempty"`
}

// ReplicaStatus is one replica. Lag is how many commits it is behind its
// master, when both are in the same generation (nil otherwise, or when
// either did not answer).
type ReplicaStatus struct {
	Node string      `json:"node"`
	Role string      `json:"role"` // as the node reports it; UNKNOWN if it did not answer
	SCN  storage.SCN `json:"scn"`
	Lag  *uint64     `json:"lag,omitempty"`
	// LogStart is the SCN the replica's retained commit log starts
	// after; LogBytes about what the log takes.
	LogStart storage.SCN `json:"logStart"`
	LogBytes int64       `json:"logBytes"`
	// IndexBuilding is, per table, how many documents the latest
	// version's indexes still lack on this replica (an index build).
	IndexBuilding map[string]uint64 `json:"indexBuilding,omitempty"`
}

// ClusterStatus gathers the cluster's status from etcd and from each node.
func ClusterStatus(ctx context.Context, cli *clientv3.Client, prefix string) (*Status, error) {
	st := &Status{Nodes: []NodeStatus{}, Databases: []DatabaseStatus{}}
	if resp, err := cli.Get(ctx, topo.ElectionPrefix(prefix)+"/", append(clientv3.WithFirstCreate(), clientv3.WithPrefix())...); err != nil {
		return nil, err
	} else if len(resp.Kvs) > 0 {
		st.Controller = string(resp.Kvs[0].Value)
	}
	live, err := topo.LiveNodes(ctx, cli, prefix)
	if err != nil {
		return nil, err
	}
	if st.Processes, err = topo.Processes(ctx, cli, prefix); err != nil {
		return nil, err
	}
	tables, err := topo.RoutingTables(ctx, cli, prefix)
	if err != nil {
		return nil, err
	}
	nodes := map[string]*NodeStatus{}
	for _, n := range live {
		nodes[n.ID] = &NodeStatus{ID: n.ID, URL: n.URL, Rack: n.Rack, Live: true, Build: n.Build, Protocol: n.Protocol}
	}
	for _, t := range tables {
		for id, url := range t.Nodes {
			if nodes[id] == nil {
				nodes[id] = &NodeStatus{ID: id, URL: url}
			}
		}
	}
	reports := askNodes(ctx, nodes)
	for _, t := range tables {
		ds := DatabaseStatus{Name: t.DB, Version: t.Version}
		for p, route := range t.Partitions {
			ps := PartitionStatus{Partition: p, Generation: route.Generation}
			var master *node.PartitionStatus
			for i, id := range route.Replicas {
				rs := ReplicaStatus{Node: id, Role: "UNKNOWN"}
				if r, ok := reports[id][partKey{t.DB, p}]; ok {
					rs.Role, rs.SCN, rs.LogStart, rs.LogBytes, rs.IndexBuilding = r.Role.String(), r.SCN, r.LogStart, r.LogBytes, r.IndexBuilding
					if i == 0 {
						master = &r
					} else if master != nil && master.SCN.Gen == r.SCN.Gen && r.SCN.Seq <= master.SCN.Seq {
						lag := master.SCN.Seq - r.SCN.Seq
						rs.Lag = &lag
					}
					switch r.Role {
					case node.Master:
						nodes[id].Masters++
					case node.Slave:
						nodes[id].Slaves++
					}
				}
				ps.Replicas = append(ps.Replicas, rs)
			}
			for _, id := range slices.Sorted(maps.Keys(reports)) {
				if r, ok := reports[id][partKey{t.DB, p}]; ok && !slices.Contains(route.Replicas, id) {
					ps.Copies = append(ps.Copies, ReplicaStatus{Node: id, Role: r.Role.String(), SCN: r.SCN, LogStart: r.LogStart, LogBytes: r.LogBytes})
				}
			}
			ds.Partitions = append(ds.Partitions, ps)
		}
		st.Databases = append(st.Databases, ds)
	}
	for _, id := range slices.Sorted(maps.Keys(nodes)) {
		st.Nodes = append(st.Nodes, *nodes[id])
	}
	return st, nil
}

// partKey names one partition of one database.
type partKey struct {
	db string
	id int
}

// admin holds the connections for status and checksum calls to nodes,
// one per node, shared by this process's controller, checks and status.
var admin node.Remotes

// askNodes asks every node, in parallel, for its partitions; a node that
// does not answer within two seconds gets its Error set.
func askNodes(ctx context.Context, nodes map[string]*NodeStatus) map[string]map[partKey]node.PartitionStatus {
	out := map[string]map[partKey]node.PartitionStatus{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for id, n := range nodes {
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			st, err := admin.Get(n.URL).Status(rctx, node.StatusRequest{})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				n.Error = err.Error()
				return
			}
			m := map[partKey]node.PartitionStatus{}
			for _, s := range st {
				m[partKey{s.DB, s.Partition}] = s
			}
			out[id] = m
		})
	}
	wg.Wait()
	return out
}

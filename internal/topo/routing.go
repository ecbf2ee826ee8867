package topo

import (
	"context"
	"encoding/json"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// NodeInfo is what a storage node publishes about itself under its lease.
type NodeInfo struct {
	ID   string `json:"id"`
	URL  string `json:"url"` // its internal API
	Rack string `json:"rack,omitempty"`
	// Incarnation is the node's current lease: it changes when the node
	// restarts or rejoins after losing its lease, and a master that comes
	// back as a new incarnation gets a new generation.
	Incarnation int64 `json:"incarnation"`
	// Draining says the node is stopping cleanly: the controller hands
	// its masterships to other replicas (planned, nothing lost) before
	// it leaves.
	Draining bool `json:"draining,omitempty"`
	// Build is the commit the node's binary was built from
	// (release.Info.Revision) and Protocol the newest internal protocol
	// version it speaks: what an operator reads in /_cluster during a
	// rolling upgrade. Nodes of releases before 2026-12-01 leave them
	// out.
	Build    string `json:"build,omitempty"`
	Protocol uint32 `json:"protocol,omitempty"`
}

// PartitionRoute is one partition's replicas (the first is master) and the
// generation its master writes in.
type PartitionRoute struct {
	Replicas   []string `json:"replicas"`
	Generation uint32   `json:"generation"`
	// From, in a planned hand-over, is the live master this generation's
	// master takes over from: the new master must drain it completely
	// before it writes. Empty after a failover (the master was chosen
	// because it holds every acknowledged commit already).
	From string `json:"from,omitempty"`
	// Incarnation is the lease of the master this generation was granted
	// to: only that run of the node may take it. A master that restarts
	// or rejoins under a new lease gets a new generation (or another
	// replica does), never this one.
	Incarnation int64 `json:"incarnation,omitempty"`
	// Drop names nodes that are no replica of the partition and hold a
	// copy of it every replica holds all of (placement.DecideCopies): they
	// delete their copies. A node of a version without it keeps its copy.
	Drop []string `json:"drop,omitempty"`
	// At is how far the controller saw this generation's master when it
	// chose it (its reported SCN; zero when it saw none, and from a
	// controller of a version without it). The master takes over only if
	// it still holds that much: a replica emptied since it answered (a
	// rebuild begun, a copy dropped) holds less, and a master that holds
	// less than what it was chosen for would hand its slaves a timeline
	// without acknowledged commits.
	At Position `json:"at,omitzero"`
}

// Position is an SCN (storage.SCN, which this package does not import):
// a generation and a sequence within it.
type Position struct {
	Gen uint32 `json:"gen"`
	Seq uint64 `json:"seq"`
}

// MasterIncarnation returns the incarnation a partition's mastership was
// granted to: the route's own, or, in a table from before routes named it,
// the master's incarnation when the table was computed.
func (t *RoutingTable) MasterIncarnation(part int) int64 {
	id, _ := t.Master(part)
	if id == "" {
		return 0
	}
	if inc := t.Partitions[part].Incarnation; inc != 0 {
		return inc
	}
	return t.Incarnations[id]
}

// RoutingTable is the controller's published external view of one
// database: where each partition lives, and how to reach each node.
type RoutingTable struct {
	DB         string            `json:"db"`
	Version    int64             `json:"version"`
	Partitions []PartitionRoute  `json:"partitions"`
	Nodes      map[string]string `json:"nodes"` // id → internal API URL
	// Incarnations are the nodes' leases when the table was computed.
	Incarnations map[string]int64 `json:"incarnations,omitempty"`
	// MinInSync is the database's minInSync when the table was
	// computed: its masters count acknowledgements by it at least,
	// whatever their registry holds yet (0 from controllers of protocol
	// 7 and older).
	MinInSync int `json:"minInSync,omitempty"`
}

// Master returns the URL of a partition's master, or "".
func (t *RoutingTable) Master(part int) (id, url string) {
	if t == nil || part < 0 || part >= len(t.Partitions) || len(t.Partitions[part].Replicas) == 0 {
		return "", ""
	}
	id = t.Partitions[part].Replicas[0]
	return id, t.Nodes[id]
}

// Masters counts the partitions the table gives each node to master
// (none for a nil table).
func (t *RoutingTable) Masters() map[string]int {
	count := map[string]int{}
	if t == nil {
		return count
	}
	for _, r := range t.Partitions {
		if len(r.Replicas) > 0 {
			count[r.Replicas[0]]++
		}
	}
	return count
}

// Keys of the cluster state in etcd, under a prefix such as /cortado.
func NodesPrefix(prefix string) string        { return prefix + "/nodes/" }
func RoutingPrefix(prefix string) string      { return prefix + "/routing/" }
func RoutingKey(prefix, db string) string     { return RoutingPrefix(prefix) + db }
func ElectionPrefix(prefix string) string     { return prefix + "/controller" }
func RoutersPrefix(prefix string) string      { return prefix + "/routers/" }
func ReportsPrefix(prefix string) string      { return prefix + "/reports/" }
func RelaysPrefix(prefix string) string       { return prefix + "/relays/" }
func NodeKey(prefix string, id string) string { return NodesPrefix(prefix) + id }
func ClusterIDKey(prefix string) string       { return prefix + "/cluster-id" }
func DBFromRoutingKey(prefix, key string) string {
	return strings.TrimPrefix(key, RoutingPrefix(prefix))
}

// LiveNodes lists the registered nodes.
func LiveNodes(ctx context.Context, cli *clientv3.Client, prefix string) ([]NodeInfo, error) {
	resp, err := cli.Get(ctx, NodesPrefix(prefix), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	var out []NodeInfo
	for _, kv := range resp.Kvs {
		var n NodeInfo
		if err := json.Unmarshal(kv.Value, &n); err == nil {
			out = append(out, n)
		}
	}
	return out, nil
}

// LoadRoutingTable reads a database's routing table (nil if none yet).
func LoadRoutingTable(ctx context.Context, cli *clientv3.Client, prefix, db string) (*RoutingTable, error) {
	resp, err := cli.Get(ctx, RoutingKey(prefix, db))
	if err != nil || len(resp.Kvs) == 0 {
		return nil, err
	}
	var t RoutingTable
	return &t, json.Unmarshal(resp.Kvs[0].Value, &t)
}

// RoutingTables reads every database's routing table, by name.
func RoutingTables(ctx context.Context, cli *clientv3.Client, prefix string) ([]*RoutingTable, error) {
	resp, err := cli.Get(ctx, RoutingPrefix(prefix), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	var out []*RoutingTable
	for _, kv := range resp.Kvs {
		var t RoutingTable
		if err := json.Unmarshal(kv.Value, &t); err == nil {
			out = append(out, &t)
		}
	}
	slices.SortFunc(out, func(a, b *RoutingTable) int { return strings.Compare(a.DB, b.DB) })
	return out, nil
}

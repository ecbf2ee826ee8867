package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// NodeInfo is what a storage node publishes about itself under its lease.
type NodeInfo struct {
	ID   string `json:"id"`
	URL  string `json:"url"` // its internal API
	Rack string `json:"rack,omitempty"`
}

// PartitionRoute is one partition's replicas (the first is master) and the
// generation its master writes in.
type PartitionRoute struct {
	Replicas   []string `json:"replicas"`
	Generation uint32   `json:"generation"`
}

// RoutingTable is the controller's published external view of one
// database: where each partition lives, and how to reach each node.
type RoutingTable struct {
	DB         string            `json:"db"`
	Version    int64             `json:"version"`
	Partitions []PartitionRoute  `json:"partitions"`
	Nodes      map[string]string `json:"nodes"` // id → internal API URL
}

// Master returns the URL of a partition's master, or "".
func (t *RoutingTable) Master(part int) (id, url string) {
	if t == nil || part < 0 || part >= len(t.Partitions) || len(t.Partitions[part].Replicas) == 0 {
		return "", ""
	}
	id = t.Partitions[part].Replicas[0]
	return id, t.Nodes[id]
}

// Keys of the cluster state in etcd, under a prefix such as /cortado.
func nodesPrefix(prefix string) string        { return prefix + "/nodes/" }
func routingPrefix(prefix string) string      { return prefix + "/routing/" }
func routingKey(prefix, db string) string     { return routingPrefix(prefix) + db }
func electionPrefix(prefix string) string     { return prefix + "/controller" }
func nodeKey(prefix string, id string) string { return nodesPrefix(prefix) + id }
func dbFromRoutingKey(prefix, key string) string {
	return strings.TrimPrefix(key, routingPrefix(prefix))
}

// Member is a storage node's registration: its NodeInfo under an etcd
// lease. When the process dies or is cut off, the lease lapses after its
// TTL and the controller sees the node gone.
type Member struct {
	session *concurrency.Session
}

// Join registers a node with a lease of ttlSeconds.
func Join(ctx context.Context, cli *clientv3.Client, prefix string, info NodeInfo, ttlSeconds int) (*Member, error) {
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(ttlSeconds), concurrency.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("node %s: lease: %w", info.ID, err)
	}
	val, _ := json.Marshal(info)
	if _, err := cli.Put(ctx, nodeKey(prefix, info.ID), string(val), clientv3.WithLease(s.Lease())); err != nil {
		s.Close()
		return nil, fmt.Errorf("node %s: register: %w", info.ID, err)
	}
	return &Member{session: s}, nil
}

// Lost is closed when the lease has lapsed or was revoked: the node is no
// longer a member and must fence itself.
func (m *Member) Lost() <-chan struct{} { return m.session.Done() }

// Leave revokes the lease: the node is gone at once.
func (m *Member) Leave() error { return m.session.Close() }

// Abandon stops renewing the lease without revoking it, as a crashed
// process would: the node disappears when the TTL lapses.
func (m *Member) Abandon() { m.session.Orphan() }

// LiveNodes lists the registered nodes.
func LiveNodes(ctx context.Context, cli *clientv3.Client, prefix string) ([]NodeInfo, error) {
	resp, err := cli.Get(ctx, nodesPrefix(prefix), clientv3.WithPrefix())
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
	resp, err := cli.Get(ctx, routingKey(prefix, db))
	if err != nil || len(resp.Kvs) == 0 {
		return nil, err
	}
	var t RoutingTable
	return &t, json.Unmarshal(resp.Kvs[0].Value, &t)
}

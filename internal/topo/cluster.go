package topo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ClusterID returns the cluster's identity: 32 hex digits made by the
// first process that asks and kept in etcd (ClusterIDKey), so that a
// restore of etcd keeps it. A storage node records it in its data
// directory and refuses a directory recorded for another cluster
// (storage.ErrOtherCluster): a volume of another cluster mounted by
// mistake would otherwise pass for replicas of this one's partitions —
// same database names, generations and SCNs from 1 — holding other
// documents.
func ClusterID(ctx context.Context, cli *clientv3.Client, prefix string) (string, error) {
	key := ClusterIDKey(prefix)
	b := make([]byte, 16)
	rand.Read(b)
	made := hex.EncodeToString(b)
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, made)).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return "", fmt.Errorf("the cluster's identity: %w", err)
	}
	if resp.Succeeded {
		return made, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) != 1 || len(kvs[0].Value) == 0 {
		return "", fmt.Errorf("the cluster's identity: %s holds %d values", key, len(kvs))
	}
	return string(kvs[0].Value), nil
}

package topo

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/coord/coordtest"
)

// TestLeaveEndsTheLeaseAtOnce: from Leave on, the member reports its lease
// lost (a write begun under it must not be acknowledged once the
// controller may have moved on) and its registration is gone.
func TestLeaveEndsTheLeaseAtOnce(t *testing.T) {
	cli := coordtest.Start(t)
	m, err := Join(context.Background(), cli, "/t", NodeInfo{ID: "s1", URL: "http://s1"}, 30, nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, valid := m.Held()
	if !valid {
		t.Fatal("a member that just joined does not hold its lease")
	}
	if err := m.Leave(); err != nil {
		t.Fatal(err)
	}
	if _, valid := m.Held(); valid {
		t.Fatalf("after Leave the member still reports lease %x held (its TTL is 30 s)", lease)
	}
	resp, err := cli.Get(context.Background(), "/t", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if kv.Lease == lease {
			t.Fatalf("after Leave %s is still registered under lease %x", kv.Key, lease)
		}
	}
}

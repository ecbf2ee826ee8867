package topo

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/coord/coordtest"
)

// TestLeasedRegistrationSurvivesLeaseLoss: a relay's (or router's)
// registration whose lease is lost — revoked here, as an etcd outage
// longer than the TTL would expire it — is put back under a new lease.
func TestLeasedRegistrationSurvivesLeaseLoss(t *testing.T) {
	cli := coordtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := RegisterRelay(ctx, cli, "/t", Process{ID: "r1", URL: "http://relay", Build: "b1"}, 2); err != nil {
		t.Fatal(err)
	}
	leaseOf := func(key string) clientv3.LeaseID {
		resp, err := cli.Get(context.Background(), key)
		if err != nil || len(resp.Kvs) == 0 {
			return 0
		}
		return clientv3.LeaseID(resp.Kvs[0].Lease)
	}
	lease := func() clientv3.LeaseID { return leaseOf(RelaysPrefix("/t") + "r1") }
	first := lease()
	if first == 0 {
		t.Fatal("not registered")
	}
	if _, err := cli.Revoke(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if l := lease(); l != 0 && l != first {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the registration did not come back under a new lease within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The process record came back with it, under the same lease.
	if l := leaseOf(ProcessesPrefix("/t") + "relay/r1"); l != lease() {
		t.Fatalf("the process record is under lease %x, the relay's under %x", l, lease())
	}
	cancel()
}

// TestLeasedRegistrationEndsWithItsContext: a registration whose context
// ends (a relay or router stopping cleanly) is gone at once, not after
// its lease's TTL: slaves and routers stop asking a stopped relay.
func TestLeasedRegistrationEndsWithItsContext(t *testing.T) {
	cli := coordtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	reg, err := RegisterRelay(ctx, cli, "/t", Process{ID: "r1", URL: "http://relay"}, 60)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	<-reg.Done()
	resp, err := cli.Get(context.Background(), RelaysPrefix("/t")+"r1")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 {
		t.Fatal("the relay is still registered after its registration's context ended (its lease's TTL is 60 s)")
	}
	if ps, err := Processes(context.Background(), cli, "/t"); err != nil || len(ps) != 0 {
		t.Fatalf("processes after the registration ended: %v, %v", ps, err)
	}
}

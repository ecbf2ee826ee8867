package clustertest

import (
	"context"
	"errors"
	"testing"

	"github.com/cortado-db/cortado/client"
	"github.com/cortado-db/cortado/internal/coord/coordtest"
)

// TestRolesAsProcesses runs a storage node, a controller and a router as
// separate processes against one etcd, with only flags to tell them
// apart, and runs the client suite through the router. Killing the
// storage node makes the router answer 503 with Retry-After instead of
// hanging or 500.
func TestRolesAsProcesses(t *testing.T) {
	etcd := coordtest.Embedded(t)
	storage := StartRole(t, "storage", "--etcd-endpoints", etcd.Endpoint, "--node-id", "s1", "--lease-ttl", "2")
	StartRole(t, "controller", "--etcd-endpoints", etcd.Endpoint, "--lease-ttl", "2")
	router := StartRole(t, "router", "--etcd-endpoints", etcd.Endpoint)
	c := client.New(router.URL)
	defer c.Close()
	runSuite(t, c)

	storage.Kill()
	_, err := c.Get(context.Background(), "mail", "Stats", client.Key{"alice"}, nil)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != 503 || ce.Type != "urn:cortado:problem:unavailable" {
		t.Fatalf("read with the storage node down: %v", err)
	}
}

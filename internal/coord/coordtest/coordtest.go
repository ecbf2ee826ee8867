// Package coordtest starts etcd for tests: an embedded member on free
// loopback ports in the test's temporary directory, stopped when the test
// ends. It is test support; nothing in the product imports it.
package coordtest

import (
	"context"
	"path/filepath"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/coord"
)

// Start starts an etcd for t and returns a client of it; both stop when t
// ends.
func Start(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := coord.Connect(context.Background(), []string{Embedded(t).Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// Embedded starts an etcd for t, stopped when t ends, for tests that hand
// its endpoint to others.
func Embedded(t testing.TB) *coord.Embedded {
	t.Helper()
	e, err := coord.StartLoopback(filepath.Join(t.TempDir(), "etcd"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

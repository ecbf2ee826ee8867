package clustertest

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/coord"
	"github.com/cortado-db/cortado/internal/coord/coordtest"
	"github.com/cortado-db/cortado/internal/topo"
)

// TestStorageRefusesAnotherClustersDirectory: a storage node started on a
// data directory a node of another cluster used (a volume mounted by
// mistake) exits at once, naming both clusters, and joins nothing; with
// --adopt-data (etcd rebuilt for the same cluster) it starts.
func TestStorageRefusesAnotherClustersDirectory(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	first := coordtest.Embedded(t)
	s := StartProcess(t, dir, "first", "storage", "--etcd-endpoints", first.Endpoint, "--node-id", "s0", "--data-dir", data, "--listen", "127.0.0.1:0", "--log-level", "warn")
	s.Stop()

	second := coordtest.Embedded(t)
	args := []string{"storage", "--etcd-endpoints", second.Endpoint, "--node-id", "s0", "--data-dir", data, "--listen", "127.0.0.1:0", "--log-level", "warn"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, Binary(t), args...).CombinedOutput()
	if err == nil || ctx.Err() != nil || !strings.Contains(string(out), "belongs to another cluster") || !strings.Contains(string(out), "--adopt-data") {
		t.Fatalf("a storage node on another cluster's directory: %v\n%s", err, out)
	}
	cli, err := coord.Connect(context.Background(), []string{second.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	resp, err := cli.Get(context.Background(), topo.NodesPrefix(procPrefix), clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("the refused node registered %d keys (%v)", len(resp.Kvs), err)
	}

	StartProcess(t, dir, "adopted", append(args, "--adopt-data")...)
	resp, err = cli.Get(context.Background(), topo.NodesPrefix(procPrefix), clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("with --adopt-data the node registered %d keys (%v)", len(resp.Kvs), err)
	}
}

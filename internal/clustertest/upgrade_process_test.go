package clustertest

import (
	"context"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/wire"
)

// TestRollingUpgrade runs a cluster in the middle of a rolling upgrade:
// the relay and one storage node speak the previous internal protocol
// (long polls of the log), the others the current one (log streams), so
// every pair of versions talks — new slaves reading an old master and the
// old relay, the old slave reading new masters, the old relay pulling
// from new masters. Under a steady write load the old processes are
// upgraded one at a time (stopped, restarted with the new protocol).
// Nothing acknowledged is lost and every replica keeps one timeline.
func TestRollingUpgrade(t *testing.T) {
	old := []string{"--protocol-version", "1"}
	c := startProcClusterWith(t, 3, 8, map[string][]string{"relay": old, "s0": old})
	if v := helloVersion(t, c.storage["s0"].URL); v != 1 {
		t.Fatalf("s0 speaks protocol %d, want 1", v)
	}
	if v := helloVersion(t, c.storage["s1"].URL); v != wire.Version {
		t.Fatalf("s1 speaks protocol %d, want %d", v, wire.Version)
	}
	w := c.startWriters(4)
	awaitWrites(t, w, 200)

	c.storage["s0"].Stop()
	c.storage["s0"].RestartWithout("--protocol-version")
	if v := helloVersion(t, c.storage["s0"].URL); v != wire.Version {
		t.Fatalf("upgraded s0 speaks protocol %d", v)
	}
	c.awaitHosting("s0")
	awaitWrites(t, w, 200)

	c.relay.Stop()
	c.relay.RestartWithout("--protocol-version")
	awaitWrites(t, w, 200)
	c.verify(w.finish(t))
}

// helloVersion is the newest protocol version the process at url speaks.
func helloVersion(t *testing.T, url string) uint32 {
	t.Helper()
	conn, err := wire.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := wire.NewNodeClient(conn).Hello(ctx, &wire.HelloRequest{MinVersion: wire.MinVersion, MaxVersion: wire.Version})
	if err != nil {
		t.Fatal(err)
	}
	return res.MaxVersion
}

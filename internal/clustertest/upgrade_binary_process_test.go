package clustertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cortado-db/cortado/client"
	"github.com/cortado-db/cortado/internal/controller"
	"github.com/cortado-db/cortado/internal/coord"
	"github.com/cortado-db/cortado/internal/topo"
)

// TestUpgradeFromAnEarlierBinary upgrades a cluster whose every process
// runs an earlier release's binary (CORTADO_EARLIER_BIN;
// scripts/upgrade-check builds one from a commit) to this checkout's
// (changeBinaries). TestRollingUpgrade covers the protocol's fallbacks
// with one binary; this covers what a real earlier release wrote: its
// data directories, what it keeps in etcd, and its answers.
func TestUpgradeFromAnEarlierBinary(t *testing.T) {
	earlier := earlierBinary(t)
	changeBinaries(t, earlier, Binary(t))
}

// TestDowngradeToAnEarlierBinary is the upgrade's way back: a cluster of
// this checkout's binary goes back to the earlier release's, as an
// operator does when an upgrade misbehaves (docs/operations.md says from
// which releases that is checked).
func TestDowngradeToAnEarlierBinary(t *testing.T) {
	earlier := earlierBinary(t)
	changeBinaries(t, Binary(t), earlier)
}

func earlierBinary(t *testing.T) string {
	earlier := os.Getenv("CORTADO_EARLIER_BIN")
	if earlier == "" {
		t.Skip("set CORTADO_EARLIER_BIN to an earlier release's binary; scripts/upgrade-check builds one and runs this")
	}
	return earlier
}

// changeBinaries starts a cluster whose every process runs the binary
// from and moves each to the binary to, in place — stopped and started
// again on its own data directory and ports — one at a time, while
// writers write and a change-stream consumer follows from the beginning.
// The order mixes the roles, so that storage nodes of either binary
// serve each other, a relay and a router of the other; one storage node
// is killed (SIGKILL) instead of stopped, so its partitions fail over
// while both binaries share them, and one controller too. At the end
// every acknowledged write reads back, every replica keeps one timeline
// with its master, the consumer holds exactly the database, and an index
// written by the first binary answers queries through the second, with
// what the second wrote.
func changeBinaries(t *testing.T, from, to string) {
	routerURL, err := coord.FreeLoopbackURL()
	if err != nil {
		t.Fatal(err)
	}
	// The router keeps its address across its restart, so the writers
	// and the consumer carry on through it.
	c := startProcClusterOf(t, from, 3, 8, map[string][]string{"router": {"--listen", strings.TrimPrefix(routerURL, "http://")}})
	before := helloVersion(t, c.storage["s0"].URL)
	c.awaitBuilds(from)
	// Another database, so that the consumer of d sees only T.
	c.do("PUT", "/_schemata/x", `{"partitions":8,"replicas":3}`, 201)
	c.do("PUT", "/_schemata/x/I", `{"key":[{"name":"g"},{"name":"n","type":"long"}],"schema":{"type":"record","name":"I","fields":[{"name":"t","type":"string","index":"text"},{"name":"v","type":"long","index":"attribute"}]}}`, 201)
	indexed := func(word string, from, to int) {
		for g := range 4 {
			for n := from; n < to; n++ {
				c.do("PUT", fmt.Sprintf("/x/I/g%d/%d", g, n), fmt.Sprintf(`{"t":"%s %d","v":%d}`, word, n, n), 201)
			}
		}
	}
	indexed("before", 0, 10)
	w := c.startWriters(4)
	cons := startConsumer(t, c.router.URL, "beginning", 7, 300)
	awaitWrites(t, w, 200)

	steps := []struct {
		name string
		p    *Serve
		kill bool
	}{
		{"s0", c.storage["s0"], false}, {"relay", c.relay, false}, {"s1", c.storage["s1"], true}, {"c1", c.controllers["c1"], false},
		{"router", c.router, false}, {"s2", c.storage["s2"], false}, {"c2", c.controllers["c2"], true},
	}
	for _, s := range steps {
		if s.kill {
			s.p.Kill()
			if strings.HasPrefix(s.name, "s") {
				// Its partitions fail over to the other two before it
				// comes back.
				c.awaitMastersOff(s.name)
			}
		} else {
			s.p.Stop()
		}
		s.p.RestartAs(to)
		if strings.HasPrefix(s.name, "s") {
			if s.name == "s0" {
				t.Logf("protocol %d before, %d after", before, helloVersion(t, s.p.URL))
			}
			c.awaitHosting(s.name)
		}
		t.Logf("%s moved; %d writes acknowledged", s.name, w.count())
		awaitWrites(t, w, 100)
	}
	c.awaitBuilds(to)
	acked := w.finish(t)
	c.verify(acked)
	cons.awaitEqual(c.router.URL, acked)

	indexed("after", 10, 20)
	cl := client.New(c.router.URL)
	for g := range 4 {
		for _, q := range []struct {
			where string
			want  int
		}{{"before", 10}, {"v:[5 TO 14]", 10}, {"before OR after", 20}, {"after AND NOT t:19", 9}} {
			page, err := cl.Query(context.Background(), "x", "I", client.Key{fmt.Sprint("g", g)}, client.Query{Where: q.where, Limit: 100}, nil)
			if err != nil {
				t.Fatalf("group g%d, query %q: %v", g, q.where, err)
			}
			if len(page.Documents) != q.want {
				t.Fatalf("group g%d, query %q: %d documents, want %d", g, q.where, len(page.Documents), q.want)
			}
		}
	}
}

// awaitBuilds waits until /_cluster's status lists every storage node as
// running bin — the build `bin version` prints (none for a release from
// before the command), and its newest protocol — and the relay, the
// router and the controllers too: each of them, with this checkout's
// binary; none, or each, with an earlier one (releases up to
// 99f8c6e register none).
func (c *procCluster) awaitBuilds(bin string) {
	t := c.t
	t.Helper()
	build, protocol := "", uint32(0)
	if v, ok := versionOf(t, bin); ok {
		build, protocol = v.build, v.maxProtocol
	}
	processes := 2 + len(c.controllers)
	var last *controller.Status
	for deadline := time.Now().Add(30 * time.Second); ; {
		st, err := controller.ClusterStatus(context.Background(), c.cli, procPrefix)
		if err == nil {
			last = st
			nodesRun := len(st.Nodes) == len(c.storage) && !slices.ContainsFunc(st.Nodes, func(n controller.NodeStatus) bool {
				return !n.Live || n.Build != build || n.Protocol != protocol
			})
			listed := len(st.Processes) == processes || len(st.Processes) == 0 && bin != Binary(t)
			processesRun := listed && !slices.ContainsFunc(st.Processes, func(p topo.Process) bool {
				return p.Build != build || p.Protocol != protocol
			})
			if nodesRun && processesRun {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/_cluster does not list every process as running build %q, protocol %d: %+v (%v)", build, protocol, last, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// binaryVersion is what `cortado version` printed.
type binaryVersion struct {
	build                    string
	minProtocol, maxProtocol uint32
	format                   uint32
}

// versionOf runs `bin version` and reads what it printed; ok is false
// for a release from before the command (it exits with an error).
func versionOf(t *testing.T, bin string) (v binaryVersion, ok bool) {
	t.Helper()
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		return v, false
	}
	// "cortado <build> (<time>)", "built with …",
	// "internal protocol versions 1 to 7", "storage format 1".
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var n [3]int
	if len(lines) == 4 {
		n[0], _ = fmt.Sscanf(lines[0], "cortado %s", &v.build)
		n[1], _ = fmt.Sscanf(lines[2], "internal protocol versions %d to %d", &v.minProtocol, &v.maxProtocol)
		n[2], _ = fmt.Sscanf(lines[3], "storage format %d", &v.format)
	}
	if n != [3]int{1, 2, 1} {
		t.Fatalf("%s version printed:\n%s", bin, out)
	}
	return v, true
}

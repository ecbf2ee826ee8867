package jepsen

import (
	"context"
	"errors"
	"fmt"
	"github.com/cortado-db/cortado/internal/cachetier/redistest"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/clustertest"
	"github.com/cortado-db/cortado/internal/coord"
)

// Options shape a run.
type Options struct {
	// Partitions of the test database (replicas 3, semi-sync).
	Partitions int
	// LeaseTTL of storage nodes, relay and controllers, in seconds.
	LeaseTTL int
	// DiskBytes, when set, puts one storage node's data on a tmpfs of
	// this size, so the nemesis can fill it (needs root; without it the
	// disk fault is skipped).
	DiskBytes int64
	// Retention, when set, is the test database's commit-log retention
	// by age (a Go duration), trimmed every second, and the relay keeps
	// 50 commits per partition: slaves that fall behind are rebuilt from
	// snapshots during the run.
	Retention string
	// MinInSync, when set, is the test database's minInSync (default 2:
	// a slave's acknowledgement completes a write's quorum; with 3 a
	// write needs both slaves, and a slave's reads wait for the other's).
	MinInSync int
	// Dir, when set, holds the processes' data and logs and is kept after
	// the run (default: a temporary directory, removed); LogLevel is their
	// log level (default warn).
	Dir      string
	LogLevel string
	// EarlierBin, when set, is an earlier release's binary that storage
	// node s3 runs for the whole run (restarts included), beside nodes,
	// a relay, controllers and routers of this checkout: a rolling
	// upgrade's mixed cluster under every fault.
	EarlierBin string
}

// Cluster is Cortado as processes on loopback ports.
type Cluster struct {
	t       testing.TB
	opts    Options
	dir     string
	Etcd    *clustertest.Serve
	etcdURL string
	Relay   *clustertest.Serve
	// Storage nodes by ID (s1, s2, s3). DiskNode's data dir is a small
	// tmpfs, for the disk-full fault; StallNode's is ext4 on a loop
	// device, which the stall-disk fault freezes.
	Storage map[string]*clustertest.Serve
	// everStorage is every storage process the run started, by ID,
	// removed ones too: the checker reads their logs.
	everStorage map[string]*clustertest.Serve
	DiskNode    string
	DiskDir     string
	StallNode   string
	StallDir    string
	Controllers []*clustertest.Serve
	Routers     []*clustertest.Serve
	// Links through toxiproxy, for the network faults: the connections
	// to etcd of each storage node, controller, router and the relay (by
	// ID), and every connection to a storage node or the relay (each
	// advertises its proxy, so the others reach it only there). The
	// checker reads the storage nodes directly (Storage).
	EtcdLink, InLink map[string]*toxiproxy.Proxy
	cli              *clientv3.Client
}

const prefix = "/cortado"

// StartCluster starts every process and creates database d (tables U,
// C, P, R: see workload.go) and waits until every partition has a master.
func StartCluster(t testing.TB, o Options) *Cluster {
	t.Helper()
	c := &Cluster{t: t, opts: o, dir: o.Dir, Storage: map[string]*clustertest.Serve{},
		EtcdLink: map[string]*toxiproxy.Proxy{}, InLink: map[string]*toxiproxy.Proxy{}}
	if c.dir == "" {
		c.dir = t.TempDir()
	}
	if o.LogLevel == "" {
		o.LogLevel = "warn"
		c.opts.LogLevel = o.LogLevel
	}
	ttl := fmt.Sprint(o.LeaseTTL)
	client, peer := freeURL(t), freeURL(t)
	c.etcdURL = client
	c.Etcd = clustertest.StartProcess(t, c.sub("etcd"), "etcd", "etcd", "--data-dir", c.sub("etcd"), "--client-url", client, "--peer-url", peer)
	cli, err := coord.Connect(context.Background(), []string{client})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	c.cli = cli
	relayArgs := slices.Concat([]string{"relay", "--relay-id", "relay1", "--lease-ttl", ttl}, c.inbound("relay"), c.common("relay"))
	if o.Retention != "" {
		// A small buffer, so that a node coming back is behind the
		// relay's buffer too, and behind its master's log: rebuilt.
		relayArgs = append(relayArgs, "--buffer", "50")
	}
	c.Relay = c.start("relay", relayArgs...)
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("s%d", i)
		data := c.sub(id + "-data")
		if i == 3 && o.DiskBytes > 0 {
			if err := mountTmpfs(data, o.DiskBytes); err != nil {
				t.Logf("no tmpfs for the disk-full fault (%v): it is skipped", err)
			} else {
				c.DiskNode, c.DiskDir = id, data
				t.Cleanup(func() { exec.Command("umount", "-l", data).Run() })
			}
		}
		if i == 2 && o.DiskBytes > 0 {
			if err := c.mountLoop(data, o.DiskBytes); err != nil {
				t.Logf("no loop device for the stall-disk fault (%v): it is skipped", err)
			} else {
				c.StallNode, c.StallDir = id, data
			}
		}
		c.Storage[id] = c.startStorage(id, "r"+fmt.Sprint(i), data)
	}
	for i := 1; i <= 2; i++ {
		id := fmt.Sprintf("c%d", i)
		c.Controllers = append(c.Controllers, c.start(id, append([]string{"controller", "--controller-id", id,
			"--listen", hostPort(t), "--lease-ttl", ttl, "--check-interval", "0"}, c.common(id)...)...))
	}
	// Both routers read the Redis cache tier; the first also keeps it
	// current (its updater stops while it is killed, and the tier's
	// entries then grow too old to answer).
	redis := redistest.Start(t)
	for i := 1; i <= 2; i++ {
		id := fmt.Sprintf("router%d", i)
		args := []string{"router", "--listen", hostPort(t), "--redis-url", redis.URL(), fmt.Sprintf("--redis-update=%v", i == 1)}
		c.Routers = append(c.Routers, c.start(id, append(args, c.common(id)...)...))
	}
	h := newHTTP(c.Routers[0].URL)
	settings := "" // the database's, past partitions and replicas
	if o.Retention != "" {
		settings = fmt.Sprintf(`,"retention":{"maxAge":%q}`, o.Retention)
	}
	if o.MinInSync > 0 {
		settings += fmt.Sprintf(`,"minInSync":%d`, o.MinInSync)
	}
	if st, b := h.do("PUT", "/_schemata/d", fmt.Sprintf(`{"partitions":%d,"replicas":3%s}`, o.Partitions, settings), ""); st != 201 {
		t.Fatalf("create database: %d %s", st, b)
	}
	for _, tbl := range []string{
		`"U","key":[{"name":"k"}],"schema":{"type":"record","name":"U","fields":[{"name":"v","type":"long"}]}`,
		`"C","key":[{"name":"k"}],"schema":{"type":"record","name":"C","fields":[{"name":"n","type":"long","default":0}]}`,
		`"B","key":[{"name":"g"},{"name":"a"}],"schema":{"type":"record","name":"B","fields":[{"name":"n","type":"long","default":0}]}`,
		`"R","key":[{"name":"g"},{"name":"r"}],"schema":{"type":"record","name":"R","fields":[{"name":"n","type":"long","default":0,"index":"attribute"},{"name":"memo","type":"string","default":"","index":"text"}]}`,
	} {
		name, rest, _ := strings.Cut(tbl, ",")
		if st, b := h.do("PUT", "/_schemata/d/"+strings.Trim(name, `"`), "{"+rest+"}", ""); st != 201 {
			t.Fatalf("register %s: %d %s", name, st, b)
		}
	}
	return c
}

// common are every process's flags: etcd through a link of its own.
func (c *Cluster) common(id string) []string {
	c.EtcdLink[id] = c.link(id+"-etcd", strings.TrimPrefix(c.etcdURL, "http://"))
	return []string{"--etcd-endpoints", "http://" + c.EtcdLink[id].Listen, "--log-level", c.opts.LogLevel}
}

// inbound is a storage node's or the relay's port, and the link in front
// of it that it advertises.
func (c *Cluster) inbound(id string) []string {
	listen := hostPort(c.t)
	c.InLink[id] = c.link(id+"-in", listen)
	return []string{"--listen", listen, "--advertise-url", "http://" + c.InLink[id].Listen}
}

// startStorage starts storage node id in rack with its data in data,
// behind links of its own to etcd and from its callers.
func (c *Cluster) startStorage(id, rack, data string) *clustertest.Serve {
	args := slices.Concat([]string{"storage", "--node-id", id, "--rack", rack, "--data-dir", data, "--lease-ttl", fmt.Sprint(c.opts.LeaseTTL)},
		c.inbound(id), c.common(id))
	if c.opts.Retention != "" {
		args = append(args, "--retention-interval", "1s")
	}
	bin := ""
	if id == "s3" {
		bin = c.opts.EarlierBin
	}
	s := clustertest.StartProcessOf(c.t, bin, c.sub(id), id, args...)
	if c.everStorage == nil {
		c.everStorage = map[string]*clustertest.Serve{}
	}
	c.everStorage[id] = s
	return s
}

// AddNode starts a storage node that was not in the cluster (a fresh
// data directory, a rack of its own): the controller gives it replicas
// and masters.
func (c *Cluster) AddNode(id string) {
	c.Storage[id] = c.startStorage(id, "r-"+id, c.sub(id+"-data"))
}

// RemoveNode stops storage node id cleanly (SIGTERM: it hands its masters
// over first) for good: the controller places its replicas on the other
// nodes, which rebuild them from snapshots.
func (c *Cluster) RemoveNode(id string) {
	c.Storage[id].Stop()
	c.InLink[id].Stop()
	c.EtcdLink[id].Stop()
	delete(c.Storage, id)
	delete(c.InLink, id)
	delete(c.EtcdLink, id)
}

// link starts a proxy to upstream (host:port) for the network faults.
func (c *Cluster) link(name, upstream string) *toxiproxy.Proxy {
	return clustertest.NewLink(c.t, name, upstream)
}

func (c *Cluster) sub(name string) string {
	d := filepath.Join(c.dir, name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		c.t.Fatal(err)
	}
	return d
}

func (c *Cluster) start(name string, args ...string) *clustertest.Serve {
	return clustertest.StartProcess(c.t, c.sub(name), name, args...)
}

// freeURL is a free loopback URL.
func freeURL(t testing.TB) string {
	u, err := coord.FreeLoopbackURL()
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// hostPort is a free loopback host:port: processes keep their address
// across restarts, as a restarted service would.
func hostPort(t testing.TB) string { return strings.TrimPrefix(freeURL(t), "http://") }

// mountLoop mounts on dir an ext4 of size bytes in a sparse image file
// beside it, on a loop device: unlike tmpfs, fsfreeze can stall it.
func (c *Cluster) mountLoop(dir string, size int64) (err error) {
	img := dir + ".img"
	defer func() {
		if err != nil {
			os.Remove(img)
		}
	}()
	f, err := os.Create(img)
	if err != nil {
		return err
	}
	if err := errors.Join(f.Truncate(size), f.Close()); err != nil {
		return err
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4: %v: %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, dir).CombinedOutput(); err != nil {
		return fmt.Errorf("mount: %v: %s", err, out)
	}
	c.t.Cleanup(func() {
		exec.Command("fsfreeze", "-u", dir).Run() // a failed run may leave it frozen
		exec.Command("umount", "-l", dir).Run()
		os.Remove(img)
	})
	return nil
}

// mountTmpfs mounts a tmpfs of size bytes on dir.
func mountTmpfs(dir string, size int64) error {
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}

// Restart starts a killed process again (same flags, data and address),
// retrying while its port is still held by the old one's sockets.
func (c *Cluster) Restart(s *clustertest.Serve) {
	c.t.Helper()
	c.retry("restart", s.TryRestart)
}

// retry calls f until it succeeds, for at most 30 s: a port the old
// process's sockets still hold is freed within that.
func (c *Cluster) retry(what string, f func() error) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// KillNode kill -9s a storage node, or the relay ("relay"). Its port
// refuses connections then, as a host whose process died does: the proxy
// in front of it stops too (a proxy that accepted and then closed them
// would make every call to the dead process one whose request may have
// been delivered).
func (c *Cluster) KillNode(id string) {
	c.process(id).Kill()
	c.InLink[id].Stop()
}

func (c *Cluster) process(id string) *clustertest.Serve {
	if id == "relay" {
		return c.Relay
	}
	return c.Storage[id]
}

// RestartNode starts a killed storage node or relay again, at the same
// address behind the same proxy.
func (c *Cluster) RestartNode(id string) {
	c.t.Helper()
	c.retry("restart "+id+"'s proxy", c.InLink[id].Start)
	c.Restart(c.process(id))
}

// Rebuilt sums, over the running storage nodes, the replicas they rebuilt
// from a snapshot since they last started.
func (c *Cluster) Rebuilt() int {
	total := 0
	for _, s := range c.Storage {
		resp, err := http.Get(s.URL + "/metrics")
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "cortado_replica_rebuilt_total "); ok {
				n, _ := strconv.ParseFloat(v, 64)
				total += int(n)
			}
		}
	}
	return total
}

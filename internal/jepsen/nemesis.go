package jepsen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"

	"github.com/cortado-db/cortado/internal/clustertest"
	"github.com/cortado-db/cortado/internal/controller"
	"github.com/cortado-db/cortado/internal/problem"
	"github.com/cortado-db/cortado/internal/storage"
	"github.com/cortado-db/cortado/internal/topo"
)

// Fault is one nemesis action, from when it began to when the cluster
// had been healed and given time to settle.
type Fault struct {
	Kind              string
	Target            string
	Start, Heal, Done time.Time
	// Note says what a fault's own checks saw, when there is more to
	// say than that they passed.
	Note string
}

// Faults the nemesis knows, in the order a fixed schedule cycles them.
var Faults = []string{
	"kill-master",     // kill -9 the busiest master, restart it while writes go on
	"restart-master",  // stop the busiest master cleanly (SIGTERM: a rolling restart's step), start it again
	"pause-master",    // SIGSTOP the busiest master past its lease, then SIGCONT
	"cut-etcd",        // cut the busiest master off from etcd past its lease; it keeps running, reachable by all
	"isolate-master",  // cut the busiest master off from etcd and from every caller past its lease; it keeps running
	"cut-controller",  // cut the leading controller off from etcd past its lease; it keeps running
	"cut-router",      // cut a router off from etcd, kill -9 the busiest master meanwhile: the router routes by a stale table
	"kill-two",        // kill -9 two storage nodes together, restart both
	"kill-relay",      // kill -9 the relay, restart it
	"isolate-relay",   // cut the relay off from etcd and from the slaves past its lease; it keeps running
	"pause-relay",     // SIGSTOP the relay past its lease, then SIGCONT
	"kill-controller", // kill -9 the leading controller, restart it
	"kill-router",     // kill -9 a router, restart it
	"restart-etcd",    // kill -9 etcd, restart it
	"disk-full",       // fill a storage node's disk, free it, restart the node
	"stall-disk",      // freeze a storage node's file system past its disk stall timeout, thaw it, restart the node
	"join-node",       // a fourth storage node joins and takes replicas and masters (online expansion), then stops cleanly for good and its replicas are rebuilt on the others
	"join-kill",       // join-node, with the busiest master killed -9 (and restarted) while replicas move to the fourth node
	"shrink-kill",     // the database's replicas go from 3 to 2 (PATCH /_schemata/d) with the busiest master killed -9 while the third copies are deleted, then back to 3
}

// Nemesis injects faults into a cluster.
type Nemesis struct {
	c   *Cluster
	rng *rand.Rand
	log []Fault
}

// NewNemesis returns a nemesis with its own random source.
func NewNemesis(c *Cluster, seed uint64) *Nemesis {
	return &Nemesis{c: c, rng: rand.New(rand.NewPCG(seed, 99))}
}

// ttl is the lease TTL.
func (n *Nemesis) ttl() time.Duration { return time.Duration(n.c.opts.LeaseTTL) * time.Second }

// Run applies one fault: it breaks something, holds while the workload
// runs, heals, and waits for the cluster to settle (every partition with a
// master answering writes).
func (n *Nemesis) Run(kind string) error {
	c := n.c
	f := Fault{Kind: kind, Start: time.Now()}
	hold := 3*n.ttl() + time.Duration(n.rng.IntN(2000))*time.Millisecond
	switch kind {
	case "kill-master":
		f.Target = n.busiestMaster()
		c.KillNode(f.Target)
		time.Sleep(hold)
		f.Heal = time.Now()
		c.RestartNode(f.Target)
	case "restart-master":
		// A clean stop hands the node's masterships to other replicas
		// before it leaves (--drain-timeout).
		f.Target = n.busiestMaster()
		began := time.Now()
		c.Storage[f.Target].Stop()
		c.InLink[f.Target].Stop()
		f.Note = fmt.Sprintf("it stopped in %s", time.Since(began).Round(10*time.Millisecond))
		time.Sleep(n.ttl())
		f.Heal = time.Now()
		c.RestartNode(f.Target)
	case "join-node", "join-kill":
		// Expansion and contraction under load: the new node's replicas
		// are bootstrapped from their masters' snapshots and masters are
		// handed to it; when it leaves, its masters are handed back and
		// its replicas rebuilt elsewhere. Nothing acknowledged may be lost
		// on the way, and every replica must end equal.
		joiner := "s4"
		f.Target = joiner
		began := time.Now()
		c.AddNode(joiner)
		if kind == "join-kill" {
			// While replicas move to it, the busiest master dies: a
			// slave leaving for s4 may hold writes acknowledged with its
			// help that no other replica holds yet, so the failover
			// must weigh it (a replica until s4 caught up, then a copy).
			n.awaitTable(time.Minute, func(rt *topo.RoutingTable) bool { return replicasOf(rt, joiner) > 0 })
			victim := n.busiestMaster()
			f.Target = joiner + "," + victim
			c.KillNode(victim)
			time.Sleep(hold)
			c.RestartNode(victim)
		}
		share := n.c.opts.Partitions / 4
		rt := n.awaitTable(3*time.Minute, func(rt *topo.RoutingTable) bool { return rt.Masters()[joiner] >= share-1 })
		f.Note = fmt.Sprintf("it mastered %d partitions (a share: %d) after %s", rt.Masters()[joiner], share, time.Since(began).Round(100*time.Millisecond))
		time.Sleep(n.ttl())
		f.Heal = time.Now()
		c.RemoveNode(joiner)
		began = time.Now()
		rt = n.awaitTable(2*time.Minute, func(rt *topo.RoutingTable) bool { return replicasOf(rt, joiner) == 0 })
		f.Note += fmt.Sprintf("; its replicas were placed elsewhere %s after it stopped (%d left on it)", time.Since(began).Round(100*time.Millisecond), replicasOf(rt, joiner))
	case "shrink-kill":
		// A database's replicas changed online, under writes and a
		// failover: each partition's third copy goes once the other two
		// hold all of it, while the busiest master dies, so failovers
		// count answers over lists that are shrinking; then the
		// replicas come back to three, rebuilt from snapshots. Nothing
		// acknowledged may be lost on the way, and every replica must
		// end equal.
		h := newHTTP(c.Routers[0].URL, c.Routers[1].URL)
		alter := func(replicas int) error {
			var last response
			for range 20 { // a router restarting, or the registry busy
				if last = h.send("PATCH", "/_schemata/d", fmt.Sprintf(`{"replicas":%d}`, replicas), ""); last.err == nil && last.status != 503 {
					break
				}
				time.Sleep(500 * time.Millisecond)
			}
			if last.status != 200 {
				return fmt.Errorf("shrink-kill: replicas %d: %d %s %v", replicas, last.status, last.body, last.err)
			}
			return nil
		}
		every := func(k int) func(*topo.RoutingTable) bool {
			return func(rt *topo.RoutingTable) bool {
				for _, r := range rt.Partitions {
					if len(r.Replicas) != k {
						return false
					}
				}
				return true
			}
		}
		if c.opts.MinInSync > 2 {
			return errSkipped // two replicas would refuse every write
		}
		if err := alter(2); err != nil {
			return err
		}
		began := time.Now()
		f.Target = n.busiestMaster()
		c.KillNode(f.Target)
		time.Sleep(hold)
		c.RestartNode(f.Target)
		rt := n.awaitTable(3*time.Minute, every(2))
		if !every(2)(rt) {
			return fmt.Errorf("shrink-kill: 3 minutes after replicas became 2, the table still has partitions of other replica counts")
		}
		f.Note = fmt.Sprintf("two replicas a partition %s after the change", time.Since(began).Round(100*time.Millisecond))
		f.Heal = time.Now()
		if err := alter(3); err != nil {
			return err
		}
		began = time.Now()
		if rt := n.awaitTable(3*time.Minute, every(3)); !every(3)(rt) {
			return fmt.Errorf("shrink-kill: 3 minutes after replicas became 3 again, the table still has partitions of other replica counts")
		}
		f.Note += fmt.Sprintf("; three listed again %s after it was undone (the final check finds them equal)", time.Since(began).Round(100*time.Millisecond))
	case "pause-master":
		f.Target = n.busiestMaster()
		c.Storage[f.Target].Pause()
		time.Sleep(2*n.ttl() + time.Duration(n.rng.IntN(2000))*time.Millisecond)
		f.Heal = time.Now()
		c.Storage[f.Target].Resume()
	case "cut-etcd", "isolate-master":
		// A network partition: the process runs on, its connections
		// hang. Cut off from etcd, it cannot renew its lease; with
		// cut-etcd, routers still on the old routing table, the relay
		// and its slaves still reach it while a new master is chosen.
		f.Target = n.busiestMaster()
		links := []*toxiproxy.Proxy{c.EtcdLink[f.Target]}
		if kind == "isolate-master" {
			links = append(links, c.InLink[f.Target])
		}
		if err := n.cut(&f, hold, links...); err != nil {
			return err
		}
	case "cut-controller":
		// Another controller takes the lead while this one runs on; what
		// it sent is delivered when the cut is mended.
		f.Target = n.leadingController()
		if err := n.cut(&f, hold, c.EtcdLink[f.Target]); err != nil {
			return err
		}
	case "cut-router":
		// The router keeps serving by the routing table it had while the
		// busiest master fails over: its writes go to the old master
		// until it hears of the new one.
		i := n.rng.IntN(len(c.Routers))
		id := fmt.Sprintf("router%d", i+1)
		link := c.EtcdLink[id]
		if err := clustertest.Cut(link); err != nil {
			return err
		}
		master := n.busiestMaster()
		f.Target = id + "," + master
		c.KillNode(master)
		time.Sleep(hold)
		c.RestartNode(master)
		time.Sleep(n.ttl())
		// Its registration lapses a lease's TTL (the router's is the
		// default, 5 s) into the cut: it must say that its routing may
		// be stale.
		for until := time.Now().Add(10 * time.Second); ; {
			r := newHTTP(c.Routers[i].URL).send("GET", "/healthz", "", "")
			if r.err == nil && r.status == 503 && strings.Contains(string(r.body), `"stale"`) {
				break
			}
			if time.Now().After(until) {
				return fmt.Errorf("cut-router: %s cut off from etcd for %v answers /healthz %d %s %v, want 503 stale", id, time.Since(f.Start).Round(time.Second), r.status, r.body, r.err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		f.Heal = time.Now()
		if err := clustertest.Mend(link); err != nil {
			return err
		}
	case "kill-two":
		ids := []string{n.busiestMaster()}
		for id := range c.Storage {
			if id != ids[0] && len(ids) < 2 {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		f.Target = fmt.Sprint(ids)
		for _, id := range ids {
			c.KillNode(id)
		}
		time.Sleep(hold)
		f.Heal = time.Now()
		for _, id := range ids {
			c.RestartNode(id)
		}
	case "kill-relay":
		f.Target = "relay"
		c.KillNode("relay")
		time.Sleep(hold)
		f.Heal = time.Now()
		c.RestartNode("relay")
	case "pause-relay":
		// Its streams fall silent, as when it is cut off, but its
		// connections stay open and what it was sending arrives late.
		f.Target = "relay"
		c.Relay.Pause()
		time.Sleep(hold)
		f.Heal = time.Now()
		c.Relay.Resume()
	case "isolate-relay":
		// Slaves' log streams hang: they must give up on the relay and
		// read their masters' logs (semi-sync writes wait meanwhile).
		f.Target = "relay"
		if err := n.cut(&f, hold, c.EtcdLink["relay"], c.InLink["relay"]); err != nil {
			return err
		}
	case "kill-controller":
		f.Target = n.leadingController()
		n.killRestart(c.Controllers[f.Target[1]-'1'], hold, &f)
	case "kill-router":
		i := n.rng.IntN(len(c.Routers))
		f.Target = fmt.Sprintf("router%d", i+1)
		n.killRestart(c.Routers[i], hold, &f)
	case "restart-etcd":
		f.Target = "etcd"
		n.killRestart(c.Etcd, n.ttl()+time.Second, &f)
	case "disk-full":
		if c.DiskNode == "" {
			return errSkipped
		}
		f.Target = c.DiskNode
		ballast := filepath.Join(c.DiskDir, "ballast")
		fill(ballast)
		// The node must notice and say so: /healthz turns 503 (it
		// fails its writes and leaves the cluster meanwhile).
		until := time.Now().Add(hold)
		// The disk stays full: space the node frees (files a flush or
		// compaction made obsolete) is taken again, or a probe that
		// lands in it passes.
		if !n.reportsFailed(f.Target, until, func() { fill(ballast) }) {
			os.Remove(ballast)
			return fmt.Errorf("disk-full: %s's /healthz did not report the failed disk within %v", f.Target, hold)
		}
		time.Sleep(time.Until(until))
		f.Heal = time.Now()
		os.Remove(ballast)
		// A node whose disk failed left the cluster for good: an
		// operator restarts it once the disk is fixed.
		c.KillNode(f.Target)
		c.RestartNode(f.Target)
	case "stall-disk":
		// Writes and syncs to the node's disk block in the kernel, reads
		// go on, its process and network are fine: a stalled disk
		// (fsfreeze), as a cloud volume stalls. The node must take its
		// disk for failed within its --disk-stall-timeout and say so
		// (/healthz 503), and its partitions must fail over meanwhile.
		if c.StallNode == "" {
			return errSkipped
		}
		f.Target = c.StallNode
		if out, err := exec.Command("fsfreeze", "-f", c.StallDir).CombinedOutput(); err != nil {
			return fmt.Errorf("stall-disk: fsfreeze -f %s: %v: %s", c.StallDir, err, out)
		}
		until := time.Now().Add(storage.DefaultStallTimeout + 2*n.ttl() + time.Duration(n.rng.IntN(2000))*time.Millisecond)
		hctx, hcancel := context.WithCancel(context.Background())
		hung := n.hungWrite(hctx, f.Target)
		reported := n.reportsFailed(f.Target, until, func() {})
		// Its partitions must have other masters while the disk is still
		// stalled: a node that said its disk failed but kept its
		// partitions left them without a master until the disk came back.
		var failover error
		if reported {
			failover = n.writable(time.Now().Add(2*n.ttl() + 5*time.Second))
		}
		// A write that hung on the node must end once it has left (the
		// routers' tables drop it), long before its deadline, and
		// unacknowledged: the disk has not come back.
		var ended error
		select {
		case r := <-hung:
			ended, f.Note = r.err, r.note
		case <-time.After(time.Until(until)):
			ended = fmt.Errorf("a write hanging on it since the disk froze still waited %v after", time.Since(f.Start).Round(time.Second))
			hcancel()
			<-hung
		}
		hcancel()
		time.Sleep(time.Until(until))
		f.Heal = time.Now()
		if out, err := exec.Command("fsfreeze", "-u", c.StallDir).CombinedOutput(); err != nil {
			return fmt.Errorf("stall-disk: fsfreeze -u %s: %v: %s", c.StallDir, err, out)
		}
		if ended != nil {
			return fmt.Errorf("stall-disk: %s: %w", f.Target, ended)
		}
		if !reported {
			return fmt.Errorf("stall-disk: %s's /healthz did not report the stalled disk within %v", f.Target, f.Heal.Sub(f.Start).Round(time.Second))
		}
		if failover != nil {
			return fmt.Errorf("stall-disk: %s reported its stalled disk, but %w", f.Target, failover)
		}
		// As after disk-full: an operator restarts it once the disk is
		// back.
		c.KillNode(f.Target)
		c.RestartNode(f.Target)
	default:
		return fmt.Errorf("unknown fault %q", kind)
	}
	n.settle()
	f.Done = time.Now()
	n.log = append(n.log, f)
	return nil
}

var errSkipped = errors.New("fault skipped")

func (n *Nemesis) killRestart(s *clustertest.Serve, hold time.Duration, f *Fault) {
	s.Kill()
	time.Sleep(hold)
	f.Heal = time.Now()
	n.c.Restart(s)
}

// cut cuts links, holds, and mends them.
func (n *Nemesis) cut(f *Fault, hold time.Duration, links ...*toxiproxy.Proxy) error {
	for _, l := range links {
		if err := clustertest.Cut(l); err != nil {
			return err
		}
	}
	time.Sleep(hold)
	f.Heal = time.Now()
	for _, l := range links {
		if err := clustertest.Mend(l); err != nil {
			return err
		}
	}
	return nil
}

// fill writes to path until the file system is full.
func fill(path string) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			return
		}
	}
}

func (n *Nemesis) busiestMaster() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rt, err := topo.LoadRoutingTable(ctx, n.c.cli, prefix, "d")
	if err != nil || rt == nil {
		return "s1"
	}
	count := rt.Masters()
	best := "s1"
	for id, k := range count {
		if n.c.Storage[id] == nil {
			continue // a node that left
		}
		if k > count[best] || k == count[best] && id < best {
			best = id
		}
	}
	return best
}

// awaitTable polls the database's routing table until ok holds of it or
// within has passed, and returns the last table read (nil if none).
func (n *Nemesis) awaitTable(within time.Duration, ok func(*topo.RoutingTable) bool) *topo.RoutingTable {
	deadline := time.Now().Add(within)
	var last *topo.RoutingTable
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		rt, err := topo.LoadRoutingTable(ctx, n.c.cli, prefix, "d")
		cancel()
		if err == nil && rt != nil {
			if last = rt; ok(rt) {
				return rt
			}
		}
		if time.Now().After(deadline) {
			return last
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// replicasOf counts the partitions node id holds a replica of in rt (-1:
// no table).
func replicasOf(rt *topo.RoutingTable, id string) int {
	k := 0
	if rt == nil {
		return -1 // unknown
	}
	for _, r := range rt.Partitions {
		if slices.Contains(r.Replicas, id) {
			k++
		}
	}
	return k
}

func (n *Nemesis) leadingController() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := controller.ClusterStatus(ctx, n.c.cli, prefix)
	if err != nil || (st.Controller != "c1" && st.Controller != "c2") {
		return "c1"
	}
	return st.Controller
}

// reportsFailed reports whether storage node id's /healthz answers 503
// (a failed disk) before until, calling meanwhile before each look.
func (n *Nemesis) reportsFailed(id string, until time.Time, meanwhile func()) bool {
	for time.Now().Before(until) {
		meanwhile()
		if r := newHTTP(n.c.Storage[id].URL).send("GET", "/healthz", "", ""); r.err == nil && r.status == 503 {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// hungWrite sends a write, through a router, to a partition node id
// masters, with a deadline of five minutes, and says on the channel
// returned how it ended: a note for a 503 naming the node's departure
// from the cluster, or for a refusal as overloaded (nothing done,
// nothing waiting), else an error saying what came instead (also once
// ctx ends). With no such partition the write is not sent and a note
// comes at once.
func (n *Nemesis) hungWrite(ctx context.Context, id string) <-chan hungResult {
	out := make(chan hungResult, 1)
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	rt, err := topo.LoadRoutingTable(lctx, n.c.cli, prefix, "d")
	cancel()
	key := ""
	if err == nil && rt != nil {
		for p, k := range partitionKeys(n.c.opts.Partitions, "stalled") {
			if m, _ := rt.Master(p); m == id {
				key = k
				break
			}
		}
	}
	if key == "" {
		out <- hungResult{note: "it mastered no partition: no write hung"}
		return out
	}
	go func() {
		start := time.Now()
		req, _ := http.NewRequestWithContext(ctx, "PUT", n.c.routerURLs()[0]+"/d/U/"+key, strings.NewReader(`{"v":0}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Request-Timeout", "300s")
		resp, err := (&http.Client{Timeout: 5 * time.Minute}).Do(req)
		took := func() string { return time.Since(start).Round(time.Millisecond).String() }
		if err != nil {
			out <- hungResult{err: fmt.Errorf("a write hanging on it: %v", err)}
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if r := (response{status: resp.StatusCode, body: body}); r.status == http.StatusServiceUnavailable && problemOf(r).Type == problem.TypeOverloaded {
			// Refused before anything was done: the node's admission
			// (or the router's bound on calls to it) was already full
			// of writes hanging on its disk, and nothing waits.
			out <- hungResult{note: "the write to it refused as overloaded after " + took()}
			return
		}
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "left the cluster") {
			out <- hungResult{err: fmt.Errorf("a write of %s (a partition it mastered) when the disk froze ended after %s with %d %s (SCN %s), want 503 naming its departure", key, took(), resp.StatusCode, body, resp.Header.Get("X-Cortado-SCN"))}
			return
		}
		out <- hungResult{note: "the write hanging on it ended when it left, after " + took()}
	}()
	return out
}

// hungResult is how hungWrite's write ended: err if not as it should,
// note otherwise.
type hungResult struct {
	note string
	err  error
}

// settle waits until every partition answers a write through the
// routers (at most a minute), then a little longer for slaves to rejoin.
func (n *Nemesis) settle() {
	n.writable(time.Now().Add(60 * time.Second))
	time.Sleep(n.ttl())
}

// writable waits until every partition has taken a write, or returns an
// error naming the first one that did not by deadline.
func (n *Nemesis) writable(deadline time.Time) error {
	hc := newHTTP(n.c.routerURLs()...)
	hc.hc.Timeout = 3 * time.Second
	for _, key := range partitionKeys(n.c.opts.Partitions, "settle") {
		for {
			r := hc.send("PUT", "/d/U/"+key, `{"v":0}`, "")
			if r.err == nil && r.status < 300 {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the partition of key %s took no write (last: %d %s %v)", key, r.status, r.body, r.err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

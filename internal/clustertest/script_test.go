package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cortado-db/cortado/client"
	"github.com/cortado-db/cortado/internal/controller"
	"github.com/cortado-db/cortado/internal/relay"
)

// TestClusterScript runs `scripts/cluster up`, writes and reads through
// both routers, checks `cortado cluster status --json`, the consistency
// check and that the relay pulled the write, and `down`.
func TestClusterScript(t *testing.T) {
	bin := Binary(t)
	script := filepath.Join("..", "..", "scripts", "cluster")
	var env []string
	run := func(name string, args ...string) ([]byte, error) {
		cmd := exec.Command(name, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			return out, fmt.Errorf("%s %v: %v\n%s", name, args, err, out)
		}
		return out, nil
	}
	must := func(name string, args ...string) []byte {
		t.Helper()
		out, err := run(name, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	// The script takes a range of 33 fixed ports: pick one below the
	// kernel's ephemeral range, and another if a port there is taken.
	var base int
	for attempt := 1; ; attempt++ {
		base = 20000 + rand.IntN(12000)
		dir := t.TempDir()
		env = append(os.Environ(), "CORTADO_BIN="+bin, "CLUSTER_DIR="+dir, "CLUSTER_PORT="+strconv.Itoa(base), "LEASE_TTL=2")
		_, err := run(script, "up")
		if err == nil {
			break
		}
		run(script, "down")
		if !strings.Contains(err.Error(), "address already in use") || attempt == 5 {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { must(script, "down") })
	r1 := "http://127.0.0.1:" + strconv.Itoa(base+31)
	r2 := "http://127.0.0.1:" + strconv.Itoa(base+32)
	must(bin, "put", "--url", r1, "-d", `{"total":3,"unread":1}`, "demo/MailboxStats/alice")
	if out := must(bin, "get", "--url", r2, "demo/MailboxStats/alice"); !json.Valid(out) || !strings.Contains(string(out), `"total": 3`) {
		t.Fatalf("read through the second router: %s", out)
	}
	var st controller.Status
	if err := json.Unmarshal(must(bin, "cluster", "status", "--json", "--url", r1), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Nodes) != 3 || st.Controller == "" || len(st.Databases) != 1 || len(st.Databases[0].Partitions) != 16 {
		t.Fatalf("status: %+v", st)
	}
	for _, n := range st.Nodes {
		if !n.Live || n.Masters == 0 || n.Slaves == 0 || n.Rack == "" {
			t.Fatalf("node %+v", n)
		}
	}
	// Every other process is listed with its build: the two controllers
	// (the leader among them), the relay and the two routers, with
	// their URLs.
	v, _ := versionOf(t, bin)
	var roles, urls []string
	for _, p := range st.Processes {
		roles, urls = append(roles, p.Role+" "+p.ID), append(urls, p.URL)
		if p.Build != v.build || p.Protocol != v.maxProtocol {
			t.Fatalf("process %+v, want build %s, protocol %d", p, v.build, v.maxProtocol)
		}
	}
	relayURL := "http://127.0.0.1:" + strconv.Itoa(base+5)
	if len(roles) != 5 || roles[0] != "controller c1" || roles[1] != "controller c2" || roles[2] != "relay relay1" ||
		!strings.HasPrefix(roles[3], "router ") || !strings.HasPrefix(roles[4], "router ") || !slices.Contains(roles, "controller "+st.Controller) ||
		urls[0] != "" || urls[1] != "" || urls[2] != relayURL || !slices.Contains(urls, r1) || !slices.Contains(urls, r2) {
		t.Fatalf("processes %q at %q, leader %s", roles, urls, st.Controller)
	}
	if out := string(must(bin, "cluster", "status", "--url", r1)); !strings.Contains(out, "controller (leader)") || !strings.Contains(out, "relay1") {
		t.Fatalf("cluster status lists no leading controller, or no relay:\n%s", out)
	}
	must(bin, "cluster", "check", "--url", r1)
	if served := metric(t, "http://127.0.0.1:"+strconv.Itoa(base+5), "cortado_relay_pulled_commits_total"); served == 0 {
		t.Fatal("the relay pulled nothing")
	}
}

// TestServeNodes runs `cortado serve --nodes 3 --demo`: three replicated
// storage nodes, a relay, a controller and a router in one process.
func TestServeNodes(t *testing.T) {
	s := StartServe(t, ServeOptions{Args: []string{"--nodes", "3", "--demo", "--lease-ttl", "2"}})
	req, _ := http.NewRequest("PUT", s.URL+"/demo/MailboxStats/alice", strings.NewReader(`{"total":2,"unread":1}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 201 {
		t.Fatalf("put: %v %v", resp, err)
	}
	resp.Body.Close()
	resp, err = http.Get(s.URL + "/_cluster")
	if err != nil {
		t.Fatal(err)
	}
	var st controller.Status
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || len(st.Nodes) != 3 || len(st.Databases) != 1 {
		t.Fatalf("status: %+v %v", st, err)
	}
	if d := st.Databases[0]; d.Replicas != 3 || d.MinInSync != 2 || d.FailoverInSync != 0 {
		t.Fatalf("status of the demo database: replicas %d, minInSync %d, failoverInSync %d; want 3, 2, 0", d.Replicas, d.MinInSync, d.FailoverInSync)
	}
	for _, p := range st.Databases[0].Partitions {
		if len(p.Replicas) != 3 || p.Replicas[0].Role != "MASTER" {
			t.Fatalf("partition %d: %+v", p.Partition, p.Replicas)
		}
	}
	await(t, 10*time.Second, "the relay to pull the write", func() bool {
		return metric(t, s.URL, "cortado_relay_pulled_commits_total") > 0
	})
	// The operators' page shows the nodes, each partition's master and
	// slaves, and what this process measured (the lag once a slave
	// applied the write).
	var page []byte
	await(t, 10*time.Second, "the operators' page to show the replication lag", func() bool {
		resp, err := http.Get(s.URL + "/_admin")
		if err != nil {
			t.Fatal(err)
		}
		page, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/html; charset=utf-8" {
			t.Fatalf("/_admin: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		return strings.Contains(string(page), "replication lag, commit → a slave")
	})
	for _, want := range []string{"<td>node0</td><td>yes</td>", "<h2>Database demo</h2>", "<h2>Other processes</h2>", "<td>relay</td><td>relay</td>", "<td>" + st.Databases[0].Partitions[0].Replicas[0].Node + " </td>"} {
		if !strings.Contains(string(page), want) {
			t.Fatalf("/_admin lacks %q:\n%s", want, page)
		}
	}
	if b := metric(t, s.URL, "cortado_relay_buffer_bytes"); b <= 0 || b > relay.DefaultBufferBytes {
		t.Fatalf("the relay's buffers hold %v bytes after a write", b)
	}

	// The change stream, which this process's router reads from its own
	// relay without the wire, carries every acknowledged write once, in
	// commit order within each partition.
	const n = 60
	want := map[string]bool{"alice": true}
	for i := range n {
		key := fmt.Sprintf("k%d", i)
		req, _ := http.NewRequest("PUT", s.URL+"/demo/MailboxStats/"+key, strings.NewReader(`{"total":1}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 201 {
			t.Fatalf("put %s: %v %v", key, resp, err)
		}
		resp.Body.Close()
		want[key] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seen := map[string]int{}
	last := map[int][2]uint64{}
	for e, err := range client.New(s.URL).Changes(ctx, "demo", &client.ChangeOptions{Tables: []string{"MailboxStats"}, Since: "beginning"}) {
		if err != nil {
			t.Fatalf("change stream after %d of %d keys: %v", len(seen), len(want), err)
		}
		if e.Type != "change" {
			continue
		}
		at := [2]uint64{uint64(e.Source.Generation), e.Source.Sequence}
		if prev, ok := last[e.Source.Partition]; ok && (at[0] < prev[0] || at[0] == prev[0] && at[1] <= prev[1]) {
			t.Fatalf("partition %d: %v after %v", e.Source.Partition, at, prev)
		}
		last[e.Source.Partition] = at
		key := fmt.Sprint(e.Source.Key...)
		if !want[key] || e.Op != "c" {
			t.Fatalf("unexpected event %s", e.Raw)
		}
		if seen[key]++; seen[key] > 1 {
			t.Fatalf("%s seen twice", key)
		}
		if len(seen) == len(want) {
			break
		}
	}

	// Both lags are measured: the slaves' from each commit's timestamp,
	// the masters' from each commit's fsync to a replica's
	// acknowledgement (every write here was acknowledged by a slave).
	await(t, 10*time.Second, "the lags of the writes", func() bool {
		return metric(t, s.URL, "cortado_replication_lag_seconds_count") >= n && metric(t, s.URL, "cortado_replication_ack_lag_seconds_count") >= n
	})
	if sum := metric(t, s.URL, "cortado_replication_ack_lag_seconds_sum"); sum <= 0 || sum > n*5 {
		t.Fatalf("acknowledgement lags sum to %v s over at least %d commits", sum, n)
	}

	// The slaves, which read the relay and acknowledge to their masters
	// without the wire here, hold what the masters hold.
	if out, err := exec.Command(Binary(t), "cluster", "check", "--url", s.URL).CombinedOutput(); err != nil {
		t.Fatalf("cluster check: %v\n%s", err, out)
	}
	// A check of a database that does not exist fails: it does not pass
	// having checked nothing. A parameter it does not take is refused,
	// not read as "every database".
	if out, err := exec.Command(Binary(t), "cluster", "check", "--url", s.URL, "--db", "nosuch").CombinedOutput(); err == nil || !strings.Contains(string(out), "404") {
		t.Fatalf("cluster check --db nosuch: %v\n%s", err, out)
	}
	if resp, err := http.Post(s.URL+"/_cluster/check?database=demo", "", nil); err != nil || resp.StatusCode != 400 {
		t.Fatalf("a check with ?database=: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	// Each node's engine is in the metrics, and each has written the
	// commits it holds.
	resp, err = http.Get(s.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wrote := map[string]bool{}
	for line := range strings.Lines(string(body)) {
		if rest, ok := strings.CutPrefix(line, `cortado_pebble_wal_bytes_written_total{node="`); ok {
			node, value, _ := strings.Cut(rest, `"} `)
			if v, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil && v > 0 {
				wrote[node] = true
			}
		}
	}
	if len(wrote) != 3 || !strings.Contains(string(body), "cortado_pebble_block_cache_bytes{node=") {
		t.Fatalf("metrics: the engines of %v wrote to their WAL, want three nodes, and each with its block cache:\n%s", wrote, body)
	}

	// A clean stop under write load: handlers (replication long-polls,
	// writes waiting for acknowledgement) finish before the engines
	// close, so the process exits 0 without a panic.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var acked atomic.Int64
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest("PUT", fmt.Sprintf("%s/demo/MailboxStats/w%d-%d", s.URL, w, i), strings.NewReader(`{"total":1}`))
				req.Header.Set("Content-Type", "application/json")
				if resp, err := http.DefaultClient.Do(req); err == nil {
					if resp.StatusCode < 300 {
						acked.Add(1)
					}
					resp.Body.Close()
				}
			}
		})
	}
	await(t, 10*time.Second, "writes under way", func() bool { return acked.Load() > 20 })
	s.Stop()
	close(stop)
	wg.Wait()
	if code := s.cmd.ProcessState.ExitCode(); code != 0 || strings.Contains(s.Log(), "panic") {
		t.Fatalf("stop under load: exit %d\n%s", code, s.Log())
	}
}

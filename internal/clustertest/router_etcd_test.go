package clustertest

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/coord"
	"github.com/cortado-db/cortado/internal/coord/coordtest"
)

// TestRouterCutOffFromEtcd: a router whose connections to etcd hang (a
// network partition, toxiproxy holding both ways) says so on /healthz —
// 503 "stale", since the routing tables it routes by may be out of date
// — once its registration lapses, and "ok" again once etcd answers.
func TestRouterCutOffFromEtcd(t *testing.T) {
	etcd := coordtest.Embedded(t)
	link := NewLink(t, "etcd", strings.TrimPrefix(etcd.Endpoint, "http://"))
	r := StartRole(t, "router", "--etcd-endpoints", "http://"+link.Listen)
	health := func() (int, string) {
		resp, err := http.Get(r.URL + "/healthz")
		if err != nil {
			return 0, err.Error()
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	if st, b := health(); st != 200 {
		t.Fatalf("healthz of a router that reaches etcd: %d %s", st, b)
	}
	if err := Cut(link); err != nil {
		t.Fatal(err)
	}
	var last string
	await(t, 30*time.Second, "the cut-off router's healthz to say stale", func() bool {
		st, b := health()
		last = b
		return st == 503 && strings.Contains(b, `"status":"stale"`)
	})
	t.Logf("cut off: %s", last)
	if err := Mend(link); err != nil {
		t.Fatal(err)
	}
	await(t, 30*time.Second, "the router's healthz to say ok once etcd answers", func() bool {
		st, b := health()
		return st == 200 && strings.Contains(b, `"status":"ok"`)
	})
}

// TestStaleRouterFollowsTheMaster: a router cut off from etcd routes by
// its last routing table. Its partition's master is killed -9 and
// replaced. While the old master is down, the router's requests to it are
// not delivered: with its registration lapsed it tries the table's
// slaves, and the new master among them does them. Once the old master is
// back as a slave of the new one, it refuses them naming the new master,
// and the router sends them there. Writes and fresh reads succeed
// throughout, though the router never hears of the new table (before,
// they failed for as long as the cut lasted).
func TestStaleRouterFollowsTheMaster(t *testing.T) {
	// Fixed ports: the old master comes back where the router knew it.
	extra := map[string][]string{}
	for _, id := range []string{"s0", "s1", "s2"} {
		u, err := coord.FreeLoopbackURL()
		if err != nil {
			t.Fatal(err)
		}
		extra[id] = []string{"--listen", strings.TrimPrefix(u, "http://")}
	}
	c := startProcClusterWith(t, 3, 1, extra)
	link := NewLink(t, "etcd-router2", strings.TrimPrefix(c.etcd, "http://"))
	r2 := StartRole(t, "router", "--etcd-endpoints", "http://"+link.Listen)
	acked := map[string]string{}
	var last string
	put := func(k, v string) bool {
		st, body := putVia(r2.URL, k, v, "")
		last = fmt.Sprintf("%d %s", st, body)
		if st/100 == 2 {
			acked[k] = v
			return true
		}
		return false
	}
	get := func(k, want string) {
		t.Helper()
		resp, err := http.Get(r2.URL + "/d/T/" + k)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"`+want+`"`) {
			t.Fatalf("a fresh read of %s through the router cut off from etcd: %d %s", k, resp.StatusCode, b)
		}
	}
	logged := ""
	awaitPut := func(what, k, v string) {
		t.Helper()
		await(t, 30*time.Second, what, func() bool {
			if put(k, v) {
				return true
			}
			if last != logged {
				t.Log(last)
				logged = last
			}
			return false
		})
	}
	awaitPut("a write through the second router", "before", "1")
	if err := Cut(link); err != nil {
		t.Fatal(err)
	}
	old := c.table().Partitions[0].Replicas[0]
	c.storage[old].Kill()
	c.awaitMastersOff(old)
	awaitPut("a write through the router cut off from etcd, the old master down", "down", "2")
	get("down", "2")
	redirects := func(to string) float64 { return metric(t, r2.URL, `cortado_router_redirects_total{to="`+to+`"}`) }
	if n := redirects("slaves"); n == 0 {
		t.Fatal("requests went to the slaves, but the router counts none")
	}
	c.storage[old].Restart()
	// Once the old master follows the new one, and the router reaches it
	// again (until then requests still go to the slaves), it names it.
	await(t, 30*time.Second, "a write through the router cut off from etcd sent where the old master, now a slave, says", func() bool {
		return put("back", "3") && redirects("named") > 0
	})
	get("back", "3")
	if err := Mend(link); err != nil {
		t.Fatal(err)
	}
	c.verify(acked)
}

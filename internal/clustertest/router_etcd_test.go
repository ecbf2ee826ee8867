package clustertest

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestRouterCutOffFromEtcd: a router whose connections to etcd hang (a
// network partition, toxiproxy holding both ways) says so on /healthz —
// 503 "stale", since the routing tables it routes by may be out of date
// — once its registration lapses, and "ok" again once etcd answers.
func TestRouterCutOffFromEtcd(t *testing.T) {
	etcd := startEtcd(t)
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

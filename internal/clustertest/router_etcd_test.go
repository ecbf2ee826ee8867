package clustertest

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// TestRouterCutOffFromEtcd: a router whose connections to etcd hang (a
// network partition, toxiproxy holding both ways) says so on /healthz —
// 503 "stale", since the routing tables it routes by may be out of date
// — once its registration lapses, and "ok" again once etcd answers.
func TestRouterCutOffFromEtcd(t *testing.T) {
	etcd := startEtcd(t)
	tp := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	link := toxiproxy.NewProxy(tp, "etcd", "127.0.0.1:0", strings.TrimPrefix(etcd.Endpoint, "http://"))
	if err := link.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(link.Stop)
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
	for _, stream := range []string{"upstream", "downstream"} {
		toxic := `{"name":"cut-` + stream + `","type":"timeout","stream":"` + stream + `","attributes":{"timeout":0}}`
		if _, err := link.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
			t.Fatal(err)
		}
	}
	var last string
	await(t, 30*time.Second, "the cut-off router's healthz to say stale", func() bool {
		st, b := health()
		last = b
		return st == 503 && strings.Contains(b, `"status":"stale"`)
	})
	t.Logf("cut off: %s", last)
	for _, stream := range []string{"upstream", "downstream"} {
		if err := link.Toxics.RemoveToxic(context.Background(), "cut-"+stream); err != nil {
			t.Fatal(err)
		}
	}
	await(t, 30*time.Second, "the router's healthz to say ok once etcd answers", func() bool {
		st, b := health()
		return st == 200 && strings.Contains(b, `"status":"ok"`)
	})
}

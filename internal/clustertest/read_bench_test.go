package clustertest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cortado-db/cortado/internal/bench"
)

// BenchmarkGetDocument is a single-node document read through the whole
// HTTP handler (admission, metrics, router, node, Pebble) without the
// network: 1,000 documents of 1 KB, read as JSON and as Avro. Its
// allocations per read are what the read path costs the collector.
//
//	go test ./internal/clustertest -run '^$' -bench GetDocument -benchmem
func BenchmarkGetDocument(b *testing.B) {
	const keys = 1000
	h := loadedHandler(b, keys)
	for _, f := range []struct{ name, accept string }{{"json", "application/json"}, {"avro", "avro/binary; version=1"}} {
		b.Run(f.name, func(b *testing.B) {
			reqs := make([]*http.Request, keys)
			for i := range reqs {
				reqs[i] = httptest.NewRequest("GET", fmt.Sprintf("/bench/Doc/%d", i), nil)
				reqs[i].Header.Set("Accept", f.accept)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, reqs[i%keys])
				if w.Code != http.StatusOK {
					b.Fatalf("GET: %d %s", w.Code, w.Body)
				}
				i++
			}
		})
	}
}

// BenchmarkMultiGet reads 10 random documents of 1,000 (1 KB each) per
// multi-get through the whole handler, as a page and as a stream.
func BenchmarkMultiGet(b *testing.B) {
	const keys = 1000
	h := loadedHandler(b, keys)
	for _, f := range []struct{ name, accept string }{{"page", "application/json"}, {"stream", "application/x-ndjson"}} {
		b.Run(f.name, func(b *testing.B) {
			reqs := make([]*http.Request, 100)
			for i := range reqs {
				ids := make([]string, 10)
				for j := range ids {
					ids[j] = fmt.Sprint((i*37 + j*101) % keys)
				}
				reqs[i] = httptest.NewRequest("GET", "/bench/Doc/("+strings.Join(ids, ",")+")", nil)
				reqs[i].Header.Set("Accept", f.accept)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, reqs[i%len(reqs)])
				if w.Code != http.StatusOK {
					b.Fatalf("multi-get: %d %s", w.Code, w.Body)
				}
				i++
			}
		})
	}
}

// BenchmarkPutDocument replaces documents of 1 KB through the whole
// handler, fsync included.
func BenchmarkPutDocument(b *testing.B) {
	const keys = 1000
	h := loadedHandler(b, keys)
	body := `{"n":1,"payload":"` + strings.Repeat("x", 1024) + `"}`
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		req := httptest.NewRequest("PUT", fmt.Sprintf("/bench/Doc/%d", i%keys), strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusNoContent {
			b.Fatalf("PUT: %d %s", w.Code, w.Body)
		}
		i++
	}
}

// loadedHandler is the whole handler of a server in this process, with
// keys documents of 1 KB in table bench.Doc.
func loadedHandler(b *testing.B, keys int) http.Handler {
	s := openServer(b)
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	if err := bench.Load(context.Background(), bench.Options{URL: ts.URL, Keys: keys, Replicas: 1}, io.Discard); err != nil {
		b.Fatal(err)
	}
	return s.Handler()
}

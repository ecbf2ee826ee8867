package metrics

import (
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
)

// counts gathers a family's series: labels "method code" → count (a
// histogram's sample count).
func counts(t *testing.T, m *Metrics, family string) map[string]float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != family {
			continue
		}
		for _, s := range f.GetMetric() {
			var method, code string
			for _, l := range s.GetLabel() {
				switch l.GetName() {
				case "method":
					method = l.GetValue()
				case "code":
					code = l.GetValue()
				}
			}
			if s.Counter != nil {
				out[method+" "+code] = s.Counter.GetValue()
			} else {
				out[method+" "+code] = float64(s.Histogram.GetSampleCount())
			}
		}
	}
	return out
}

// TestInstrumentBoundsSeries: requests are counted by route, method and
// code; methods HTTP does not define share one "other" series, so a
// client cannot add series without bound.
func TestInstrumentBoundsSeries(t *testing.T) {
	m := New()
	h := m.Instrument(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.WriteHeader(http.StatusMethodNotAllowed)
		}
	}), func(*http.Request) string { return "document" })
	serve := func(method string) {
		req := httptest.NewRequest(http.MethodGet, "/db/t/k", nil)
		req.Method = method
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	for range 3 {
		serve(http.MethodGet)
	}
	for i := range 50 {
		serve("MADEUP" + strings.Repeat("X", i))
	}
	want := map[string]float64{"GET 200": 3, "other 405": 50}
	for _, family := range []string{"cortado_requests_total", "cortado_request_duration_seconds"} {
		got := counts(t, m, family)
		if len(got) != len(want) || got["GET 200"] != 3 || got["other 405"] != 50 {
			t.Errorf("%s: %v, want %v", family, got, want)
		}
	}
}

// TestLiveHeap: the heap the last collection found live is exported, and
// holds what is live.
func TestLiveHeap(t *testing.T) {
	m := New()
	ballast := make([]byte, 64<<20)
	runtime.GC()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var live float64
	for _, f := range fams {
		if f.GetName() == "go_gc_heap_live_bytes" {
			live = f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	runtime.KeepAlive(ballast)
	if live < 64<<20 {
		t.Fatalf("go_gc_heap_live_bytes %v with 64 MiB live", live)
	}
}

// Package metrics owns Cortado's Prometheus instrumentation: the registry
// served on /metrics, the per-route request counters and latency
// histograms, and the collector that exports Pebble's own statistics. It
// never changes a response.
package metrics

import (
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cortado-db/cortado/internal/release"
)

// Metrics is one process's metric registry.
type Metrics struct {
	Registry *prometheus.Registry
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec

	admMu     sync.Mutex
	admission *admissionCollector
	pebble    *pebbleCollector // under admMu

	// series caches each (route, method, code)'s counter and histogram:
	// looking them up by labels cost a map and a hash per request.
	series sync.Map // seriesKey → *series
}

type seriesKey struct {
	route, method string
	code          int
}

type series struct {
	requests prometheus.Counter
	latency  prometheus.Observer
}

// New returns a registry with Go runtime and process collectors.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	// Besides the defaults, the heap the last collection found live
	// (go_gc_heap_live_bytes): go_memstats_heap_inuse_bytes counts
	// garbage not yet collected too, up to the live heap's size again.
	live := collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)}
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(live)), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := &Metrics{
		Registry: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cortado_requests_total",
			Help: "Requests served by the router, by route, method and status code.",
		}, []string{"route", "method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cortado_request_duration_seconds",
			Help:    "Request latency at the router, by route, method and status code.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"route", "method", "code"}),
	}
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "cortado_build_info",
		Help:        "Always 1; its labels say which binary the process runs: the commit it was built from (build) and the Go release (goversion).",
		ConstLabels: prometheus.Labels{"build": release.Get().Revision, "goversion": release.Get().Go},
	})
	build.Set(1)
	reg.MustRegister(m.requests, m.latency, build)
	return m
}

// Handler serves /metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// Instrument wraps h, counting and timing each request under the route
// that routeOf names.
func (m *Metrics) Instrument(h http.Handler, routeOf func(*http.Request) string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(sw, req)
		s := m.seriesOf(seriesKey{routeOf(req), methodLabel(req.Method), sw.code})
		s.requests.Inc()
		s.latency.Observe(time.Since(start).Seconds())
	})
}

func (m *Metrics) seriesOf(k seriesKey) *series {
	if s, ok := m.series.Load(k); ok {
		return s.(*series)
	}
	code := strconv.Itoa(k.code)
	s, _ := m.series.LoadOrStore(k, &series{
		requests: m.requests.WithLabelValues(k.route, k.method, code),
		latency:  m.latency.WithLabelValues(k.route, k.method, code),
	})
	return s.(*series)
}

// methodLabel is the method's label: the methods HTTP defines, else
// "other" (a client's made-up method must not add series without bound).
func methodLabel(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return m
	}
	return "other"
}

type statusWriter struct {
	http.ResponseWriter
	code  int
	wrote bool
}

// Unwrap lets http.ResponseController reach the connection (read
// deadlines for request bodies, flushing).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.code, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Engine is a storage node's engine as metrics sees it: Pebble's
// statistics and its row cache's.
type Engine interface {
	Metrics() *pebble.Metrics
	RowCache() (bytes, hits, misses uint64)
	// ReadFlushes is how many memtable flushes reads asked for.
	ReadFlushes() int64
}

// RegisterPebble exports the statistics of a storage node's engine,
// labelled with the node's id (one process of `serve --nodes N` holds
// N).
func (m *Metrics) RegisterPebble(node string, e Engine) {
	m.admMu.Lock()
	defer m.admMu.Unlock()
	if m.pebble == nil {
		m.pebble = &pebbleCollector{}
		m.Registry.MustRegister(m.pebble)
	}
	m.pebble.mu.Lock()
	m.pebble.engines = append(m.pebble.engines, pebbleEngine{node, e})
	m.pebble.mu.Unlock()
}

func pebbleDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, []string{"node"}, nil)
}

var (
	descDiskBytes  = pebbleDesc("cortado_pebble_disk_usage_bytes", "Bytes Pebble uses on disk.")
	descL0Files    = pebbleDesc("cortado_pebble_l0_files", "Files in Pebble's level 0 (read amplification pressure).")
	descReadAmp    = pebbleDesc("cortado_pebble_read_amplification", "Pebble's read amplification.")
	descCompaction = pebbleDesc("cortado_pebble_compactions_total", "Compactions Pebble has run.")
	descMemtable   = pebbleDesc("cortado_pebble_memtable_bytes", "Bytes in Pebble's memtables.")
	descZombie     = pebbleDesc("cortado_pebble_memtable_zombie_bytes", "Bytes of Pebble's memtables no longer in use: read by iterators, or kept for reuse.")
	descCacheBytes = pebbleDesc("cortado_pebble_block_cache_bytes", "Bytes in Pebble's block cache (on the Go heap: the binary is built without cgo).")
	descCacheHits  = pebbleDesc("cortado_pebble_block_cache_hits_total", "Pebble block cache hits.")
	descCacheMiss  = pebbleDesc("cortado_pebble_block_cache_misses_total", "Pebble block cache misses.")
	descWALBytes   = pebbleDesc("cortado_pebble_wal_bytes_written_total", "Bytes written to Pebble's WAL.")
	descFlushes    = pebbleDesc("cortado_pebble_flushes_total", "Memtable flushes Pebble has run.")
	descReadFlush  = pebbleDesc("cortado_pebble_read_flushes_total", "Memtable flushes started because a read stepped over many values it could not see (older values of keys rewritten many times).")
	descRowBytes   = pebbleDesc("cortado_row_cache_bytes", "Bytes the row cache holds (documents read by key, in front of Pebble).")
	descRowHits    = pebbleDesc("cortado_row_cache_hits_total", "Reads by key the row cache answered.")
	descRowMisses  = pebbleDesc("cortado_row_cache_misses_total", "Reads by key the row cache did not answer (Pebble did).")
)

type pebbleEngine struct {
	node string
	e    Engine
}

type pebbleCollector struct {
	mu      sync.Mutex
	engines []pebbleEngine
}

func (c *pebbleCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDiskBytes, descL0Files, descReadAmp, descCompaction, descMemtable, descZombie, descCacheBytes, descCacheHits, descCacheMiss, descWALBytes, descFlushes, descReadFlush, descRowBytes, descRowHits, descRowMisses} {
		ch <- d
	}
}

func (c *pebbleCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	engines := c.engines
	c.mu.Unlock()
	for _, e := range engines {
		s := e.e.Metrics()
		rowBytes, rowHits, rowMisses := e.e.RowCache()
		for _, v := range []struct {
			d   *prometheus.Desc
			t   prometheus.ValueType
			val float64
		}{
			{descDiskBytes, prometheus.GaugeValue, float64(s.DiskSpaceUsage())},
			{descL0Files, prometheus.GaugeValue, float64(s.Levels[0].TablesCount)},
			{descReadAmp, prometheus.GaugeValue, float64(s.ReadAmp())},
			{descCompaction, prometheus.CounterValue, float64(s.Compact.Count)},
			{descMemtable, prometheus.GaugeValue, float64(s.MemTable.Size)},
			{descZombie, prometheus.GaugeValue, float64(s.MemTable.ZombieSize)},
			{descCacheBytes, prometheus.GaugeValue, float64(s.BlockCache.Size)},
			{descCacheHits, prometheus.CounterValue, float64(s.BlockCache.Hits)},
			{descCacheMiss, prometheus.CounterValue, float64(s.BlockCache.Misses)},
			{descWALBytes, prometheus.CounterValue, float64(s.WAL.BytesWritten)},
			{descFlushes, prometheus.CounterValue, float64(s.Flush.Count)},
			{descReadFlush, prometheus.CounterValue, float64(e.e.ReadFlushes())},
			{descRowBytes, prometheus.GaugeValue, float64(rowBytes)},
			{descRowHits, prometheus.CounterValue, float64(rowHits)},
			{descRowMisses, prometheus.CounterValue, float64(rowMisses)},
		} {
			ch <- prometheus.MustNewConstMetric(v.d, v.t, v.val, e.node)
		}
	}
}

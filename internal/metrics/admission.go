package metrics

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cortado-db/cortado/internal/admission"
)

var (
	descInFlight = prometheus.NewDesc("cortado_admission_in_flight", "Requests in progress, by edge (http: the document API; rpc: a storage node's internal API).", []string{"edge"}, nil)
	descLimit    = prometheus.NewDesc("cortado_admission_limit", "Requests that may be in progress now, by edge (a storage node's follows latency).", []string{"edge"}, nil)
	descParked   = prometheus.NewDesc("cortado_admission_parked", "Requests in progress that gave their slot back while they wait on other processes (a storage node's semi-sync writes and fresh reads waiting for replicas), by edge.", []string{"edge"}, nil)
	descQueued   = prometheus.NewDesc("cortado_admission_queued", "Requests waiting for a slot, by edge.", []string{"edge"}, nil)
	descQueueCap = prometheus.NewDesc("cortado_admission_queue_limit", "Requests that may wait for a slot now, by edge (sized from the most completed in one second of the last ten, unless fixed).", []string{"edge"}, nil)
	descQueueAge = prometheus.NewDesc("cortado_admission_queue_age_seconds", "How long the queue has not been empty, by edge (0: empty). Past the queue timeout (--queue-timeout) the queue stands: the edge is past its capacity, requests wait at most --standing-timeout, the newest first.", []string{"edge"}, nil)
	descAdmitted = prometheus.NewDesc("cortado_admission_admitted_total", "Requests admitted, by edge and priority class.", []string{"edge", "class"}, nil)
	descRejected = prometheus.NewDesc("cortado_admission_rejected_total", "Requests refused as overloaded (503 overloaded), by edge and priority class.", []string{"edge", "class"}, nil)
	descExpired  = prometheus.NewDesc("cortado_admission_expired_total", "Internal calls dropped because their deadline had passed before they started.", []string{"edge"}, nil)
)

// RegisterAdmission exports a limiter's state under edge; expired, if
// set, counts calls dropped for their deadline. One collector serves
// every limiter of the process (a serve process has one per storage node).
func (m *Metrics) RegisterAdmission(edge string, l *admission.Limiter, expired *atomic.Uint64) {
	m.admMu.Lock()
	defer m.admMu.Unlock()
	if m.admission == nil {
		m.admission = &admissionCollector{}
		m.Registry.MustRegister(m.admission)
	}
	m.admission.add(admissionSource{edge: edge, l: l, expired: expired})
}

type admissionSource struct {
	edge    string
	l       *admission.Limiter
	expired *atomic.Uint64
}

type admissionCollector struct {
	mu      sync.Mutex
	sources []admissionSource
}

func (c *admissionCollector) add(s admissionSource) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sources = append(c.sources, s)
}

func (c *admissionCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInFlight, descParked, descLimit, descQueued, descQueueCap, descQueueAge, descAdmitted, descRejected, descExpired} {
		ch <- d
	}
}

func (c *admissionCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	sources := append([]admissionSource(nil), c.sources...)
	c.mu.Unlock()
	for _, src := range sources {
		s := src.l.Stats()
		ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(s.InFlight), src.edge)
		ch <- prometheus.MustNewConstMetric(descParked, prometheus.GaugeValue, float64(s.Parked), src.edge)
		ch <- prometheus.MustNewConstMetric(descQueued, prometheus.GaugeValue, float64(s.Queued), src.edge)
		ch <- prometheus.MustNewConstMetric(descLimit, prometheus.GaugeValue, float64(s.Limit), src.edge)
		ch <- prometheus.MustNewConstMetric(descQueueCap, prometheus.GaugeValue, float64(s.QueueLimit), src.edge)
		ch <- prometheus.MustNewConstMetric(descQueueAge, prometheus.GaugeValue, s.QueueAge.Seconds(), src.edge)
		for class, n := range s.Admitted {
			ch <- prometheus.MustNewConstMetric(descAdmitted, prometheus.CounterValue, float64(n), src.edge, class)
		}
		for class, n := range s.Rejected {
			ch <- prometheus.MustNewConstMetric(descRejected, prometheus.CounterValue, float64(n), src.edge, class)
		}
		if src.expired != nil {
			ch <- prometheus.MustNewConstMetric(descExpired, prometheus.CounterValue, float64(src.expired.Load()), src.edge)
		}
	}
}

var descFanOut = prometheus.NewDesc("cortado_fanout_reads_total", "Reads of several partitions (multi-gets, queries without a partition key) by quality of service: full (every partition answered), partial (some did; Prefer: partial-ok), failed.", []string{"qos"}, nil)

// RegisterFanOut exports a router's multi-partition reads by quality of
// service.
func (m *Metrics) RegisterFanOut(stats func() (full, partial, failed uint64)) {
	m.Registry.MustRegister(fanOutCollector(stats))
}

type fanOutCollector func() (full, partial, failed uint64)

func (c fanOutCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descFanOut }

func (c fanOutCollector) Collect(ch chan<- prometheus.Metric) {
	full, partial, failed := c()
	ch <- prometheus.MustNewConstMetric(descFanOut, prometheus.CounterValue, float64(full), "full")
	ch <- prometheus.MustNewConstMetric(descFanOut, prometheus.CounterValue, float64(partial), "partial")
	ch <- prometheus.MustNewConstMetric(descFanOut, prometheus.CounterValue, float64(failed), "failed")
}

// RegisterRedirects exports a router's requests sent elsewhere than its
// routing table's master (routing.RoutingView.RedirectStats).
func (m *Metrics) RegisterRedirects(stats func() (named, slaves uint64)) {
	m.registerPair("cortado_router_redirects_total", "Requests a router sent elsewhere than its routing table's master: to the master a slave named (its table was older), or to the table's slaves (the master was unreachable while the router was cut off from etcd).",
		"to", "named", "slaves", stats)
}

// RegisterChangeRelayLeft exports a router's change-stream reads that
// left a relay (routing.ChangeSources.RelayLeftStats).
func (m *Metrics) RegisterChangeRelayLeft(stats func() (behind, failed uint64)) {
	m.registerPair("cortado_changes_relay_left_total", "Times a router's change stream stopped reading a partition through a relay and read its master for 5 s, by reason: behind (the relay fell silent while the master moved on), failed (its read failed, or stayed silent 5 s).",
		"reason", "behind", "failed", stats)
}

// registerPair exports the two counters stats returns as one metric,
// told apart by label: first's value, then second's.
func (m *Metrics) registerPair(name, help, label, first, second string, stats func() (uint64, uint64)) {
	counter := func(value string, pick func(a, b uint64) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: prometheus.Labels{label: value}},
			func() float64 { return float64(pick(stats())) })
	}
	m.Registry.MustRegister(
		counter(first, func(a, _ uint64) uint64 { return a }),
		counter(second, func(_, b uint64) uint64 { return b }),
	)
}

var descHedges = prometheus.NewDesc("cortado_hedged_reads_total", "Hedged reads (reads that accept a slave's answer, sent to a slave too when the master is slow): sent, won (the slave answered first), denied (the destination's per-host budget was spent).", []string{"result"}, nil)

// RegisterHedges exports a router's hedged reads.
func (m *Metrics) RegisterHedges(stats func() (sent, won, denied uint64)) {
	m.Registry.MustRegister(hedgeCollector(stats))
}

type hedgeCollector func() (sent, won, denied uint64)

func (c hedgeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descHedges }

func (c hedgeCollector) Collect(ch chan<- prometheus.Metric) {
	sent, won, denied := c()
	ch <- prometheus.MustNewConstMetric(descHedges, prometheus.CounterValue, float64(sent), "sent")
	ch <- prometheus.MustNewConstMetric(descHedges, prometheus.CounterValue, float64(won), "won")
	ch <- prometheus.MustNewConstMetric(descHedges, prometheus.CounterValue, float64(denied), "denied")
}

// RegisterConns exports a listener's open connections, those it closed
// as over its bound, and an estimate of those holding a request not read
// yet.
func (m *Metrics) RegisterConns(open, refused, waiting func() int64) {
	m.Registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "cortado_connections_waiting", Help: "Connections on this process's port holding bytes it has not read (an estimate from a sample of them; Linux only, else 0): past capacity, requests the kernel keeps, which no admission limit sees yet."},
			func() float64 { return float64(waiting()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "cortado_connections_open", Help: "Connections open on this process's port."},
			func() float64 { return float64(open()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "cortado_connections_refused_total", Help: "Connections closed at once because the port held its maximum (--max-conns)."},
			func() float64 { return float64(refused()) }))
}

// RegisterStreams exports how many change streams a router serves, and
// how many log answers their readers let go for want of room.
func (m *Metrics) RegisterStreams(open func() int64, letGo func() uint64) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "cortado_change_streams", Help: "Change streams this router serves now (at most --max-streams)."},
		func() float64 { return float64(open()) }))
	m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "cortado_change_stream_answers_let_go_total", Help: "Log answers a router's change-stream readers let go because their stream had no room for the next event (its consumer reads slower than its partitions write); each is asked for again from that event once there is room."},
		func() float64 { return float64(letGo()) }))
}

// RegisterRelayBuffer exports the bytes a relay's buffers hold.
func (m *Metrics) RegisterRelayBuffer(bytes func() int64) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "cortado_relay_buffer_bytes", Help: "Bytes of commits a relay's buffers hold (at most --buffer-bytes)."},
		func() float64 { return float64(bytes()) }))
}

var (
	descRouterCacheReads   = prometheus.NewDesc("cortado_router_cache_reads_total", "Reads that accept staleness (Cache-Control: max-stale) the router's hot-key cache was asked for: hit (it answered), miss (a storage node did), not_kept (the answer was not kept: a write of its key went through this router while it was read).", []string{"result"}, nil)
	descRouterCacheEntries = prometheus.NewDesc("cortado_router_cache_entries", "Documents the router's hot-key cache holds.", nil, nil)
	descRouterCacheBytes   = prometheus.NewDesc("cortado_router_cache_bytes", "Bytes the router's hot-key cache counts for its documents (--router-cache-bytes bounds them).", nil, nil)
)

// RegisterCache exports a router's hot-key cache.
func (m *Metrics) RegisterCache(stats func() (hits, misses, skipped uint64, entries int, bytes uint64)) {
	m.Registry.MustRegister(cacheCollector(stats))
}

type cacheCollector func() (hits, misses, skipped uint64, entries int, bytes uint64)

func (c cacheCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descRouterCacheReads
	ch <- descRouterCacheEntries
	ch <- descRouterCacheBytes
}

func (c cacheCollector) Collect(ch chan<- prometheus.Metric) {
	hits, misses, skipped, entries, bytes := c()
	ch <- prometheus.MustNewConstMetric(descRouterCacheReads, prometheus.CounterValue, float64(hits), "hit")
	ch <- prometheus.MustNewConstMetric(descRouterCacheReads, prometheus.CounterValue, float64(misses), "miss")
	ch <- prometheus.MustNewConstMetric(descRouterCacheReads, prometheus.CounterValue, float64(skipped), "not_kept")
	ch <- prometheus.MustNewConstMetric(descRouterCacheEntries, prometheus.GaugeValue, float64(entries))
	ch <- prometheus.MustNewConstMetric(descRouterCacheBytes, prometheus.GaugeValue, float64(bytes))
}

var (
	descTierReads  = prometheus.NewDesc("cortado_cache_tier_reads_total", "Reads the Redis cache tier was asked for after the hot-key cache: hit (it answered), miss (it held no current entry), too_old (its partition's entries were staler than the read accepts), failed (an error, or slower than --redis-read-timeout), skipped (not asked: the tier was unhealthy).", []string{"result"}, nil)
	descTierWrites = prometheus.NewDesc("cortado_cache_tier_updater_total", "What this process's cache-tier updater did: entries written, snapshot loads (a partition started over in a new epoch), bootstrap passes over a partition.", []string{"what"}, nil)
)

// RegisterTier exports the Redis cache tier's read counts.
func (m *Metrics) RegisterTier(stats func() (hits, misses, tooOld, failed, skipped uint64)) {
	m.Registry.MustRegister(tierCollector(stats))
}

type tierCollector func() (hits, misses, tooOld, failed, skipped uint64)

func (c tierCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descTierReads }

func (c tierCollector) Collect(ch chan<- prometheus.Metric) {
	hits, misses, tooOld, failed, skipped := c()
	for _, v := range []struct {
		n     uint64
		label string
	}{{hits, "hit"}, {misses, "miss"}, {tooOld, "too_old"}, {failed, "failed"}, {skipped, "skipped"}} {
		ch <- prometheus.MustNewConstMetric(descTierReads, prometheus.CounterValue, float64(v.n), v.label)
	}
}

// RegisterTierUpdater exports the cache-tier updater's counts.
func (m *Metrics) RegisterTierUpdater(stats func() (written, loads, passes uint64)) {
	m.Registry.MustRegister(tierUpdaterCollector(stats))
}

type tierUpdaterCollector func() (written, loads, passes uint64)

func (c tierUpdaterCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descTierWrites }

func (c tierUpdaterCollector) Collect(ch chan<- prometheus.Metric) {
	written, loads, passes := c()
	ch <- prometheus.MustNewConstMetric(descTierWrites, prometheus.CounterValue, float64(written), "written")
	ch <- prometheus.MustNewConstMetric(descTierWrites, prometheus.CounterValue, float64(loads), "loads")
	ch <- prometheus.MustNewConstMetric(descTierWrites, prometheus.CounterValue, float64(passes), "passes")
}

package metrics

import "github.com/prometheus/client_golang/prometheus"

// Cluster is the replication and cluster-management instrumentation of a
// process: events a rejoining replica undid, and the consistency check's
// latest results.
type Cluster struct {
	Truncated prometheus.Counter
	// TruncationRefused counts truncations a replica refused because
	// they would have removed acknowledged commits: an alarm.
	TruncationRefused prometheus.Counter
	// Lag is measured on slaves from a commit's timestamp, AckLag on
	// masters from a commit's fsync to a replica's acknowledgement.
	Lag, AckLag prometheus.Histogram
	// RelayPulled and RelayServed count a relay's commits; RelayLeft
	// counts slaves giving up on the relay, by reason.
	RelayPulled, RelayServed prometheus.Counter
	RelayLeft                *prometheus.CounterVec
	// LogTrimmed and LogBytes are commit-log retention, per database;
	// Rebuilt counts replicas rebuilt from a snapshot.
	LogTrimmed *prometheus.CounterVec
	LogBytes   *prometheus.GaugeVec
	Rebuilt    prometheus.Counter
	// CopiesDropped counts copies deleted of partitions a node was no
	// longer a replica of.
	CopiesDropped prometheus.Counter
	// IndexBuildRemaining is, per database and table, how many documents
	// the indexes of the latest schema version still lack on the
	// partitions this process masters (0 once built).
	IndexBuildRemaining *prometheus.GaugeVec
	checks              *prometheus.GaugeVec
	lastCheck           prometheus.Gauge
	divergences         prometheus.Counter
}

// lagBuckets: from 0.1 ms, each 1.25 times the last (to 6 s): fine
// enough to tell 16 ms from 20 and 25.
var lagBuckets = prometheus.ExponentialBuckets(0.0001, 1.25, 50)

// Cluster registers the cluster metrics.
func (m *Metrics) Cluster() *Cluster {
	c := &Cluster{
		Truncated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cortado_replica_truncated_events_total",
			Help: "Events a replica undid when it rejoined a timeline that did not contain them.",
		}),
		TruncationRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cortado_replica_truncation_refused_total",
			Help: "Truncations a replica refused because they would have removed acknowledged commits (an alarm: never expected).",
		}),
		Lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "cortado_replication_lag_seconds",
			Help:    "Time from a master's commit (its timestamp, before the master's own fsync) to a slave applying it.",
			Buckets: lagBuckets,
		}),
		AckLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "cortado_replication_ack_lag_seconds",
			Help:    "On a master: time from its commit becoming durable to a replica acknowledging it durably applied (PostgreSQL's replay lag).",
			Buckets: lagBuckets,
		}),
		RelayPulled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cortado_relay_pulled_commits_total",
			Help: "Commits a relay pulled from masters into its buffers.",
		}),
		RelayServed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cortado_relay_served_commits_total",
			Help: "Commits a relay served from its buffers.",
		}),
		LogTrimmed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cortado_log_trimmed_bytes_total",
			Help: "Commit-log bytes trimmed by retention.",
		}, []string{"db"}),
		LogBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cortado_log_bytes",
			Help: "Bytes the retained commit logs of this process's replicas take, by database (after the latest retention pass).",
		}, []string{"db"}),
		RelayLeft: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cortado_replica_relay_left_total",
			Help: "Times a slave stopped reading its master's log through the relay, by reason: behind (the relay fell silent while the master moved on) or failed (its stream failed or stayed silent); it reads the master for 5 s.",
		}, []string{"reason"}),
		Rebuilt: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cortado_replica_rebuilt_total",
			Help: "Replicas rebuilt from a snapshot of their master because their position was behind its retained log.",
		}),
		CopiesDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cortado_partition_copies_dropped_total",
			Help: "Copies of partitions a storage node was no longer a replica of (their replicas moved), deleted once every replica held all of them.",
		}),
		IndexBuildRemaining: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cortado_index_build_remaining_documents",
			Help: "Documents the indexes of a table's latest schema version still lack on the partitions this process masters (they are being rewritten in that version).",
		}, []string{"db", "table"}),
		checks: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cortado_consistency_check_replicas",
			Help: "Slave replicas by result of the latest consistency check (equal, differs, unsettled, unreachable).",
		}, []string{"result"}),
		lastCheck: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cortado_consistency_check_timestamp_seconds",
			Help: "When the latest consistency check finished.",
		}),
		divergences: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cortado_consistency_divergent_replicas_total",
			Help: "Replicas found to differ from their master at the same SCN, over all checks.",
		}),
	}
	m.Registry.MustRegister(c.Truncated, c.TruncationRefused, c.Lag, c.AckLag, c.RelayPulled, c.RelayServed, c.LogTrimmed, c.LogBytes, c.RelayLeft, c.Rebuilt, c.CopiesDropped, c.IndexBuildRemaining, c.checks, c.lastCheck, c.divergences)
	return c
}

// Checked records one consistency check: how many replicas had each
// result.
func (c *Cluster) Checked(results map[string]int, at float64) {
	c.checks.Reset()
	for r, n := range results {
		c.checks.WithLabelValues(r).Set(float64(n))
	}
	c.divergences.Add(float64(results["differs"]))
	c.lastCheck.Set(at)
}

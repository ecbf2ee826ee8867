package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cortado-db/cortado/internal/admission"
	"github.com/cortado-db/cortado/internal/agent"
	"github.com/cortado-db/cortado/internal/cachetier"
	"github.com/cortado-db/cortado/internal/changes"
	"github.com/cortado-db/cortado/internal/controller"
	"github.com/cortado-db/cortado/internal/coord"
	"github.com/cortado-db/cortado/internal/keycache"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/relay"
	"github.com/cortado-db/cortado/internal/router"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/server"
	"github.com/cortado-db/cortado/internal/storage"
	"github.com/cortado-db/cortado/internal/topo"
	"github.com/cortado-db/cortado/internal/wire"
)

// roleFlags are the flags every server role takes.
type roleFlags struct {
	fs             *flag.FlagSet
	dataDir        *string
	listen         *string
	etcdEndpoints  *string
	etcdClient     *string
	etcdPeer       *string
	maxBody        *int64
	maxResp        *int
	bodyTimeout    *time.Duration
	maxDepth       *int
	logLevel       *string
	readyFile      *string
	adminListen    *string
	demo           *bool
	nodes          *int
	localCalls     *bool
	nodeID         *string
	rack           *string
	drainTimeout   *time.Duration
	advertise      *string
	leaseTTL       *int
	maxTransitions *int
	controllerID   *string
	checkInterval  *time.Duration
	relayBuffer    *int
	relayBytes     *int
	retainEvery    *time.Duration
	snapshotRate   *int64
	writeBytes     *int64
	rowCache       *int64
	diskStall      *time.Duration
	diskMinFree    *int64
	adoptData      *bool
	protocol       *uint
	cpuProfile     *string
	allocProfile   *string
	// What the schema registry takes (registry.Limits).
	maxPartitions, maxTables, maxVersions, maxSchemaText *int
	// Overload protection: the document API's and a storage node's
	// internal API's bounds, request deadlines, hedged reads.
	maxInFlight, maxQueue          *int
	queueTimeout, standingTimeout  *time.Duration
	requestTimeout                 *time.Duration
	nodeMaxInFlight, nodeMaxQueue  *int
	nodeMaxParked                  *int
	hedge, nodeAdaptive, slowNodes *bool
	stallCalls                     *int
	stallAfter                     *time.Duration
	nodeMaxCalls                   *int
	indexBuildRate                 *int
	quotaRate, quotaBurst          *float64
	maxConns, maxStreams           *int
	maxLogStreams                  *int
	cacheBytes                     *int64
	cacheMaxAge                    *time.Duration
	redisURL                       *string
	redisUpdate                    *bool
	redisTTL, redisReadTimeout     *time.Duration
	redisDatabases                 *string
	streamBytes                    *int
	streamBacklogReaders           *int
	idleTimeout, writeTimeout      *time.Duration
	heapFloor                      *int64
	procsPerCPU                    *int
}

func newRoleFlags(name, listen string) *roleFlags {
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	f := &roleFlags{fs: fs,
		listen:        fs.String("listen", listen, "HTTP listen address (port 0 picks a free port)"),
		etcdEndpoints: fs.String("etcd-endpoints", "", "comma-separated etcd endpoints"),
		logLevel:      fs.String("log-level", "info", "debug, info, warn or error"),
		readyFile:     fs.String("ready-file", "", "write the listen address to this file once serving (for scripts and tests)"),
		adminListen:   fs.String("admin-listen", "", "also serve /metrics, /healthz and /_cluster on this address, outside --max-conns and the document API's admission, so monitoring sees an overloaded process (default: only on --listen)"),
		maxDepth:      fs.Int("max-depth", schema.DefaultMaxDepth, "how deeply records, arrays and maps may nest in a document (8 to 1000; every role of a cluster the same)"),
		cpuProfile:    fs.String("cpu-profile", "", "write a CPU profile of the whole run to this file (for `go tool pprof`)"),
		allocProfile:  fs.String("alloc-profile", "", "write, at exit, a profile of the whole run's allocations and of the heap the last collection found live to this file (for `go tool pprof -sample_index=alloc_space`)"),
		maxConns:      fs.Int("max-conns", server.DefaultMaxConns, "connections the port holds open at once; one beyond it is closed at once (-1: no bound)"),
		idleTimeout:   fs.Duration("idle-timeout", server.DefaultIdleTimeout, "close a kept-alive HTTP connection that sends no request for this long"),
		heapFloor:     fs.Int64("heap-floor", server.DefaultHeapFloor, "smallest heap goal, in bytes, the garbage collector aims at (-1: GOGC alone; the GOGC environment variable also leaves it alone)"),
		procsPerCPU:   fs.Int("procs-per-cpu", server.DefaultProcsPerCPU, "Go processors (GOMAXPROCS) per CPU: above 1 lets goroutines run while others wait in file system calls (fsync); 1: as the Go runtime chose (the GOMAXPROCS environment variable also leaves it alone)"),
		protocol:      fs.Uint("protocol-version", uint(wire.Version), fmt.Sprintf("newest internal protocol version spoken (%d to %d): the previous one makes this process talk as the previous release, during a rolling upgrade", wire.MinVersion, wire.Version)),
	}
	if name == "serve" || name == "storage" || name == "relay" {
		f.maxLogStreams = fs.Int("max-log-streams", node.DefaultMaxLogStreams, "commit-log streams and long polls (replicas', relays' and change streams' reads) the internal API serves at once; one beyond it is refused and tried again by its reader (-1: no bound)")
	}
	if name == "serve" || name == "storage" {
		f.dataDir = fs.String("data-dir", server.DefaultDataDir, "directory for storage (and, for serve, the embedded etcd)")
		f.maxTransitions = fs.Int("max-transitions", agent.DefaultMaxTransitions, "partitions changing role at once on a storage node")
		f.retainEvery = fs.Duration("retention-interval", node.DefaultRetentionInterval, "how often commit logs are trimmed by their databases' retention (0 disables)")
		f.indexBuildRate = fs.Int("index-build-rate", node.DefaultIndexBuildRate, "documents a second a storage node rewrites in the latest schema version to build the indexes it adds (-1: never)")
		f.rowCache = fs.Int64("row-cache", storage.DefaultRowCacheBytes, "bytes of documents read by key a storage node keeps in memory in front of Pebble, exact under every write (-1: none)")
		f.diskStall = fs.Duration("disk-stall-timeout", storage.DefaultStallTimeout, "a storage node whose disk has not completed a probe write (a small file written and synced, every second) for this long takes its disk for failed: it fails its writes and leaves the cluster, and its partitions fail over")
		f.adoptData = fs.Bool("adopt-data", false, "open a data directory recorded for another cluster as this cluster's, and record this one: only when it is this cluster's and etcd was rebuilt (a storage node refuses another cluster's directory otherwise)")
		f.diskMinFree = fs.Int64("disk-min-free", storage.DefaultMinFreeBytes, "bytes the data directory's file system must keep free: a storage node whose disk probe finds less takes its disk for full, as when a write fails on it (-1: no floor)")
		f.snapshotRate = fs.Int64("snapshot-rate", node.DefaultSnapshotRate, "bytes per second a partition snapshot streams at, at most (bootstrap of consumers and replicas)")
		f.writeBytes = fs.Int64("write-bytes", node.DefaultWriteBytes, "bytes of documents a storage node's writes carry at once; a write beyond waits (within its deadline) for those before it, one larger goes alone: what a write holds in memory grows with its documents, text-indexed ones most (-1: no bound)")
	}
	if name == "serve" || name == "storage" {
		f.nodeMaxInFlight = fs.Int("node-max-in-flight", admission.DefaultMaxInFlight, "internal calls a storage node serves at once; more wait in its queue (-1: no limit)")
		f.nodeAdaptive = fs.Bool("node-adaptive", true, "let a storage node's limit of calls in progress follow latency (between 8 and --node-max-in-flight): it shrinks as calls queue")
		f.nodeMaxParked = fs.Int("node-max-parked", 0, "internal calls that may give their slot back while they wait for replicas' acknowledgements (semi-sync writes, fresh reads on a master); one past it keeps its slot (0: 16 × --node-max-in-flight; -1: none, waits hold their slots)")
		f.nodeMaxQueue = fs.Int("node-max-queue", 0, "internal calls that may wait for a storage node; more are refused as overloaded (0: the most calls it completed in one second of the last ten × the queue timeout, at least 256)")
	}
	if name == "serve" || name == "router" {
		f.maxInFlight = fs.Int("max-in-flight", admission.DefaultRouterMaxInFlight, "document API requests in progress at once; more wait in the queue (-1: no limit, admission off)")
		f.maxQueue = fs.Int("max-queue", 0, "requests that may wait for a slot; more are refused with 503 overloaded, the change stream and schema administration first (0: sized from capacity, the most requests completed in one second of the last ten × --queue-timeout, at least 256)")
		f.queueTimeout = fs.Duration("queue-timeout", admission.DefaultQueueTimeout, "longest a request waits for a slot while the queue keeps emptying (a burst)")
		f.standingTimeout = fs.Duration("standing-timeout", admission.DefaultStandingTimeout, "longest a request waits for a slot once the queue has not emptied for --queue-timeout, or for ten --queue-timeouts after a refusal (overload); the newest waiters are then served first")
		f.quotaRate = fs.Float64("quota-rate", 0, "requests per second each client (X-Cortado-Client) may make; over it is 429 quota-exceeded (0: no quotas)")
		f.quotaBurst = fs.Float64("quota-burst", 0, "requests a client may make at once (default: one second's worth)")
		f.hedge = fs.Bool("hedge", true, "hedge reads that accept a slave's answer (Cache-Control: max-stale): ask a slave too when the master is slower than its recent p95, within a per-host budget")
		f.stallCalls = fs.Int("stall-calls", node.DefaultStallCalls, "a storage node that has answered none of this many reads and writes for --stall-after is stalled: they end as unavailable and new ones fail at once, a probe a --stall-after (-1: never)")
		f.stallAfter = fs.Duration("stall-after", node.DefaultStallAfter, "see --stall-calls")
		f.nodeMaxCalls = fs.Int("node-max-calls", 0, "a router's reads and writes in flight to one storage node at most; more fail at once as overloaded, not delivered (0: half of --max-in-flight; -1: no bound)")
		f.slowNodes = fs.Bool("report-slow-nodes", true, "report to the controller a storage node whose reads' median latency stays at least 250 ms and 10x the other nodes' for 10 s, as one that cannot be reached")
		f.requestTimeout = fs.Duration("request-timeout", admission.DefaultRequestTimeout, "deadline of a document request that sends no Request-Timeout header (-1s: none)")
		f.maxBody = fs.Int64("max-body-bytes", 2<<20, "largest request body, at most 16 MiB; larger is 413")
		f.maxPartitions = fs.Int("max-partitions", registry.DefaultMaxPartitions, "partitions of all databases together; a database beyond them is refused (409 limit-exceeded)")
		f.maxTables = fs.Int("max-tables", registry.DefaultMaxTables, "tables a database holds; a table beyond them is refused (409 limit-exceeded)")
		f.maxVersions = fs.Int("max-versions", registry.DefaultMaxVersions, "schema versions a table holds; a version beyond them is refused (409 limit-exceeded)")
		f.maxSchemaText = fs.Int("max-schema-text-bytes", registry.DefaultMaxSchemaTextBytes, "bytes of schema text of all versions of all tables together, which every router and storage node holds parsed (12 to 35 times as much heap); a version beyond them is refused (409 limit-exceeded)")
		f.maxResp = fs.Int("max-response-bytes", 2<<20, "largest response body; larger is 413")
		f.bodyTimeout = fs.Duration("body-timeout", 30*time.Second, "how long a request body may take to arrive; a slower client gets 408")
		f.writeTimeout = fs.Duration("write-timeout", router.DefaultWriteTimeout, "how long a client may take to read a response after its request's deadline (a change stream: each write); then its connection is closed")
		f.maxStreams = fs.Int("max-streams", router.DefaultMaxStreams, "change streams and backups served at once; more are refused with 503 overloaded")
		f.cacheBytes = fs.Int64("router-cache-bytes", keycache.DefaultMaxBytes, "bytes of documents the router's hot-key cache keeps for reads that accept staleness (Cache-Control: max-stale), the keys read most often (0 or -1: no cache)")
		f.cacheMaxAge = fs.Duration("router-cache-max-age", keycache.DefaultMaxAge, "the oldest answer the router's hot-key cache gives, whatever the read's max-stale accepts")
		f.redisURL = fs.String("redis-url", "", "the Redis cache tier (redis://host:port/db): reads that accept staleness (Cache-Control: max-stale) are answered from it after the hot-key cache, when its entries are young enough (empty: no tier)")
		f.redisUpdate = fs.Bool("redis-update", name == "serve", "run the cache tier's updater and bootstrapper in this process, which keep Redis current from the commit logs (run one in a cluster)")
		f.redisTTL = fs.Duration("redis-ttl", cachetier.DefaultTTL, "how long a cache-tier entry lives unless written again; the bootstrapper rewrites every partition three times a TTL")
		f.redisReadTimeout = fs.Duration("redis-read-timeout", cachetier.DefaultReadTimeout, "a read's round trip to the cache tier at most; slower is a miss, and three failures in a row stop reads asking Redis until it answers a ping")
		f.redisDatabases = fs.String("redis-databases", "", "comma-separated databases the cache tier holds: the updater keeps them, reads ask Redis for them only (empty: all)")
		f.streamBytes = fs.Int("stream-bytes", changes.DefaultStreamBytes, "bytes one change stream holds: its events on their way to the consumer (one at least), and room for the log answers its partitions read next")
		f.streamBacklogReaders = fs.Int("stream-backlog-readers", changes.DefaultBacklogReaders, "partitions, of all change streams, that read their first log answer at once (an answer holds at least one commit)")
	}
	if name != "router" {
		f.leaseTTL = fs.Int("lease-ttl", topo.DefaultLeaseTTL, "seconds a storage node or the leading controller may be silent before it is taken for dead")
	}
	if name == "serve" || name == "controller" {
		f.controllerID = fs.String("controller-id", "", "this controller's name (default host-pid)")
		f.checkInterval = fs.Duration("check-interval", controller.DefaultCheckInterval, "how often the leading controller checks that replicas match their masters (0 disables)")
	}
	switch name {
	case "serve":
		f.etcdClient = fs.String("etcd-client-url", coord.DefaultClientURL, "embedded etcd client URL (when --etcd-endpoints is empty)")
		f.etcdPeer = fs.String("etcd-peer-url", coord.DefaultPeerURL, "embedded etcd peer URL")
		f.demo = fs.Bool("demo", false, "create the demo database of the README, and those of its tables that do not exist (what exists is left as it is)")
		f.nodes = fs.Int("nodes", 1, "storage nodes to run in this process (2 or more adds a controller and replication)")
		f.localCalls = fs.Bool("local-calls", true, "with --nodes 2 or more, the router calls this process's storage nodes, its change streams read its relay, and its slaves and relay read their masters' logs, directly (false: over the internal protocol, as other processes')")
	case "storage":
		f.nodeID = fs.String("node-id", "", "this node's name, stable across restarts (default: its advertised address)")
		f.rack = fs.String("rack", "", "this node's rack: no two replicas of a partition share one")
		f.drainTimeout = fs.Duration("drain-timeout", server.DefaultDrainTimeout, "on SIGTERM or SIGINT, how long to wait for the partitions this node masters to be handed to other replicas before leaving the cluster (a rolling restart without errors); then the rest fails over (-1s: leave at once)")
		f.advertise = fs.String("advertise-url", "", "URL other processes reach this node at (default http:// + the listen address)")
	case "relay":
		f.nodeID = fs.String("relay-id", "", "this relay's name (default: its advertised address)")
		f.advertise = fs.String("advertise-url", "", "URL slaves reach this relay at (default http:// + the listen address)")
		f.relayBuffer = fs.Int("buffer", relay.DefaultBuffer, "commits kept per partition; older ones are re-read from the master")
		f.relayBytes = fs.Int("buffer-bytes", relay.DefaultBufferBytes, "bytes of commits (keys, documents, pre-images) kept in all, each partition an equal share; older ones are re-read from the master")
	}
	return f
}

func (f *roleFlags) options(log *slog.Logger, addr string) server.Options {
	o := server.Options{Logger: log, ProtocolVersion: uint32(*f.protocol), MaxConns: *f.maxConns, IdleTimeout: *f.idleTimeout,
		HeapFloor: *f.heapFloor, ProcsPerCPU: *f.procsPerCPU, URL: "http://" + addr}
	if f.dataDir != nil {
		o.DataDir = *f.dataDir
	}
	if f.maxLogStreams != nil {
		o.MaxLogStreams = *f.maxLogStreams
	}
	if f.etcdClient != nil {
		o.EtcdClientURL, o.EtcdPeerURL = *f.etcdClient, *f.etcdPeer
	}
	if f.maxBody != nil {
		o.Router = router.Options{MaxBodyBytes: *f.maxBody, MaxResponseBytes: *f.maxResp, BodyTimeout: *f.bodyTimeout, Hedge: router.HedgeOptions{Off: !*f.hedge},
			WriteTimeout: *f.writeTimeout, MaxStreams: *f.maxStreams, Cache: keycache.Options{MaxBytes: cmp.Or(*f.cacheBytes, -1), MaxAge: *f.cacheMaxAge}}
		o.StreamBytes = *f.streamBytes
		o.CacheTier = cachetier.Options{URL: *f.redisURL, TTL: *f.redisTTL, ReadTimeout: *f.redisReadTimeout}
		if *f.redisDatabases != "" {
			o.CacheTier.Databases = strings.Split(*f.redisDatabases, ",")
		}
		o.CacheTierUpdate = *f.redisUpdate
		o.StreamBacklogReaders = *f.streamBacklogReaders
		o.Registry = registry.Limits{Partitions: *f.maxPartitions, Tables: *f.maxTables, Versions: *f.maxVersions, SchemaTextBytes: *f.maxSchemaText}
		o.Stall = node.StallOptions{Calls: *f.stallCalls, After: *f.stallAfter, MaxCalls: *f.nodeMaxCalls}
		o.NoSlowNodeReports = !*f.slowNodes
		o.Admission = admission.Options{MaxInFlight: *f.maxInFlight, MaxQueue: *f.maxQueue, QueueTimeout: *f.queueTimeout, StandingTimeout: *f.standingTimeout}
		o.Deadlines = admission.Deadlines{Default: *f.requestTimeout}
		o.Quotas = admission.QuotaOptions{Rate: *f.quotaRate, Burst: *f.quotaBurst}
	}
	if f.nodeMaxInFlight != nil {
		o.NodeAdmission = admission.Options{MaxInFlight: *f.nodeMaxInFlight, MaxQueue: *f.nodeMaxQueue, Adaptive: *f.nodeAdaptive, MaxParked: *f.nodeMaxParked}
	}
	if *f.etcdEndpoints != "" {
		o.EtcdEndpoints = strings.Split(*f.etcdEndpoints, ",")
	}
	if f.nodes != nil {
		o.Nodes = *f.nodes
		o.NoLocalCalls = !*f.localCalls
	}
	if f.leaseTTL != nil {
		o.LeaseTTL = *f.leaseTTL
	}
	if f.maxTransitions != nil {
		o.MaxTransitions = *f.maxTransitions
		o.RetentionInterval, o.SnapshotBytesPerSecond, o.IndexBuildRate = *f.retainEvery, *f.snapshotRate, *f.indexBuildRate
		o.WriteBytes = *f.writeBytes
		o.Storage.RowCacheBytes = *f.rowCache
		o.Storage.StallTimeout = *f.diskStall
		o.Storage.MinFreeBytes = *f.diskMinFree
		o.Storage.AdoptCluster = *f.adoptData
		if o.RetentionInterval == 0 {
			o.RetentionInterval = -1
		}
	}
	if f.controllerID != nil {
		o.ControllerID = *f.controllerID
		o.CheckInterval = *f.checkInterval
		if o.CheckInterval == 0 {
			o.CheckInterval = -1
		}
	}
	if f.relayBuffer != nil {
		o.RelayBuffer, o.RelayBufferBytes = *f.relayBuffer, *f.relayBytes
	}
	if f.drainTimeout != nil {
		o.DrainTimeout = *f.drainTimeout
	}
	if f.rack != nil {
		o.Rack = *f.rack
	}
	if f.nodeID != nil {
		o.NodeID, o.AdvertiseURL = *f.nodeID, *f.advertise
		if o.AdvertiseURL == "" {
			o.AdvertiseURL = "http://" + addr
		}
	}
	return o
}

func runServe(args []string) error {
	f := newRoleFlags("serve", "127.0.0.1:8080")
	f.fs.Parse(args)
	return runRole("serve", f, func(ctx context.Context, o server.Options) (*server.Server, error) {
		s, err := server.Open(ctx, o)
		if err == nil && *f.demo {
			if err = s.DemoDatabase(ctx); err != nil {
				s.Close()
			}
		}
		return s, err
	})
}

func runStorage(args []string) error {
	f := newRoleFlags("storage", "127.0.0.1:7070")
	f.fs.Parse(args)
	if *f.etcdEndpoints == "" {
		return fmt.Errorf("--etcd-endpoints is required")
	}
	return runRole("storage", f, server.OpenStorage)
}

func runRouter(args []string) error {
	f := newRoleFlags("router", "127.0.0.1:8080")
	f.fs.Parse(args)
	if *f.etcdEndpoints == "" {
		return fmt.Errorf("--etcd-endpoints is required")
	}
	return runRole("router", f, server.OpenRouter)
}

func runRelay(args []string) error {
	f := newRoleFlags("relay", "127.0.0.1:7100")
	f.fs.Parse(args)
	if *f.etcdEndpoints == "" {
		return fmt.Errorf("--etcd-endpoints is required")
	}
	return runRole("relay", f, server.OpenRelay)
}

func runController(args []string) error {
	f := newRoleFlags("controller", "127.0.0.1:7000")
	f.fs.Parse(args)
	if *f.etcdEndpoints == "" {
		return fmt.Errorf("--etcd-endpoints is required")
	}
	return runRole("controller", f, server.OpenController)
}

// positiveFlags must be above zero and nonNegativeFlags at least zero
// (0 disables): a value outside would stop a role later, or oddly (a
// lease TTL of -3 seconds panicked in a ticker; a body limit of -1 refused
// every body). Flags whose help gives -1 a meaning are not listed.
var (
	positiveFlags = []string{"nodes", "lease-ttl", "max-transitions", "max-body-bytes", "max-response-bytes", "max-streams", "stream-bytes", "stream-backlog-readers",
		"max-partitions", "max-tables", "max-versions", "max-schema-text-bytes", "buffer", "buffer-bytes", "snapshot-rate",
		"idle-timeout", "body-timeout", "write-timeout", "router-cache-max-age", "redis-ttl", "redis-read-timeout", "queue-timeout", "standing-timeout", "stall-after", "disk-stall-timeout"}
	nonNegativeFlags = []string{"retention-interval", "check-interval", "quota-rate", "quota-burst"}
)

// checkFlags refuses a flag of this role's set outside its range.
func checkFlags(fs *flag.FlagSet) error {
	for _, set := range []struct {
		names    []string
		positive bool
	}{{positiveFlags, true}, {nonNegativeFlags, false}} {
		for _, name := range set.names {
			fl := fs.Lookup(name)
			if fl == nil {
				continue // not a flag of this role
			}
			v, err := strconv.ParseFloat(fl.Value.String(), 64)
			if err != nil {
				d, derr := time.ParseDuration(fl.Value.String())
				if derr != nil {
					return fmt.Errorf("--%s: %q is not a number or a duration", name, fl.Value)
				}
				v = float64(d)
			}
			switch {
			case set.positive && v <= 0:
				return fmt.Errorf("--%s must be above zero, got %s", name, fl.Value)
			case v < 0:
				return fmt.Errorf("--%s must be zero or more (0 disables), got %s", name, fl.Value)
			}
		}
	}
	if fl := fs.Lookup("max-body-bytes"); fl != nil {
		if v, _ := strconv.ParseInt(fl.Value.String(), 10, 64); v > router.MaxBodyBytesLimit {
			return fmt.Errorf("--max-body-bytes must be at most %d (a document that large replaced by another fills a commit), got %s", router.MaxBodyBytesLimit, fl.Value)
		}
	}
	return nil
}

// runRole starts a role, serves HTTP until SIGINT/SIGTERM, and shuts down.
func runRole(name string, f *roleFlags, open func(context.Context, server.Options) (*server.Server, error)) error {
	if err := checkFlags(f.fs); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*f.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	if err := schema.SetMaxDepth(*f.maxDepth); err != nil {
		return fmt.Errorf("--max-depth: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("role", name)
	slog.SetDefault(log)
	stopProfile, err := cpuProfile(*f.cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	if *f.allocProfile != "" {
		pf, err := os.Create(*f.allocProfile)
		if err != nil {
			return err
		}
		defer func() {
			if err := pprof.Lookup("allocs").WriteTo(pf, 0); err != nil {
				log.Error("write the allocation profile", "err", err)
			}
			pf.Close()
		}()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Listen first: a storage node advertises the address it serves on.
	ln, err := net.Listen("tcp", *f.listen)
	if err != nil {
		return err
	}
	s, err := open(ctx, f.options(log, ln.Addr().String()))
	if err != nil {
		ln.Close()
		return err
	}
	defer s.Close()
	if *f.adminListen != "" {
		aln, err := net.Listen("tcp", *f.adminListen)
		if err != nil {
			return err
		}
		s.ServeAdmin(aln)
		log.Info("cortado serving its admin paths", "addr", aln.Addr().String())
	}
	log.Info("cortado serving", "addr", ln.Addr().String())
	if *f.readyFile != "" {
		if err := os.WriteFile(*f.readyFile, []byte(ln.Addr().String()), 0o644); err != nil {
			return err
		}
	}
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		log.Info("cortado shutting down")
		return s.Close()
	}
}

// cpuProfile starts a CPU profile of the process into path (none when
// path is empty); stop ends it.
func cpuProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	pf, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(pf); err != nil {
		pf.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		pf.Close()
	}, nil
}

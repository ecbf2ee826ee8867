// Package server assembles Cortado's roles into processes: coordination
// (embedded or external etcd), the schema registry, storage nodes with
// their cluster membership and agent, the relay, the controller, the
// router, and the listener that serves HTTP (the API, /metrics, /healthz,
// /_cluster) and a storage node's or relay's internal gRPC API on one
// port. It owns their start order and shuts them down in reverse: roles
// leave the cluster, listeners drain their handlers, then engines close.
// It puts admission control in front of the document API and each storage
// node's internal API, and its HTTP ports answer even the requests Go's
// HTTP server refuses before any handler runs as problems (replies.go).
// `cortado serve` (every role) and the embedded client use Open;
// `cortado storage`, `cortado router` and `cortado controller` use
// OpenStorage, OpenRouter and OpenController, against an external etcd.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/cortado-db/cortado/internal/admission"
	"github.com/cortado-db/cortado/internal/cachetier"
	"github.com/cortado-db/cortado/internal/changes"
	"github.com/cortado-db/cortado/internal/controller"
	"github.com/cortado-db/cortado/internal/coord"
	"github.com/cortado-db/cortado/internal/metrics"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/problem"
	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/router"
	"github.com/cortado-db/cortado/internal/routing"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
	"github.com/cortado-db/cortado/internal/topo"
	"github.com/cortado-db/cortado/internal/wire"
)

// Defaults of Options.
const (
	DefaultDataDir     = "cortado-data" // where a process keeps its data
	DefaultMaxConns    = 4096
	DefaultIdleTimeout = 2 * time.Minute
)

// Options configures a Server. Zero values take the documented defaults.
type Options struct {
	// DataDir holds Pebble (DataDir/storage) and the embedded etcd
	// (DataDir/etcd). Default ./cortado-data.
	DataDir string
	// EtcdEndpoints, when set, uses that etcd cluster instead of starting
	// an embedded one.
	EtcdEndpoints []string
	// EtcdClientURL and EtcdPeerURL are where the embedded etcd listens
	// (defaults http://127.0.0.1:2379 and :2380).
	EtcdClientURL, EtcdPeerURL string
	// Prefix is the etcd key prefix of this Cortado cluster (default
	// /cortado).
	Prefix  string
	Storage storage.Options
	Router  router.Options
	// CacheTier is the Redis cache tier routers read (CacheTier.URL
	// empty: none); CacheTierUpdate makes this process also run its
	// updater and bootstrapper (run one in a cluster).
	CacheTier       cachetier.Options
	CacheTierUpdate bool
	// Registry bounds what the schema registry takes (registry.Limits;
	// checked where a database is created or a version registered).
	Registry registry.Limits
	Logger   *slog.Logger

	// Nodes is how many storage nodes `serve` runs (default 1: a single
	// node mastering every partition, without a controller). With 2 or
	// more, serve runs a controller and each node's internal API on its
	// own loopback port, like separate processes would.
	Nodes int
	// NodeID names a storage node (default: its advertised address).
	NodeID string
	// Rack is the storage node's rack: no two replicas of a partition
	// are placed on one rack.
	Rack string
	// AdvertiseURL is how other processes reach this storage node's
	// internal API (default http:// + its listen address).
	AdvertiseURL string
	// URL is where the process serves (its listen address): a router
	// names it in its process record (topo.Process). Default none.
	URL string
	// LeaseTTL, in seconds, is how long a storage node (or the leading
	// controller) may be silent before it is taken for dead (default 5).
	LeaseTTL int
	// MaxTransitions bounds the partitions changing role at once on a
	// storage node (default 16).
	MaxTransitions int
	// DrainTimeout bounds how long a storage node (`cortado storage`)
	// stopping cleanly waits for its masterships to be handed to other
	// replicas before it leaves the cluster (default DefaultDrainTimeout;
	// negative: it leaves at once, and its partitions fail over).
	DrainTimeout time.Duration
	// ControllerID names a controller (default: host and process ID).
	ControllerID string
	// StreamBytes bounds what one change stream holds in memory
	// (changes.Feed.StreamBytes; default changes.DefaultStreamBytes).
	StreamBytes int
	// StreamBacklogReaders bounds how many partitions, of all the change
	// streams a router serves, read their first log answer at once
	// (changes.Feed.BacklogReaders; default
	// changes.DefaultBacklogReaders).
	StreamBacklogReaders int
	// RelayBuffer is how many commits per partition a relay keeps
	// (default 10,000), and RelayBufferBytes how many bytes of commits
	// in all (default 256 MiB): relay.Relay.Buffer and BufferBytes.
	RelayBuffer, RelayBufferBytes int
	// CheckInterval is how often the leading controller runs the
	// consistency check (default 10 minutes; negative disables it).
	CheckInterval time.Duration
	// RetentionInterval is how often storage nodes trim their commit
	// logs by their databases' retention (default
	// node.DefaultRetentionInterval; negative: never).
	RetentionInterval time.Duration
	// IndexBuildRate is how many documents a second a storage node
	// rewrites to build the indexes a new schema version adds (default
	// node.DefaultIndexBuildRate; negative: never).
	IndexBuildRate int
	// SnapshotBytesPerSecond caps how fast storage nodes stream partition
	// snapshots (default node.DefaultSnapshotRate).
	SnapshotBytesPerSecond int64
	// WriteBytes bounds the bytes of documents a storage node's writes
	// carry at once (default node.DefaultWriteBytes; -1: no bound).
	WriteBytes int64
	// Admission bounds the document API's requests in progress and
	// queued; NodeAdmission a storage node's internal calls
	// (admission.Options: a negative MaxInFlight turns one off; the
	// document API's MaxInFlight defaults to
	// admission.DefaultRouterMaxInFlight).
	Admission, NodeAdmission admission.Options
	// Stall is how a router guards against a storage node that stops
	// answering or holds too many of its calls (node.StallOptions; its
	// MaxCalls defaults to half of Admission.MaxInFlight).
	Stall node.StallOptions
	// NoSlowNodeReports stops a router from reporting storage nodes whose
	// reads are slow outliers (it still reports those it cannot reach).
	NoSlowNodeReports bool
	// Deadlines are the document API's request deadlines.
	Deadlines admission.Deadlines
	// Quotas are the document API's per-client request quotas (zero
	// rate: none).
	Quotas admission.QuotaOptions
	// MaxConns bounds the connections a process's port holds open at once
	// (default 4096; negative: no bound): one beyond it is closed at
	// once. IdleTimeout closes a kept-alive HTTP connection that sends no
	// request for that long (default 2 minutes).
	MaxConns    int
	IdleTimeout time.Duration
	// ProtocolVersion is the newest internal protocol version this
	// process speaks (default wire.Version): an older one makes it
	// behave as the previous release, for rolling-upgrade tests.
	ProtocolVersion uint32
	// MaxLogStreams bounds the log streams each storage node's and
	// relay's internal API serves at once (default
	// node.DefaultMaxLogStreams; negative: no bound).
	MaxLogStreams int
	// NoLocalCalls makes the router of `serve --nodes N` call its own
	// storage nodes, and its relay and slaves read their masters' logs,
	// over the wire, as other processes' nodes are called, instead of
	// directly.
	NoLocalCalls bool
	// HeapFloor is the smallest heap goal the garbage collector aims at
	// (default DefaultHeapFloor; negative: GOGC as the process has it).
	// An embedded server leaves the host process's collector alone.
	HeapFloor int64
	// ProcsPerCPU is how many Go processors (GOMAXPROCS) the process runs
	// per CPU it may use (default DefaultProcsPerCPU; 1 or negative:
	// GOMAXPROCS as the runtime chose). An embedded server leaves the
	// host process's alone.
	ProcsPerCPU int
}

// Server is one Cortado process: every role (serve), or one of them.
type Server struct {
	Router  *router.Router
	tier    *cachetier.Tier
	Metrics *metrics.Metrics

	opts    Options
	dirLock io.Closer // the data directory's, held until Close ends
	etcd    *coord.Embedded
	cli     *clientv3.Client
	reg     *registry.Registry
	engine  *storage.Engine
	http    *wire.Listener
	rpc     *wire.Server // the internal API of a storage node or relay
	api     http.Handler
	routeOf func(*http.Request) string
	cluster *metrics.Cluster
	members []*member // storage nodes in a cluster
	// local holds this process's storage nodes by advertised URL, as
	// its router calls them (unless Options.NoLocalCalls).
	local map[string]node.Service
	// localLogs and localSnaps are this process's relay and storage
	// nodes by URL, as its change streams read them.
	localLogs  map[string]node.LogSource
	localSnaps map[string]node.Snapshotter
	// peers are the same nodes and relay as replication inside this
	// process calls them (unless Options.NoLocalCalls).
	peers *node.LocalPeers
	stop  []func()             // background roles (controller, routing view), stopped first
	view  *routing.RoutingView // the router's, nil without one
	extra []*wire.Listener     // internal APIs of serve's storage nodes and relay; the admin port

	limiter *admission.Limiter // the document API's
	// checking holds the consistency check this process runs for a
	// client (POST /_cluster/check): one at a time, for each reads every
	// replica of every partition it checks.
	checking chan struct{}

	buildMu   sync.Mutex
	buildLeft map[[3]string]uint64 // node, db, table → documents an index build has left

	mu        sync.Mutex // guards http, set by Serve, and extra, grown by ServeAdmin
	closeOnce sync.Once
	closeErr  error
}

// localBackend is a single node's: n is the node wrapped once as
// inProcess, not on every call.
type localBackend struct{ n node.Service }

func (b localBackend) Node(string, int) (node.Service, error) { return b.n, nil }

// inProcess is the single node as its router calls it (node.InProcess).
type inProcess struct{ node.Service }

func (inProcess) InProcess() bool { return true }

// StorageNodes is one: a single node holds one copy of everything.
func (b localBackend) StorageNodes(context.Context) (int, error) { return 1, nil }

// Open starts every role: coordination, registry, storage and router (and
// with opts.Nodes ≥ 2, a controller and that many storage nodes). It does
// not listen; see Serve.
func Open(ctx context.Context, opts Options) (*Server, error) {
	return open(ctx, opts, roleAll)
}

// OpenStorage starts a storage node: registry, storage engine and node,
// served by Handler as the node's internal API, registered in the cluster
// under a lease and driven by the routing tables. opts.AdvertiseURL must be
// where Handler will be served.
func OpenStorage(ctx context.Context, opts Options) (*Server, error) {
	return open(ctx, opts, roleStorage)
}

// OpenRouter starts a router: registry and router, sending each
// partition's work to the master the routing table names. It keeps no
// data.
func OpenRouter(ctx context.Context, opts Options) (*Server, error) {
	return open(ctx, opts, roleRouter)
}

// OpenRelay starts a relay: it pulls every master's log into bounded
// buffers and serves slaves from them (Handler), registered at
// opts.AdvertiseURL.
func OpenRelay(ctx context.Context, opts Options) (*Server, error) {
	return open(ctx, opts, roleRelay)
}

// OpenController starts a controller: it campaigns for leadership and,
// while leading, keeps the routing tables at the ideal state. Several may
// run; one leads.
func OpenController(ctx context.Context, opts Options) (*Server, error) {
	return open(ctx, opts, roleController)
}

type role int

const (
	roleAll role = iota
	roleStorage
	roleRouter
	roleController
	roleRelay
)

func open(ctx context.Context, opts Options, r role) (_ *Server, err error) {
	if opts.DataDir == "" {
		opts.DataDir = DefaultDataDir
	}
	if opts.Prefix == "" {
		opts.Prefix = "/cortado"
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.LeaseTTL == 0 {
		opts.LeaseTTL = topo.DefaultLeaseTTL
	}
	if opts.CheckInterval == 0 {
		opts.CheckInterval = controller.DefaultCheckInterval
	}
	if opts.DrainTimeout == 0 {
		opts.DrainTimeout = DefaultDrainTimeout
	}
	if opts.ProtocolVersion == 0 {
		opts.ProtocolVersion = wire.Version
	}
	if opts.MaxConns == 0 {
		opts.MaxConns = DefaultMaxConns
	}
	if opts.IdleTimeout == 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	if opts.HeapFloor == 0 {
		opts.HeapFloor = DefaultHeapFloor
	}
	if opts.ProcsPerCPU == 0 {
		opts.ProcsPerCPU = DefaultProcsPerCPU
	}
	if opts.ProtocolVersion < wire.MinVersion || opts.ProtocolVersion > wire.Version {
		return nil, fmt.Errorf("protocol version %d: this binary speaks %d to %d", opts.ProtocolVersion, wire.MinVersion, wire.Version)
	}
	if r == roleAll || r == roleStorage {
		if err := os.MkdirAll(opts.DataDir, 0o755); err != nil {
			return nil, err
		}
	}
	if opts.Admission.MaxInFlight == 0 {
		opts.Admission.MaxInFlight = admission.DefaultRouterMaxInFlight
	}
	if opts.Stall.MaxCalls == 0 && opts.Admission.MaxInFlight > 0 {
		opts.Stall.MaxCalls = max(1, opts.Admission.MaxInFlight/2)
	}
	s := &Server{opts: opts, Metrics: metrics.New(), limiter: admission.New(opts.Admission), checking: make(chan struct{}, 1)}
	s.Metrics.RegisterAdmission("http", s.limiter, nil)
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	s.tuneHeap(opts.HeapFloor)
	s.tuneProcs(opts.ProcsPerCPU)
	if r == roleAll || r == roleStorage || len(opts.EtcdEndpoints) == 0 {
		if s.dirLock, err = lockDataDir(opts.DataDir); err != nil {
			return nil, err
		}
	}
	if r == roleAll {
		if err := checkLayout(opts.DataDir, opts.Nodes); err != nil {
			return nil, err
		}
	}
	endpoints := opts.EtcdEndpoints
	if len(endpoints) == 0 {
		s.etcd, err = coord.StartEmbedded(coord.EmbeddedOptions{
			Dir: filepath.Join(opts.DataDir, "etcd"), ClientURL: opts.EtcdClientURL, PeerURL: opts.EtcdPeerURL,
		})
		if err != nil {
			return nil, err
		}
		endpoints = []string{s.etcd.Endpoint}
	}
	if s.cli, err = coord.Connect(ctx, endpoints); err != nil {
		return nil, err
	}
	if s.reg, err = registry.Open(ctx, s.cli, registry.Options{Prefix: opts.Prefix, Logger: opts.Logger, Limits: opts.Registry}); err != nil {
		return nil, err
	}
	s.cluster = s.Metrics.Cluster()
	plans := schema.NewPlans(4096)
	var tierSources cachetier.Sources
	switch {
	case r == roleController:
		s.startController()
		s.api, s.routeOf = http.NotFoundHandler(), func(*http.Request) string { return "other" }
		return s, nil
	case r == roleRelay:
		if s.rpc, _, err = s.startRelay(ctx, opts.NodeID, opts.AdvertiseURL); err != nil {
			return nil, err
		}
		s.api, s.routeOf = http.NotFoundHandler(), func(*http.Request) string { return "other" }
		return s, nil
	case r == roleStorage:
		m, err := s.startMember(ctx, opts.DataDir, opts.NodeID, opts.AdvertiseURL, plans)
		if err != nil {
			return nil, err
		}
		// Alone in its process, the node hands its masterships over
		// before it stops: the controller and the other replicas run on.
		// (In `serve`, every role stops together.)
		m.drainFor = opts.DrainTimeout
		s.rpc, _ = s.nodeRPC(m)
		s.api, s.routeOf = http.NotFoundHandler(), func(*http.Request) string { return "other" }
		return s, nil
	case r == roleAll && opts.Nodes <= 1:
		var so storage.Options
		if so, err = s.storageOptions(ctx); err != nil {
			return nil, err
		}
		if s.engine, err = storage.Open(filepath.Join(opts.DataDir, "storage"), so); err != nil {
			return nil, err
		}
		s.Metrics.RegisterPebble("node", s.engine)
		n := node.New(s.engine, s.reg, plans, opts.Logger, node.Options{AllMaster: true, Retained: s.retained, IndexBuilding: s.indexBuilding("node"), SnapshotBytesPerSecond: opts.SnapshotBytesPerSecond, WriteBytes: opts.WriteBytes})
		s.retain(n)
		s.Router = router.New(s.reg, plans, localBackend{inProcess{n}}, opts.Router, opts.Logger)
		s.Router.SetChanges(&changes.Feed{Reg: s.reg, Plans: plans, Sources: localSources{n}, Logger: opts.Logger, StreamBytes: opts.StreamBytes, BacklogReaders: opts.StreamBacklogReaders})
		tierSources = localSources{n}
	default: // a router, or serve with several nodes
		if r == roleAll {
			if err := s.startLocalCluster(ctx, plans); err != nil {
				return nil, err
			}
		}
		vctx, cancel := context.WithCancel(context.Background())
		view, err := routing.WatchRouting(vctx, s.cli, opts.Prefix, opts.Stall)
		if err != nil {
			cancel()
			return nil, err
		}
		s.stop = append(s.stop, func() { cancel(); <-view.Done() })
		if !opts.NoLocalCalls {
			view.CallLocally(s.local)
		}
		host, _ := os.Hostname()
		if err := view.ReportSickNodes(vctx, s.cli, opts.Prefix, s.process(topo.RoleRouter, fmt.Sprintf("%s-%d", host, os.Getpid()), opts.URL), opts.LeaseTTL, !opts.NoSlowNodeReports, opts.Logger); err != nil {
			return nil, err
		}
		s.Router, s.view = router.New(s.reg, plans, view, opts.Router, opts.Logger), view
		s.Metrics.RegisterRedirects(view.RedirectStats)
		relays := topo.WatchRelays(vctx, s.cli, opts.Prefix)
		remotes := &node.Remotes{MaxVersion: opts.ProtocolVersion}
		s.stop = append(s.stop, func() { cancel(); <-relays.Done(); remotes.Close() })
		sources := routing.NewChangeSources(view, relays, remotes)
		s.Metrics.RegisterChangeRelayLeft(sources.RelayLeftStats)
		if !opts.NoLocalCalls {
			sources.CallLocally(s.localLogs, s.localSnaps)
		}
		s.Router.SetChanges(&changes.Feed{Reg: s.reg, Plans: plans, Logger: opts.Logger, Sources: sources, StreamBytes: opts.StreamBytes, BacklogReaders: opts.StreamBacklogReaders})
		tierSources = sources
	}
	if err := s.startTier(tierSources); err != nil {
		return nil, err
	}
	s.Metrics.RegisterFanOut(s.Router.FanOutStats)
	s.Metrics.RegisterHedges(s.Router.HedgeStats)
	s.Metrics.RegisterCache(s.Router.CacheStats)
	s.Metrics.RegisterStreams(s.Router.Streams, s.Router.AnswersLetGo)
	s.api, s.routeOf = s.logRequests(s.Router), router.RouteOf
	return s, nil
}

// startTier connects the router to the Redis cache tier, and runs its
// updater when asked, until Close.
func (s *Server) startTier(src cachetier.Sources) error {
	t, err := cachetier.New(s.opts.CacheTier)
	if err != nil || t == nil {
		return err
	}
	s.tier = t
	s.Router.SetTier(t)
	s.Metrics.RegisterTier(s.Router.TierStats)
	if s.opts.CacheTierUpdate {
		u := cachetier.NewUpdater(t, s.reg, src, s.opts.Logger)
		s.Metrics.RegisterTierUpdater(u.Stats)
		s.background(u.Run)
	}
	return nil
}

// retained records a retention pass in the metrics.
func (s *Server) retained(db string, trimmed, logBytes int64) {
	s.cluster.LogTrimmed.WithLabelValues(db).Add(float64(trimmed))
	s.cluster.LogBytes.WithLabelValues(db).Set(float64(logBytes))
}

// retain runs n's retention and index builds in the background until
// Close.
func (s *Server) retain(n *node.Node) {
	if s.opts.RetentionInterval >= 0 {
		s.background(func(ctx context.Context) { n.RunRetention(ctx, s.opts.RetentionInterval) })
	}
	if s.opts.IndexBuildRate >= 0 {
		s.background(func(ctx context.Context) { n.RunIndexBuilds(ctx, s.opts.IndexBuildRate) })
	}
}

// indexBuilding returns what storage node id reports after its
// index-build passes: the metric is the sum over this process's nodes.
func (s *Server) indexBuilding(id string) func(db, table string, remaining uint64) {
	return func(db, table string, remaining uint64) {
		s.buildMu.Lock()
		defer s.buildMu.Unlock()
		if s.buildLeft == nil {
			s.buildLeft = map[[3]string]uint64{}
		}
		s.buildLeft[[3]string{id, db, table}] = remaining
		sum := uint64(0)
		for k, v := range s.buildLeft {
			if k[1] == db && k[2] == table {
				sum += v
			}
		}
		s.cluster.IndexBuildRemaining.WithLabelValues(db, table).Set(float64(sum))
	}
}

// storageFailed returns the first failure of this process's storage
// engines, nil while all are healthy.
func (s *Server) storageFailed() error {
	if s.engine != nil {
		if err := s.engine.Failed(); err != nil {
			return err
		}
	}
	for _, m := range s.members {
		if err := m.engine.Failed(); err != nil {
			return err
		}
	}
	return nil
}

// Handler is the whole HTTP surface: the document API, /metrics and
// /healthz.
func (s *Server) Handler() http.Handler {
	// Admission sits inside the metrics, so refused requests are counted
	// (503), and before the API, which reads nothing of a refused one.
	classOf := router.ClassOf
	if s.Router == nil {
		classOf = func(*http.Request) admission.Class { return admission.Bulk }
	}
	return s.operatorsAnd(s.Metrics.Instrument(admission.Middleware(s.limiter, s.opts.Deadlines, admission.NewQuotas(s.opts.Quotas), classOf, s.api), s.routeOf))
}

// operatorsAnd serves the operators' paths (/metrics, /healthz,
// /_cluster) and hands every other path to rest.
func (s *Server) operatorsAnd(rest http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", s.Metrics.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		unhealthy := func(status, reason string) {
			w.WriteHeader(http.StatusServiceUnavailable)
			b, _ := json.Marshal(map[string]string{"status": status, "reason": reason})
			w.Write(b)
		}
		if err := s.storageFailed(); err != nil {
			unhealthy("failed", err.Error())
			return
		}
		if s.view != nil {
			if since, lapsed := s.view.RegistrationLapsed(); lapsed {
				// A router cut off from etcd routes by tables that may
				// be out of date: requests to partitions whose master
				// moved fail. A load balancer should send them to
				// another router.
				unhealthy("stale", fmt.Sprintf("this router's registration in etcd lapsed at %s (etcd did not answer for a lease's TTL): the routing tables it routes by may be out of date", since.UTC().Format(time.RFC3339)))
				return
			}
		}
		w.Write([]byte(`{"status":"ok"}`))
	})
	mux.HandleFunc("GET /_cluster", s.serveClusterStatus)
	mux.HandleFunc("GET /_admin", s.serveAdminPage)
	mux.HandleFunc("POST /_cluster/check", s.serveClusterCheck)
	// The document API sees every path as sent: ServeMux would answer a
	// path with "//" or ".." with a redirect to its cleaned form, which
	// may be another document.
	admin := map[string]string{"/metrics": "GET", "/healthz": "GET", "/_cluster": "GET", "/_cluster/check": "POST", "/_admin": "GET"}
	// Every response must be taken within the write timeout (the router
	// extends it past a request's deadline): a client that stops reading
	// does not hold a handler. Set on each request, since the HTTP server
	// keeps a connection's deadline from one request to the next.
	writeTimeout := s.opts.Router.WithDefaults().WriteTimeout
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		http.NewResponseController(w).SetWriteDeadline(time.Now().Add(writeTimeout))
		method, ok := admin[req.URL.Path]
		switch {
		case !ok:
			rest.ServeHTTP(w, req)
		case req.Method == method || method == "GET" && req.Method == http.MethodHead:
			mux.ServeHTTP(w, req)
		default:
			allow := method
			if method == "GET" {
				allow = "GET, HEAD"
			}
			w.Header().Set("Allow", allow)
			problem.Write(w, problem.New(http.StatusMethodNotAllowed, problem.TypeMethodNotAllowed, "Method not allowed", req.URL.Path+" takes "+allow))
		}
	})
}

func (s *Server) logRequests(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !s.opts.Logger.Enabled(req.Context(), slog.LevelDebug) {
			h.ServeHTTP(w, req)
			return
		}
		start := time.Now()
		h.ServeHTTP(w, req)
		s.opts.Logger.Debug("request", "method", req.Method, "path", req.URL.Path, "duration", time.Since(start))
	})
}

// Serve serves HTTP (and a storage node's or relay's internal API, on
// the same port) on ln until Close.
func (s *Server) Serve(ln net.Listener) error {
	if s.opts.MaxConns > 0 {
		limited := wire.LimitConns(ln, s.opts.MaxConns)
		s.Metrics.RegisterConns(limited.Open, limited.Refused, limited.Waiting)
		ln = limited
	}
	h := s.httpServer(s.Handler())
	l := wire.Serve(ln, h, problemReplies(h), s.rpc)
	s.mu.Lock()
	s.http = l
	s.mu.Unlock()
	<-l.Done()
	return nil
}

// httpServer is the HTTP server of a port of this process, serving h.
func (s *Server) httpServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: s.opts.IdleTimeout, MaxHeaderBytes: maxHeaderBytes}
}

// ServeAdmin serves the operators' paths (/metrics, /healthz, /_cluster)
// on ln as well, outside the document API's bounds: a port full of
// clients' connections (--max-conns) or a CPU busy with them must not
// blind the monitoring that would show it. It returns at once; Close
// stops it.
func (s *Server) ServeAdmin(ln net.Listener) {
	notHere := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		problem.Write(w, problem.New(http.StatusNotFound, problem.TypeMalformed, "Not found", "this port serves only /metrics, /healthz, /_cluster and /_admin; documents are on the other"))
	})
	h := s.httpServer(s.operatorsAnd(notHere))
	l := wire.Serve(ln, h, problemReplies(h), nil)
	s.mu.Lock()
	s.extra = append(s.extra, l)
	s.mu.Unlock()
}

// Close stops serving and closes every role, in reverse start order. It
// may be called more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}

func (s *Server) close() error {
	var errs []error
	for _, stop := range s.stop {
		stop()
	}
	// Hand the node's masterships over (a storage process: drain) and
	// leave the cluster first, then let every HTTP handler finish (a
	// replication long-poll reads the engine), then stop the agents and
	// close the engines: never an engine closed under a running handler.
	for _, m := range s.members {
		m.drain(s.cli, s.opts.Prefix, s.opts.Logger)
		errs = append(errs, m.leave())
	}
	s.mu.Lock()
	listeners := append(s.extra, s.http)
	s.mu.Unlock()
	for _, l := range listeners {
		if l == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		errs = append(errs, l.Shutdown(ctx))
		cancel()
	}
	// Every agent stops before any engine closes: in `serve --nodes N` a
	// slave's agent reads its master's engine directly.
	for _, m := range s.members {
		m.stopAgent()
	}
	for _, m := range s.members {
		errs = append(errs, m.engine.Close())
	}
	if s.engine != nil {
		errs = append(errs, s.engine.Close())
	}
	s.tier.Close() // after the handlers that read it
	if s.reg != nil {
		s.reg.Close()
	}
	if s.cli != nil {
		errs = append(errs, s.cli.Close())
	}
	if s.etcd != nil {
		s.etcd.Close()
	}
	if s.dirLock != nil {
		errs = append(errs, s.dirLock.Close())
	}
	return errors.Join(errs...)
}

// checkLayout refuses to serve a data directory with another number of
// storage nodes than it holds: one node keeps its engine in storage/,
// `serve --nodes N` in node0/ … nodeN-1/. Started otherwise, serve would
// open empty engines beside the data and answer 404 for what it had
// acknowledged. More nodes than the directory holds is growth (the new
// ones start empty and are given partitions); fewer would drop nodes and,
// for partitions with one replica, their data.
func checkLayout(dir string, nodes int) error {
	held := 0
	for ; ; held++ {
		if _, err := os.Stat(filepath.Join(dir, fmt.Sprintf("node%d", held))); err != nil {
			break
		}
	}
	_, err := os.Stat(filepath.Join(dir, "storage"))
	single := err == nil
	switch {
	case nodes > 1 && single:
		return fmt.Errorf("data directory %s holds the storage of a single node (storage/): start it without --nodes", dir)
	case held > 0 && (nodes <= 1 || held > nodes):
		return fmt.Errorf("data directory %s holds the storage of `serve --nodes %d` (node0 … node%d): start it with --nodes %d or more", dir, held, held-1, held)
	}
	return nil
}

// lockDataDir takes the data directory for this process: a second
// process (or a second server in this one) opening it fails at once,
// where it would otherwise wait on etcd's and Pebble's own locks, or
// fail later on some port of the first.
func lockDataDir(dir string) (io.Closer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	name, err := filepath.Abs(filepath.Join(dir, "LOCK"))
	if err != nil {
		return nil, err
	}
	l, err := vfs.Default.Lock(name)
	if err != nil {
		return nil, fmt.Errorf("data directory %s is in use by another process or server (%s: %v)", dir, name, err)
	}
	return l, nil
}

// DemoDatabase creates the demo database the README's examples use, and
// those of its tables that do not exist. What exists is the user's and is
// left as it is: a restart with --demo after the user evolved a demo
// table's schema, or with another --nodes, neither fails nor registers
// the demo's first version again on top of the user's latest.
func (s *Server) DemoDatabase(ctx context.Context) error {
	if _, err := s.reg.Database("demo"); errors.Is(err, registry.ErrNoDatabase) {
		replicas := min(max(s.opts.Nodes, 1), 3)
		if _, _, err := s.Router.CreateDatabase(ctx, "demo", fmt.Appendf(nil, `{"partitions":64,"replicas":%d}`, replicas)); err != nil {
			return fmt.Errorf("demo database: %w", err)
		}
	} else if err != nil {
		return fmt.Errorf("demo database: %w", err)
	}
	for _, t := range demoTables {
		if _, err := s.reg.Table("demo", t.name); !errors.Is(err, registry.ErrNoTable) {
			continue // it exists (or the lookup failed for another reason, which registering would meet too)
		}
		if _, _, err := s.Router.RegisterSchema(ctx, "demo", t.name, []byte(t.def)); err != nil {
			return fmt.Errorf("demo table %s: %w", t.name, err)
		}
	}
	return nil
}

var demoTables = []struct{ name, def string }{
	{"Message", `{"key":[{"name":"mailboxId","type":"string"},{"name":"messageId","type":"long","autoIncrement":true}],
	 "schema":{"type":"record","name":"Message","namespace":"demo","fields":[
	  {"name":"from","type":"string","index":"attribute"},
	  {"name":"subject","type":"string","index":"text"},
	  {"name":"body","type":"string","default":"","index":"text"},
	  {"name":"isInbox","type":"boolean","default":true,"index":"attribute"},
	  {"name":"createdOn","type":"long","default":0,"index":"attribute"},
	  {"name":"labels","type":{"type":"array","items":"string"},"default":[],"index":"attribute"}]}}`},
	{"MailboxStats", `{"key":[{"name":"mailboxId","type":"string"}],
	 "schema":{"type":"record","name":"MailboxStats","namespace":"demo","fields":[
	  {"name":"total","type":"long","default":0},
	  {"name":"unread","type":"long","default":0}]}}`},
	{"Profile", `{"key":[{"name":"memberId","type":"long"}],
	 "schema":{"type":"record","name":"Profile","namespace":"demo","fields":[
	  {"name":"firstName","type":{"type":"map","values":"string"}},
	  {"name":"lastName","type":"string"},
	  {"name":"headline","type":["null","string"],"default":null},
	  {"name":"positions","type":{"type":"map","values":{"type":"record","name":"Position","fields":[
	    {"name":"title","type":"string"},{"name":"company","type":"string"}]}},"default":{}}]}}`},
}

// serveOptions are the internal API's options of this process's storage
// nodes and relay.
func (s *Server) serveOptions() node.ServeOptions {
	return node.ServeOptions{MaxVersion: s.opts.ProtocolVersion, MaxLogStreams: s.opts.MaxLogStreams}
}

// nodeRPC returns a storage node's internal API server, serving m, its
// calls admitted by their own limiter (exported under edge "rpc:" +
// m.id), and m as this process's router calls it (calls dropped for
// their deadline counted there too).
func (s *Server) nodeRPC(m *member) (*wire.Server, *localNode) {
	l := admission.New(s.opts.NodeAdmission)
	expired := new(atomic.Uint64)
	s.Metrics.RegisterAdmission("rpc:"+m.id, l, expired)
	rpc := wire.NewServer(grpc.UnaryInterceptor(admission.UnaryInterceptor(l, expired)))
	node.Register(rpc, m.node, s.serveOptions())
	return rpc, &localNode{n: m.node, expired: expired}
}

// Package server assembles Cortado's roles into processes: coordination
// (embedded or external etcd), the schema registry, the storage engine and
// node, the router, and the HTTP listener with /metrics and /healthz. It
// owns their start order and shuts them down in reverse. `cortado serve`
// (every role) and the embedded client use Open; `cortado storage` and
// `cortado router` use OpenStorage and OpenRouter, against an external etcd.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/coord"
	"github.com/cortado-db/cortado/internal/metrics"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/router"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
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
	Logger  *slog.Logger
	// StorageURL is the storage node a router-only process sends work to.
	StorageURL string
}

// Server is every role of Cortado in one process.
type Server struct {
	Router  *router.Router
	Metrics *metrics.Metrics

	opts    Options
	etcd    *coord.Embedded
	cli     *clientv3.Client
	reg     *registry.Registry
	engine  *storage.Engine
	http    *http.Server
	api     http.Handler
	routeOf func(*http.Request) string

	closeOnce sync.Once
	closeErr  error
}

type localBackend struct{ n node.Service }

func (b localBackend) Node(string, int) (node.Service, error) { return b.n, nil }

// Open starts every role: coordination, registry, storage and router. It
// does not listen; see Serve.
func Open(ctx context.Context, opts Options) (*Server, error) {
	return open(ctx, opts, roleAll)
}

// OpenStorage starts the storage role: registry (on opts.EtcdEndpoints,
// or an embedded etcd), storage engine and node, served by Handler as the
// node's internal API.
func OpenStorage(ctx context.Context, opts Options) (*Server, error) {
	return open(ctx, opts, roleStorage)
}

// OpenRouter starts the router role: registry and router, reaching the
// storage node at opts.StorageURL. It keeps no data.
func OpenRouter(ctx context.Context, opts Options) (*Server, error) {
	return open(ctx, opts, roleRouter)
}

type role int

const (
	roleAll role = iota
	roleStorage
	roleRouter
)

func open(ctx context.Context, opts Options, r role) (_ *Server, err error) {
	if opts.DataDir == "" {
		opts.DataDir = "cortado-data"
	}
	if opts.Prefix == "" {
		opts.Prefix = "/cortado"
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if err := os.MkdirAll(opts.DataDir, 0o755); err != nil {
		return nil, err
	}
	s := &Server{opts: opts, Metrics: metrics.New()}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
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
	if s.reg, err = registry.Open(ctx, s.cli, opts.Prefix, opts.Logger); err != nil {
		return nil, err
	}
	plans := schema.NewPlans(4096)
	var backend router.Backend
	if r == roleRouter {
		if opts.StorageURL == "" {
			return nil, fmt.Errorf("the router role needs the storage node's URL")
		}
		backend = localBackend{node.NewRemote(opts.StorageURL, nil)}
	} else {
		opts.Storage.Logger = opts.Logger
		if s.engine, err = storage.Open(filepath.Join(opts.DataDir, "storage"), opts.Storage); err != nil {
			return nil, err
		}
		s.Metrics.RegisterPebble(s.engine.Metrics)
		// Until the cluster manager assigns roles, a storage node
		// masters every partition.
		n := node.New(s.engine, s.reg, plans, opts.Logger, node.Options{AllMaster: true})
		backend = localBackend{n}
		if r == roleStorage {
			s.api, s.routeOf = node.Handler(n), func(*http.Request) string { return "node" }
			return s, nil
		}
	}
	s.Router = router.New(s.reg, plans, backend, opts.Router, opts.Logger)
	s.api, s.routeOf = s.logRequests(s.Router), router.RouteOf
	return s, nil
}

// Handler is the whole HTTP surface: the document API, /metrics and
// /healthz.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", s.Metrics.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"status":"ok"}`))
	})
	mux.Handle("/", s.Metrics.Instrument(s.api, s.routeOf))
	return mux
}

func (s *Server) logRequests(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		start := time.Now()
		h.ServeHTTP(w, req)
		s.opts.Logger.Debug("request", "method", req.Method, "path", req.URL.Path, "duration", time.Since(start))
	})
}

// Serve serves HTTP on ln until Close.
func (s *Server) Serve(ln net.Listener) error {
	s.http = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	err := s.http.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops serving and closes every role, in reverse start order. It
// may be called more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}

func (s *Server) close() error {
	var errs []error
	if s.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		errs = append(errs, s.http.Shutdown(ctx))
		cancel()
	}
	if s.engine != nil {
		errs = append(errs, s.engine.Close())
	}
	if s.reg != nil {
		s.reg.Close()
	}
	if s.cli != nil {
		errs = append(errs, s.cli.Close())
	}
	if s.etcd != nil {
		s.etcd.Close()
	}
	return errors.Join(errs...)
}

// DemoDatabase creates the demo database the README's examples use. It is
// idempotent.
func (s *Server) DemoDatabase(ctx context.Context) error {
	if _, _, err := s.Router.CreateDatabase(ctx, "demo", []byte(`{"partitions":64}`)); err != nil {
		return fmt.Errorf("demo database: %w", err)
	}
	for _, t := range demoTables {
		if _, _, err := s.Router.RegisterSchema(ctx, "demo", t.name, []byte(t.def)); err != nil {
			return fmt.Errorf("demo table %s: %w", t.name, err)
		}
	}
	return nil
}

var demoTables = []struct{ name, def string }{
	{"Message", `{"key":[{"name":"mailboxId","type":"string"},{"name":"messageId","type":"long","autoIncrement":true}],
	 "schema":{"type":"record","name":"Message","namespace":"demo","fields":[
	  {"name":"from","type":"string"},
	  {"name":"subject","type":"string"},
	  {"name":"body","type":"string","default":""},
	  {"name":"isInbox","type":"boolean","default":true},
	  {"name":"createdOn","type":"long","default":0},
	  {"name":"labels","type":{"type":"array","items":"string"},"default":[]}]}}`},
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

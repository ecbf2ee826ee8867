package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/cortado-db/cortado/internal/router"
	"github.com/cortado-db/cortado/internal/server"
	"github.com/cortado-db/cortado/internal/storage"
)

func runServe(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	dataDir := fs.String("data-dir", "cortado-data", "directory for storage and the embedded etcd")
	listen := fs.String("listen", "127.0.0.1:8080", "HTTP listen address (port 0 picks a free port)")
	etcdEndpoints := fs.String("etcd-endpoints", "", "comma-separated external etcd endpoints; empty starts an embedded etcd")
	etcdClient := fs.String("etcd-client-url", "http://127.0.0.1:2379", "embedded etcd client URL")
	etcdPeer := fs.String("etcd-peer-url", "http://127.0.0.1:2380", "embedded etcd peer URL")
	demo := fs.Bool("demo", false, "create the demo database of the README")
	maxBody := fs.Int64("max-body-bytes", 2<<20, "largest request body; larger is 413")
	maxResp := fs.Int("max-response-bytes", 2<<20, "largest response body; larger is 413")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	readyFile := fs.String("ready-file", "", "write the listen address to this file once serving (for scripts and tests)")
	fs.Parse(args)

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(log)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts := server.Options{
		DataDir:       *dataDir,
		EtcdClientURL: *etcdClient,
		EtcdPeerURL:   *etcdPeer,
		Storage:       storage.Options{},
		Router:        router.Options{MaxBodyBytes: *maxBody, MaxResponseBytes: *maxResp},
		Logger:        log,
	}
	if *etcdEndpoints != "" {
		opts.EtcdEndpoints = strings.Split(*etcdEndpoints, ",")
	}
	s, err := server.Open(ctx, opts)
	if err != nil {
		return err
	}
	defer s.Close()
	if *demo {
		if err := s.DemoDatabase(ctx); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	log.Info("cortado serving", "addr", ln.Addr().String(), "data_dir", *dataDir, "demo", *demo)
	if *readyFile != "" {
		if err := os.WriteFile(*readyFile, []byte(ln.Addr().String()), 0o644); err != nil {
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

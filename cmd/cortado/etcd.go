package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/cortado-db/cortado/internal/coord"
)

// runEtcd runs a single-member etcd, as `serve` embeds it, for a local
// multi-process cluster (scripts/cluster). Production uses a real etcd
// cluster.
func runEtcd(args []string) error {
	fs := flag.NewFlagSet("etcd", flag.ExitOnError)
	dir := fs.String("data-dir", "cortado-etcd", "etcd's data directory")
	client := fs.String("client-url", coord.DefaultClientURL, "client URL")
	peer := fs.String("peer-url", coord.DefaultPeerURL, "peer URL")
	ready := fs.String("ready-file", "", "write the client URL to this file once serving")
	fs.Parse(args)
	e, err := coord.StartEmbedded(coord.EmbeddedOptions{Dir: filepath.Join(*dir, "etcd"), ClientURL: *client, PeerURL: *peer})
	if err != nil {
		return err
	}
	defer e.Close()
	fmt.Fprintln(os.Stderr, "etcd serving at", e.Endpoint)
	if *ready != "" {
		if err := os.WriteFile(*ready, []byte(e.Endpoint), 0o644); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	return nil
}

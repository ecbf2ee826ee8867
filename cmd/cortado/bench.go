package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"

	"github.com/cortado-db/cortado/internal/bench"
)

// runBench is `cortado bench [load|floor|multiget]`: with no subcommand,
// a PUT phase and a GET phase against a router; the subcommands are the
// pieces scripts/bench-peers uses.
func runBench(args []string) error {
	sub := ""
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		sub, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("bench "+sub, flag.ExitOnError)
	c := commonFlags(fs)
	var o bench.Options
	fs.DurationVar(&o.Duration, "duration", 0, "length of each phase (default 10s)")
	fs.IntVar(&o.Workers, "workers", 0, "concurrent requests (default 16)")
	fs.IntVar(&o.DocBytes, "doc-bytes", 0, "document payload size (default 1024)")
	fs.IntVar(&o.Keys, "keys", 0, "distinct documents (default 10000)")
	fs.StringVar(&o.DB, "db", "", "database to create and use (default bench)")
	fs.IntVar(&o.Replicas, "replicas", 0, "load: replicas of the database it creates (default: the server's)")
	listen := fs.String("listen", "127.0.0.1:8090", "floor: listen address")
	rate := fs.Float64("rate", 1000, "multiget: requests per second (open loop)")
	multi := fs.Int("multi", 10, "multiget: keys per request")
	fs.Parse(args)
	o.URL = *c.url
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	switch sub {
	case "":
		phases, err := bench.Run(ctx, o, os.Stderr)
		if err != nil {
			return err
		}
		bench.Print(os.Stdout, o, phases)
	case "load":
		return bench.Load(ctx, o, os.Stderr)
	case "floor":
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			return err
		}
		return bench.Floor(ctx, ln, o)
	case "multiget":
		p, err := bench.OpenLoop(ctx, o, *rate, *multi)
		if err != nil {
			return err
		}
		bench.Print(os.Stdout, o, []bench.Phase{p})
	default:
		return fmt.Errorf("bench: unknown subcommand %q (load, floor, multiget)", sub)
	}
	return nil
}

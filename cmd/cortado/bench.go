package main

import (
	"context"
	"flag"
	"os"
	"os/signal"

	"github.com/cortado-db/cortado/internal/bench"
)

func runBench(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	c := commonFlags(fs)
	var o bench.Options
	fs.DurationVar(&o.Duration, "duration", 0, "length of each phase (default 10s)")
	fs.IntVar(&o.Workers, "workers", 0, "concurrent requests (default 16)")
	fs.IntVar(&o.DocBytes, "doc-bytes", 0, "document payload size (default 1024)")
	fs.IntVar(&o.Keys, "keys", 0, "distinct documents (default 10000)")
	fs.StringVar(&o.DB, "db", "", "database to create and use (default bench)")
	fs.Parse(args)
	o.URL = *c.url
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	phases, err := bench.Run(ctx, o, os.Stderr)
	if err != nil {
		return err
	}
	bench.Print(os.Stdout, o, phases)
	return nil
}

package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cortado-db/cortado/internal/bench"
)

// runBench is `cortado bench [load|floor|multiget|consume|insert|acklag|overload|stall]`: with
// no subcommand, a PUT phase and a GET phase against a router; the
// subcommands are the pieces scripts/bench-peers and scripts/bench-changes
// use.
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
	fs.StringVar(&o.RetainAge, "retain-age", "", "load: retention by age of the database it creates (default: the server's)")
	listen := fs.String("listen", "127.0.0.1:8090", "floor: listen address")
	rate := fs.Float64("rate", 1000, "multiget: requests per second (open loop)")
	stallRate := fs.Float64("read-rate", 0, "stall: reads per second (default: 0.8 of the capacity C found open loop through the first router, as overload finds it)")
	multi := fs.Int("multi", 10, "multiget: keys per request")
	stallMulti := fs.Int("stall-multi", 0, "stall: keys per read, read as multi-gets (default: single-document reads); the default rate is then divided by it")
	accept := fs.String("accept", "", "multiget: the requests' Accept header (application/x-ndjson: streamed; default a page)")
	consumers := fs.Int("consumers", 1, "consume: concurrent consumers")
	expect := fs.Int("expect", 0, "consume: change events each consumer waits for")
	since := fs.String("since", "beginning", "consume: where the stream starts")
	postgres := fs.String("postgres", "", "acklag: measure PostgreSQL at this host:port instead (table docs, trust authentication, pg_recvlogical on --slot)")
	slot := fs.String("slot", "", "acklag: the wal2json replication slot to read with --postgres")
	quiet := fs.Duration("quiet", 0, "consume: stop after this long without a change event, reporting what arrived (0: wait for --expect)")
	wal2json := fs.Bool("wal2json", false, "consume: count wal2json lines (pg_recvlogical) from stdin instead")
	first := fs.Int("first", 0, "insert: id of the first new document")
	servers := fs.String("servers", "", "overload: servers to compare, name=URL,name=URL (each with the bench database loaded)")
	metricsAt := fs.String("metrics", "", "overload: where each server's /metrics is read, name=URL,… (default its own URL; a server's --admin-listen keeps the readings coming when its port is full)")
	multiples := fs.String("multiples", "", "overload: offered loads as multiples of the capacity (default 0.8,1,1.05,1.2,1.5,2,5)")
	capacity := fs.Float64("capacity", 0, "overload: the capacity C in requests/s (default: measured on the first server: the highest rate served in open loop with at most 1 % failed)")
	clientTimeout := fs.Duration("client-timeout", 0, "overload: each request's client timeout (default 1s)")
	out := fs.String("out", "", "overload: directory for the plots (PNG) and the table (overload.md); stall: file for the table")
	routers := fs.String("routers", "", "stall: routers to compare, name=URL,name=URL (in front of the same storage nodes)")
	pid := fs.Int("pid", 0, "stall: the storage process to stop")
	stopAt := fs.Duration("stop-at", 0, "stall: when in each run the process is stopped (default 5s)")
	stopFor := fs.Duration("stop-for", 0, "stall: how long it stays stopped (default 2s)")
	watch := fs.String("watch", "", "stall: the other storage nodes, id=URL,id=URL (their admission metrics are sampled)")
	rounds := fs.Int("rounds", 0, "stall: rounds, the routers interleaved (default 2)")
	profilePath := fs.String("cpu-profile", "", "write a CPU profile of the benchmark's own process to this file (for `go tool pprof`)")
	fs.Parse(args)
	o.URL = *c.url
	stopProfile, err := cpuProfile(*profilePath)
	if err != nil {
		return err
	}
	defer stopProfile()
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
	case "consume":
		var res bench.Consumed
		var err error
		if *wal2json {
			res, err = bench.ConsumeWal2JSON(os.Stdin, *expect)
		} else {
			res, err = bench.ConsumeCortado(ctx, o.URL, o.DB, *since, *consumers, *expect, *quiet)
		}
		fmt.Println(res)
		return err
	case "insert":
		if o.DB == "" {
			o.DB = "bench"
		}
		n, err := bench.Insert(ctx, o, *first, *rate, o.Duration, nil)
		fmt.Println("inserted", n)
		return err
	case "acklag":
		if o.DB == "" {
			o.DB = "bench"
		}
		var res string
		var err error
		if *postgres != "" {
			res, err = bench.AckLagPostgres(ctx, *postgres, *slot, *first, *rate, o.Duration, 8, o.DocBytes)
		} else {
			res, err = bench.AckLag(ctx, o, *first, *rate, o.Duration)
		}
		fmt.Println(res)
		return err
	case "overload":
		oo := bench.OverloadOptions{Options: o, Capacity: *capacity, Timeout: *clientTimeout}
		var ok bool
		if oo.Servers, ok = namedURLs(*servers, nil); !ok {
			return fmt.Errorf("--servers takes name=URL,…")
		}
		if *metricsAt != "" {
			if oo.Metrics, ok = namedURLs(*metricsAt, oo.Servers); !ok {
				return fmt.Errorf("--metrics takes name=URL,… for the names of --servers")
			}
		}
		if *multiples != "" {
			for _, m := range strings.Split(*multiples, ",") {
				v, err := strconv.ParseFloat(m, 64)
				if err != nil || v <= 0 {
					return fmt.Errorf("--multiples: %q", m)
				}
				oo.Multiples = append(oo.Multiples, v)
			}
		}
		c, steps, err := bench.Overload(ctx, oo, os.Stderr)
		if err != nil {
			return err
		}
		bench.OverloadTable(os.Stdout, c, steps)
		if *out != "" {
			f, err := os.Create(filepath.Join(*out, "overload.md"))
			if err != nil {
				return err
			}
			bench.OverloadTable(f, c, steps)
			f.Close()
			return bench.OverloadPlots(*out, c, steps)
		}
	case "stall":
		so := bench.StallOptions{Options: o, Routers: map[string]string{}, Watch: map[string]string{}, Rate: *stallRate, Multi: *stallMulti, PID: *pid,
			StopAt: *stopAt, StopFor: *stopFor, Rounds: *rounds, Timeout: *clientTimeout}
		for flag, m := range map[string]map[string]string{"--routers": so.Routers, "--watch": so.Watch} {
			val := *routers
			if flag == "--watch" {
				val = *watch
			}
			for _, kv := range strings.Split(val, ",") {
				if kv == "" {
					continue
				}
				name, url, ok := strings.Cut(kv, "=")
				if !ok {
					return fmt.Errorf("%s takes name=URL,…", flag)
				}
				m[name] = url
			}
		}
		runs, err := bench.Stall(ctx, &so, os.Stderr)
		if err != nil {
			return err
		}
		bench.StallTable(os.Stdout, so, runs)
		if *out != "" {
			f, err := os.Create(*out)
			if err != nil {
				return err
			}
			bench.StallTable(f, so, runs)
			return f.Close()
		}
	case "multiget":
		p, err := bench.OpenLoop(ctx, o, *rate, *multi, *accept)
		if err != nil {
			return err
		}
		bench.Print(os.Stdout, o, []bench.Phase{p})
	default:
		return fmt.Errorf("bench: unknown subcommand %q (load, floor, multiget, consume, insert, acklag, overload, stall)", sub)
	}
	return nil
}

// namedURLs reads a flag's name=URL,… list; with known, every name must
// be one of its keys.
func namedURLs(v string, known map[string]string) (map[string]string, bool) {
	out := map[string]string{}
	for _, kv := range strings.Split(v, ",") {
		name, url, ok := strings.Cut(kv, "=")
		if _, isKnown := known[name]; !ok || known != nil && !isKnown {
			return nil, false
		}
		out[name] = url
	}
	return out, true
}

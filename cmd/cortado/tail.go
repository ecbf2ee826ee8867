package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"

	"github.com/cortado-db/cortado/client"
)

// runTail follows a database's change stream, one event per line, until
// interrupted; it reconnects from its last token when the connection
// breaks.
func runTail(args []string) error {
	fs := flag.NewFlagSet("tail", flag.ExitOnError)
	c := commonFlags(fs)
	tables := fs.String("tables", "", "comma-separated tables (default: all)")
	fields := fs.String("fields", "", "comma-separated dot paths to project documents to")
	since := fs.String("since", "beginning", "a token from an earlier event, now, or beginning")
	before := fs.Bool("before", false, "add pre-images to updates and deletes")
	txns := fs.Bool("transactions", false, "add BEGIN and END events around transactions")
	version := fs.Int("version", 0, "render documents in this schema version (default: each table's latest); a change it cannot render ends the stream with an error")
	format := fs.String("format", "ndjson", "ndjson: every event as sent (with its token); debezium: the change events' Debezium envelopes only")
	parseArgs(fs, args)
	if fs.NArg() != 1 || strings.Contains(fs.Arg(0), "/") {
		return fmt.Errorf("want one database name")
	}
	if *format != "ndjson" && *format != "debezium" {
		return fmt.Errorf("--format must be ndjson or debezium")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cl := client.New(*c.url)
	defer cl.Close()
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	o := &client.ChangeOptions{Tables: fieldsOf(*tables), Fields: fieldsOf(*fields), Since: *since, Before: *before, Transactions: *txns, Version: *version}
	for e, err := range cl.Changes(ctx, fs.Arg(0), o) {
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		line := e.Raw
		if *format == "debezium" {
			if e.Type != "change" {
				continue
			}
			var env map[string]json.RawMessage
			json.Unmarshal(e.Raw, &env)
			delete(env, "type")
			delete(env, "token")
			line, _ = json.Marshal(env)
		}
		out.Write(line)
		out.WriteByte('\n')
		out.Flush()
	}
	return nil
}

package main

import (
	"compress/gzip"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cortado-db/cortado/client"
)

// runBackup writes a database's backup to a file: written under a
// temporary name and renamed once complete and checked, so the file
// named is a whole backup or nothing.
func runBackup(args []string) error {
	fs := flag.NewFlagSet("backup", flag.ExitOnError)
	c := commonFlags(fs)
	out := fs.String("o", "", "the file to write (required; - for standard output; a name ending in .gz: gzip-compressed)")
	parts := fs.String("partitions", "", "comma-separated partitions (default: all)")
	noDefaultTimeout(fs, "backup")
	parseArgs(fs, args)
	if fs.NArg() != 1 || strings.Contains(fs.Arg(0), "/") {
		return fmt.Errorf("want one database name")
	}
	if *out == "" {
		return fmt.Errorf("-o FILE is required (- for standard output)")
	}
	var o client.BackupOptions
	for _, p := range fieldsOf(*parts) {
		n, err := strconv.Atoi(p)
		if err != nil {
			return fmt.Errorf("--partitions: %q is not a partition number", p)
		}
		o.Partitions = append(o.Partitions, n)
	}
	ctx, stop := untilInterrupted(fs, c)
	defer stop()
	cl := client.New(*c.url)
	defer cl.Close()
	start := time.Now()
	if *out == "-" {
		sum, err := cl.Backup(ctx, fs.Arg(0), os.Stdout, &o)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "backed up %s: %d partitions, %d documents, %d marks, %d bytes in %s\n", sum.Database, sum.Partitions, sum.Rows, sum.Marks, sum.Bytes, time.Since(start).Round(time.Millisecond))
		return nil
	}
	f, err := os.CreateTemp(filepath.Dir(*out), "."+filepath.Base(*out)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // gone once renamed
	var w io.Writer = f
	var zw *gzip.Writer
	if strings.HasSuffix(*out, ".gz") {
		zw, _ = gzip.NewWriterLevel(f, gzip.BestSpeed)
		w = zw
	}
	sum, err := cl.Backup(ctx, fs.Arg(0), w, &o)
	if err == nil && zw != nil {
		err = zw.Close()
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), *out)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "backed up %s to %s: %d partitions, %d documents, %d marks, %d bytes in %s\nchanges after it: cortado tail %s --since %s\n",
		sum.Database, *out, sum.Partitions, sum.Rows, sum.Marks, sum.Bytes, time.Since(start).Round(time.Millisecond), sum.Database, sum.Token)
	return nil
}

// runRestore restores a backup file into a database.
func runRestore(args []string) error {
	fs := flag.NewFlagSet("restore", flag.ExitOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: cortado restore FILE [flags] (FILE as backup wrote it, or gzip-compressed)")
		fs.PrintDefaults()
	}
	c := commonFlags(fs)
	as := fs.String("as", "", "restore into this database (default: the backed-up database's name)")
	existing := fs.Bool("existing", false, "write into a database that exists (resumes an interrupted restore)")
	replicas := fs.Int("replicas", 0, "replicas of the restored database (default: the backup's)")
	parallel := fs.Int("parallel", 4, "partitions written at once")
	quiet := fs.Bool("q", false, "no progress on standard error")
	noDefaultTimeout(fs, "restore")
	parseArgs(fs, args)
	if fs.NArg() != 1 {
		return fmt.Errorf("want one backup file")
	}
	ctx, stop := untilInterrupted(fs, c)
	defer stop()
	cl := client.New(*c.url)
	defer cl.Close()
	start := time.Now()
	o := &client.RestoreOptions{As: *as, Existing: *existing, Replicas: *replicas, Parallel: *parallel}
	last := time.Now()
	if !*quiet {
		o.Progress = func(p client.RestoreProgress) {
			if time.Since(last) >= time.Second {
				last = time.Now()
				fmt.Fprintf(os.Stderr, "%d of %d partitions, %d documents\n", p.PartitionsDone, p.Partitions, p.Rows)
			}
		}
	}
	sum, err := cl.Restore(ctx, client.BackupFile(fs.Arg(0)), o)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "restored %s: %d partitions, %d documents, %d marks in %s (%d requests retried)\n",
		sum.Database, sum.Partitions, sum.Rows, sum.Marks, time.Since(start).Round(time.Millisecond), sum.Retries)
	return nil
}

// noDefaultTimeout makes --timeout a deadline for the whole command,
// none unless given.
func noDefaultTimeout(fs *flag.FlagSet, what string) {
	f := fs.Lookup("timeout")
	f.Usage = "a deadline for the whole " + what + " (default: none)"
	f.DefValue = "0s"
}

// untilInterrupted is a backup's or restore's context: it ends at an
// interrupt, and at --timeout only when the flag is given (a backup
// takes as long as the database is large).
func untilInterrupted(fs *flag.FlagSet, c common) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	timed := false
	fs.Visit(func(f *flag.Flag) { timed = timed || f.Name == "timeout" })
	if !timed {
		return ctx, stop
	}
	ctx, cancel := context.WithTimeout(ctx, *c.timeout)
	return ctx, func() { cancel(); stop() }
}

// Package bench owns `cortado bench`: a closed-loop load generator that
// measures PUT and GET throughput and latency percentiles against a running
// router, through the public client. It only creates and writes its own
// database (default "bench").
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cortado-db/cortado/client"
)

// Options configures a run. Zero values take the defaults noted.
type Options struct {
	URL      string        // router URL
	Duration time.Duration // per phase (default 10s)
	Workers  int           // concurrent requests (default 16)
	DocBytes int           // payload size (default 1024)
	Keys     int           // distinct documents (default 10000)
	DB       string        // database (default "bench")
	Replicas int           // replicas of a database Load creates (default: the server's)
	// RetainAge, when set, is the retention by age of a database Load
	// creates.
	RetainAge string
}

// Phase is the result of one operation's run.
type Phase struct {
	Op         string
	Requests   int
	Errors     int
	Throughput float64 // requests per second
	P50, P99   time.Duration
	Max        time.Duration
}

func (o *Options) fill() {
	if o.Duration == 0 {
		o.Duration = 10 * time.Second
	}
	if o.Workers == 0 {
		o.Workers = 16
	}
	if o.DocBytes == 0 {
		o.DocBytes = 1024
	}
	if o.Keys == 0 {
		o.Keys = 10000
	}
	if o.DB == "" {
		o.DB = "bench"
	}
}

const tableDef = `{"key":[{"name":"id","type":"long"}],"schema":{"type":"record","name":"Doc","fields":[{"name":"n","type":"long"},{"name":"payload","type":"string"}]}}`

// Run creates the bench database, then runs a PUT phase and a GET phase.
func Run(ctx context.Context, o Options, progress io.Writer) ([]Phase, error) {
	o.fill()
	cl := client.New(o.URL)
	defer cl.Close()
	if err := cl.CreateDatabase(ctx, o.DB, client.Database{}); err != nil {
		return nil, fmt.Errorf("create database %s: %w", o.DB, err)
	}
	var def client.TableSchema
	json.Unmarshal([]byte(tableDef), &def)
	if _, err := cl.RegisterSchema(ctx, o.DB, "Doc", def); err != nil {
		return nil, fmt.Errorf("register table: %w", err)
	}
	payload := strings.Repeat("x", o.DocBytes)
	put := func(ctx context.Context, r *rand.Rand) error {
		id := r.IntN(o.Keys)
		_, err := cl.Put(ctx, o.DB, "Doc", client.Key{id}, map[string]any{"n": id, "payload": payload}, nil)
		return err
	}
	get := func(ctx context.Context, r *rand.Rand) error {
		_, err := cl.Get(ctx, o.DB, "Doc", client.Key{r.IntN(o.Keys)}, nil)
		return err
	}
	fmt.Fprintf(progress, "loading %d documents of %d bytes\n", o.Keys, o.DocBytes)
	if err := load(ctx, cl, o, payload); err != nil {
		return nil, err
	}
	var phases []Phase
	for _, p := range []struct {
		name string
		fn   func(context.Context, *rand.Rand) error
	}{{"PUT", put}, {"GET", get}} {
		fmt.Fprintf(progress, "%s: %d workers for %s\n", p.name, o.Workers, o.Duration)
		phases = append(phases, runPhase(ctx, p.name, o, p.fn))
	}
	return phases, nil
}

// putRetrying writes document id, waiting out a server's refusals as
// overloaded (nothing was done) for as long as it asks, a few times.
func putRetrying(ctx context.Context, cl *client.Client, db string, id int, payload string) error {
	for attempt := 0; ; attempt++ {
		_, err := cl.Put(ctx, db, "Doc", client.Key{id}, map[string]any{"n": id, "payload": payload}, nil)
		var e *client.Error
		if attempt == 10 || !errors.Is(err, client.ErrOverloaded) || !errors.As(err, &e) {
			return err
		}
		select {
		case <-time.After(max(e.RetryAfter, 100*time.Millisecond)):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func load(ctx context.Context, cl *client.Client, o Options, payload string) error {
	ids := make(chan int)
	errc := make(chan error, o.Workers)
	var wg sync.WaitGroup
	for range o.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range ids {
				if err := putRetrying(ctx, cl, o.DB, id, payload); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	var err error
feed:
	for id := range o.Keys {
		select {
		case ids <- id:
		case err = <-errc:
			break feed
		}
	}
	close(ids)
	wg.Wait()
	if err == nil && len(errc) > 0 {
		err = <-errc
	}
	return err
}

func runPhase(ctx context.Context, name string, o Options, fn func(context.Context, *rand.Rand) error) Phase {
	ctx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	lat := make([][]time.Duration, o.Workers)
	errs := make([]int, o.Workers)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range o.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			for ctx.Err() == nil {
				t := time.Now()
				err := fn(ctx, r)
				if ctx.Err() != nil {
					return // cut off by the end of the phase
				}
				if err != nil {
					errs[w]++
					continue
				}
				lat[w] = append(lat[w], time.Since(t))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	var all []time.Duration
	p := Phase{Op: name}
	for w := range lat {
		all = append(all, lat[w]...)
		p.Errors += errs[w]
	}
	slices.Sort(all)
	p.Requests = len(all)
	p.Throughput = float64(len(all)) / elapsed.Seconds()
	if len(all) > 0 {
		p.P50 = all[len(all)/2]
		p.P99 = all[len(all)*99/100]
		p.Max = all[len(all)-1]
	}
	return p
}

// Print writes phases as a table.
func Print(w io.Writer, o Options, phases []Phase) {
	o.fill()
	fmt.Fprintf(w, "%d workers, %d-byte documents, %d keys\n", o.Workers, o.DocBytes, o.Keys)
	fmt.Fprintf(w, "%-4s %10s %8s %12s %10s %10s %10s\n", "op", "requests", "errors", "req/s", "p50", "p99", "max")
	for _, p := range phases {
		fmt.Fprintf(w, "%-4s %10d %8d %12.0f %10s %10s %10s\n", p.Op, p.Requests, p.Errors, p.Throughput,
			p.P50.Round(time.Microsecond), p.P99.Round(time.Microsecond), p.Max.Round(time.Microsecond))
	}
}

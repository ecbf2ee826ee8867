package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cortado-db/cortado/client"
)

// The pieces scripts/bench-peers runs Cortado's peers with: the same
// documents loaded everywhere, a bare net/http floor serving them from a
// map, and an open-loop generator for latency at a fixed rate.

// Load creates the bench database and table and writes documents 0 …
// Keys-1, each {"n": id, "payload": DocBytes × "x"}.
func Load(ctx context.Context, o Options, progress io.Writer) error {
	o.fill()
	cl := client.New(o.URL)
	defer cl.Close()
	def := client.Database{Replicas: o.Replicas}
	if o.RetainAge != "" {
		def.Retention = &client.Retention{MaxAge: o.RetainAge}
	}
	if err := cl.CreateDatabase(ctx, o.DB, def); err != nil {
		return fmt.Errorf("create database %s: %w", o.DB, err)
	}
	var table client.TableSchema
	json.Unmarshal([]byte(tableDef), &table)
	if _, err := cl.RegisterSchema(ctx, o.DB, "Doc", table); err != nil {
		return fmt.Errorf("register table: %w", err)
	}
	fmt.Fprintf(progress, "loading %d documents of %d bytes\n", o.Keys, o.DocBytes)
	return load(ctx, cl, o, strings.Repeat("x", o.DocBytes))
}

// DocumentJSON is the JSON of bench document id, as Cortado returns it.
func DocumentJSON(id, docBytes int) []byte {
	return fmt.Appendf(nil, `{"n":%d,"payload":"%s"}`, id, strings.Repeat("x", docBytes))
}

// Floor serves GET and PUT of /{db}/Doc/{id} from an in-memory map with
// nothing else: the fastest any HTTP document server on this machine can
// be, the floor Cortado is compared with. It serves until ctx ends.
func Floor(ctx context.Context, ln net.Listener, o Options) error {
	o.fill()
	var mu sync.RWMutex
	docs := make(map[string][]byte, o.Keys)
	for id := range o.Keys {
		docs[fmt.Sprint(id)] = DocumentJSON(id, o.DocBytes)
	}
	prefix := "/" + o.DB + "/Doc/"
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, ok := strings.CutPrefix(r.URL.Path, prefix)
		if !ok {
			http.NotFound(w, r)
			return
		}
		switch r.Method {
		case http.MethodGet:
			mu.RLock()
			b, ok := docs[k]
			mu.RUnlock()
			if !ok {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.Write(b)
		case http.MethodPut:
			b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			mu.Lock()
			docs[k] = b
			mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
		default:
			http.Error(w, "method", http.StatusMethodNotAllowed)
		}
	})
	s := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	if err := s.Serve(ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}

// OpenLoop sends multi-gets of multiKeys random documents at rate
// requests per second for Duration, each at its scheduled time whether
// or not earlier ones have answered, and measures latency from the
// scheduled time (so a stall counts for every request it delays). It
// sends them with the overload test's generator (offer): raw HTTP/1.1 on
// a pool of connections, where net/http's client, a goroutine and tens of
// microseconds a request, took a share of the two cores the server
// needed. accept, when set, is the requests' Accept header
// (application/x-ndjson: streamed multi-gets, whole only with their end
// line). A request not answered within 30 s fails.
func OpenLoop(ctx context.Context, o Options, rate float64, multiKeys int, accept string) (Phase, error) {
	o.fill()
	const timeout = 30 * time.Second
	header := ""
	if accept != "" {
		header = "Accept: " + accept + "\r\n"
	}
	var mu sync.Mutex
	var lat []time.Duration
	errs := 0
	start := time.Now()
	err := offer(ctx, o.URL, rate, o.Duration, timeout, openLoad{
		write: func(bw *bufio.Writer, r *rand.Rand, host string) bool {
			fmt.Fprintf(bw, "GET /%s/Doc/(", o.DB)
			for j := range multiKeys {
				if j > 0 {
					bw.WriteByte(',')
				}
				bw.WriteString(strconv.Itoa(r.IntN(o.Keys)))
			}
			fmt.Fprintf(bw, ") HTTP/1.1\r\nHost: %s\r\n%s\r\n", host, header)
			return false
		},
		answer: func(_ time.Time, took time.Duration, a answer) {
			mu.Lock()
			defer mu.Unlock()
			if a.status != http.StatusOK || took > timeout || accept != "" && !bytes.Contains(a.tail, []byte(`{"end":true`)) {
				errs++
				return
			}
			lat = append(lat, took)
		},
		tail: accept != "",
	})
	if err != nil {
		return Phase{}, err
	}
	slices.Sort(lat)
	p := Phase{Op: fmt.Sprintf("MGET%d", multiKeys), Requests: len(lat), Errors: errs, Throughput: float64(len(lat)) / time.Since(start).Seconds()}
	if len(lat) > 0 {
		p.P50, p.P99, p.Max = lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1]
	}
	return p, nil
}

// waitUntil returns at time at, or sooner with ctx's error.
func waitUntil(ctx context.Context, at time.Time) error {
	d := time.Until(at)
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

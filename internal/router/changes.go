package router

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cortado-db/cortado/internal/changes"
	"github.com/cortado-db/cortado/internal/problem"
	"github.com/cortado-db/cortado/internal/wire"
)

// RouteChanges labels change-stream requests in metrics.
const RouteChanges = "changes"

// Change-stream media types.
const (
	MediaNDJSON = "application/x-ndjson"
	MediaSSE    = "text/event-stream"
)

// SetChanges makes the router serve GET /{db}/_changes from feed.
func (r *Router) SetChanges(feed *changes.Feed) { r.changes = feed }

// serveChanges answers GET /{db}/_changes: the database's change stream,
// as NDJSON or (Accept: text/event-stream) Server-Sent Events whose ids
// are resume tokens.
func (r *Router) serveChanges(w http.ResponseWriter, req *http.Request, db string) {
	if req.Method != http.MethodGet {
		methodNotAllowed(w, "GET")
		return
	}
	sse := false
	for _, a := range acceptRanges(req.Header.Get("Accept")) {
		if a.q > 0 && a.mt == MediaSSE {
			sse = true
		}
	}
	if !r.openStream(w) {
		return
	}
	defer r.streams.Add(-1)
	stream, err := r.OpenChanges(req.Context(), db, req.URL.Query(), req.Header.Get("Last-Event-ID"))
	if err != nil {
		r.fail(w, Problem(err))
		return
	}
	// Through any wrapper (metrics) to the connection. Each write must
	// be taken within WriteTimeout: a consumer that stops reading is cut
	// off then, rather than holding this stream forever.
	rc := http.NewResponseController(w)
	w = deadlineWriter{w, rc, r.opts.WriteTimeout}
	h := w.Header()
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	if sse {
		h.Set("Content-Type", MediaSSE)
	} else {
		h.Set("Content-Type", MediaNDJSON)
	}
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 32<<10)
	emit := func(e changes.Event) error {
		if sse {
			bw.WriteString("id: ")
			bw.WriteString(e.Token)
			bw.WriteString("\nevent: ")
			bw.WriteString(e.Kind)
			bw.WriteString("\ndata: ")
			bw.Write(e.JSON)
			_, err := bw.WriteString("\n\n")
			return err
		}
		bw.Write(e.JSON)
		return bw.WriteByte('\n')
	}
	flush := func() error {
		if err := bw.Flush(); err != nil {
			return err
		}
		return rc.Flush()
	}
	flush() // the headers, at once: the consumer knows it is connected
	// The stream runs until the consumer goes or the process stops.
	ctx, stop := untilStopping(req.Context())
	defer stop()
	stream.Run(ctx, emit, flush)
}

// openStream counts a change stream or backup in, or answers 503 when the
// router serves its most.
func (r *Router) openStream(w http.ResponseWriter) bool {
	if r.streams.Add(1) <= int64(r.opts.MaxStreams) {
		return true
	}
	r.streams.Add(-1)
	p := problem.New(http.StatusServiceUnavailable, problem.TypeOverloaded, "Overloaded",
		fmt.Sprintf("this router serves at most %d change streams and backups at once; retry after a pause or through another router", r.opts.MaxStreams))
	p.RetryAfter = 1
	r.fail(w, p)
	return false
}

// untilStopping returns a context that ends with ctx or when the process
// starts stopping (wire.Stopping), whichever is first; stop releases it
// and waits for the goroutine watching.
func untilStopping(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	stopping := wire.Stopping(ctx)
	if stopping == nil {
		return ctx, cancel
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(); <-done }
}

// deadlineWriter renews the connection's write deadline before each
// write.
type deadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

func (d deadlineWriter) Write(p []byte) (int, error) {
	d.rc.SetWriteDeadline(time.Now().Add(d.timeout))
	return d.ResponseWriter.Write(p)
}

// Streams is how many change streams this router serves now.
func (r *Router) Streams() int64 { return r.streams.Load() }

// AnswersLetGo is how many log answers the router's change-stream readers
// let go for want of room in their streams (changes.Feed.AnswersLetGo).
func (r *Router) AnswersLetGo() uint64 {
	if r.changes == nil {
		return 0
	}
	return r.changes.AnswersLetGo()
}

// OpenChanges checks a change-stream request (the query parameters of
// GET /{db}/_changes, and a Last-Event-ID header's value) and returns the
// stream to run.
func (r *Router) OpenChanges(ctx context.Context, db string, q url.Values, lastEventID string) (*changes.Stream, error) {
	if r.changes == nil {
		return nil, problem.New(http.StatusNotFound, problem.TypeMalformed, "Not found", "this process serves no change stream")
	}
	d, err := r.reg.Database(db)
	if err != nil {
		return nil, err
	}
	creq, err := changesRequest(q, lastEventID, d.Name, d.Partitions)
	if err != nil {
		return nil, err
	}
	return r.changes.Open(ctx, creq)
}

// changesRequest reads a change-stream request's parameters.
func changesRequest(q url.Values, lastEventID, db string, partitions int) (changes.Request, error) {
	bad := func(format string, a ...any) (changes.Request, error) {
		return changes.Request{}, &changes.RequestError{Err: fmt.Errorf(format, a...)}
	}
	for name, values := range q {
		switch name {
		case "tables", "partitions", "fields": // lists: each value adds
		case "before", "version", "transactions", "since", "heartbeat":
			if len(values) > 1 {
				return bad("%q is given %d times; give it once", name, len(values))
			}
		default:
			return bad("unknown parameter %q (tables, partitions, fields, before, version, transactions, since, heartbeat)", name)
		}
	}
	c := changes.Request{DB: db}
	list := func(name string) []string {
		var out []string
		for _, v := range q[name] {
			for _, s := range strings.Split(v, ",") {
				if s = strings.TrimSpace(s); s != "" {
					out = append(out, s)
				}
			}
		}
		return out
	}
	c.Tables = list("tables")
	c.Fields = list("fields")
	if len(c.Tables) > 256 || len(c.Fields) > 256 {
		return bad("at most 256 tables and 256 fields")
	}
	var err error
	if c.Partitions, err = partitionNumbers(list("partitions"), db, partitions); err != nil {
		return bad("%v", err)
	}
	flag := func(name string) (bool, error) {
		switch q.Get(name) {
		case "", "false":
			return false, nil
		case "true":
			return true, nil
		}
		return false, &changes.RequestError{Err: fmt.Errorf("%s must be true or false", name)}
	}
	if c.Before, err = flag("before"); err != nil {
		return c, err
	}
	if c.Transactions, err = flag("transactions"); err != nil {
		return c, err
	}
	if v := q.Get("version"); v != "" {
		if c.Version, err = strconv.Atoi(v); err != nil || c.Version < 1 {
			return bad("version must be a schema version number")
		}
	}
	if v := q.Get("heartbeat"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 100*time.Millisecond || d > time.Minute {
			return bad("heartbeat must be a duration from 100ms to 1m")
		}
		c.Heartbeat = d
	}
	since := q.Get("since")
	if since == "" {
		since = lastEventID
	}
	switch since {
	case "", "beginning":
		c.Since = changes.SinceBeginning
	case "now":
		c.Since = changes.SinceNow
	default:
		if c.Token, err = changes.ParseToken(db, partitions, since); err != nil {
			return c, err
		}
	}
	return c, nil
}

// partitionNumbers reads the numbers of partitions of database db, which
// has partitions of them: in the order given, each once.
func partitionNumbers(texts []string, db string, partitions int) ([]int, error) {
	var out []int
	for _, p := range texts {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 0 || n >= partitions {
			return nil, fmt.Errorf("partition %q: database %s has partitions 0 to %d", p, db, partitions-1)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

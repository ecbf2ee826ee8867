package router

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/cortado-db/cortado/internal/backup"
	"github.com/cortado-db/cortado/internal/problem"
)

// Route names of backups and restores in metrics.
const (
	RouteBackup  = "backup"
	RouteRestore = "restore"
)

// RestoreBodyBytes bounds a restore request's body, whatever
// Options.MaxBodyBytes says: it holds the lines of a backup, a document
// of the largest body a router takes (base64, 4/3 of it) among them.
const RestoreBodyBytes = 24 << 20

// Backup is a backup request checked and ready to run.
type Backup struct {
	r     *Router
	db    string
	parts []int
}

// OpenBackup checks a backup request (the query parameters of GET
// /{db}/_backup: partitions=0,5, all when absent).
func (r *Router) OpenBackup(db string, q url.Values) (*Backup, error) {
	if r.changes == nil {
		return nil, problem.New(http.StatusNotFound, problem.TypeMalformed, "Not found", "this process serves no backups (it serves no change stream)")
	}
	if bad := checkParams(q, "a backup", "partitions"); bad != nil {
		return nil, bad
	}
	d, err := r.reg.Database(db)
	if err != nil {
		return nil, err
	}
	b := &Backup{r: r, db: d.Name}
	if v := q.Get("partitions"); v != "" {
		if b.parts, err = partitionNumbers(strings.Split(v, ","), d.Name, d.Partitions); err != nil {
			return nil, malformed("Malformed backup request", err.Error())
		}
	}
	return b, nil
}

// Run writes the backup to w, calling flush after each partition. An
// error after the first line leaves it without its end line.
func (b *Backup) Run(ctx context.Context, w io.Writer, flush func() error) (backup.Summary, error) {
	d := backup.Dumper{Sources: b.r.changes.Sources, Reg: b.r.reg, Logger: b.r.log}
	return d.Dump(ctx, b.db, b.parts, w, flush)
}

// serveBackup answers GET /{db}/_backup[?partitions=0,5]: the database's
// definition, tables and documents, a partition at a time, each
// consistent at one SCN of its partition (internal/backup).
func (r *Router) serveBackup(w http.ResponseWriter, req *http.Request, db string) {
	if req.Method != http.MethodGet {
		methodNotAllowed(w, "GET")
		return
	}
	q, bad := parseQuery(req)
	if bad != nil {
		r.fail(w, bad)
		return
	}
	b, err := r.OpenBackup(db, q)
	if err != nil {
		r.fail(w, Problem(err))
		return
	}
	if !r.openStream(w) {
		return
	}
	defer r.streams.Add(-1)
	rc := http.NewResponseController(w)
	w = deadlineWriter{w, rc, r.opts.WriteTimeout}
	w.Header().Set("Content-Type", MediaNDJSON)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 64<<10)
	flush := func() error {
		if err := bw.Flush(); err != nil {
			return err
		}
		return rc.Flush()
	}
	ctx, stop := untilStopping(req.Context())
	defer stop()
	if _, err := b.Run(ctx, bw, flush); err != nil && ctx.Err() == nil {
		// The status is sent: the last line says why the backup
		// stopped, and its missing end line that it is incomplete.
		line, _ := json.Marshal(backup.ErrorLine{Type: backup.TypeError, Error: Problem(err)})
		bw.Write(append(line, '\n'))
		flush()
	}
}

// Restore writes a restore body — row and mark lines of a backup — to
// db: every line is checked first (one bad line writes nothing), then
// the documents and marks are written a partition's batch at a time.
// It answers {"rows","marks","commits"}. A failure midway may have made
// some of the commits: the same body sent again writes the same
// documents.
func (r *Router) Restore(ctx context.Context, db string, body []byte) ([]byte, error) {
	d, err := r.reg.Database(db)
	if err != nil {
		return nil, err
	}
	plan, err := backup.Read(r.reg, d.Name, body)
	if err != nil {
		return nil, err
	}
	for i, wr := range plan.Requests {
		if _, err := r.write(ctx, &target{db: d, part: wr.Partition}, wr.Ops); err != nil {
			p := Problem(err)
			if i > 0 {
				p.Detail += fmt.Sprintf(" (%d of this request's %d commits were made before; sending it again writes the same documents)", i, len(plan.Requests))
			}
			return nil, p
		}
	}
	return json.Marshal(map[string]int{"rows": plan.Rows, "marks": plan.Marks, "commits": len(plan.Requests)})
}

// serveRestore answers POST /{db}/_restore (application/x-ndjson).
func (r *Router) serveRestore(w http.ResponseWriter, req *http.Request, db string) {
	if req.Method != http.MethodPost {
		methodNotAllowed(w, "POST")
		return
	}
	if err := Params(req, "a restore"); err != nil {
		r.fail(w, err)
		return
	}
	if mt, _, err := bodyMedia(req); err != nil || mt != MediaNDJSON {
		if err == nil {
			err = fmt.Errorf("%w: %q (a restore takes %s: the row and mark lines of a backup)", ErrUnsupportedMedia, req.Header.Get("Content-Type"), MediaNDJSON)
		}
		r.fail(w, Problem(err))
		return
	}
	if cond, err := preconditions(req); err != nil || !cond.Empty() {
		r.fail(w, problem.New(http.StatusBadRequest, problem.TypeMalformed, "Conditional header does not apply", "a restore writes unconditionally"))
		return
	}
	// Counted before the body is read: the bound is on memory.
	if r.restores.Add(1) > int64(r.opts.MaxRestores) {
		r.restores.Add(-1)
		p := problem.New(http.StatusServiceUnavailable, problem.TypeOverloaded, "Overloaded",
			fmt.Sprintf("this router serves at most %d restore requests at once; retry after a pause", r.opts.MaxRestores))
		p.RetryAfter = 1
		r.fail(w, p)
		return
	}
	defer r.restores.Add(-1)
	if _, err := r.reg.Database(db); err != nil {
		r.fail(w, Problem(err))
		return
	}
	body, err := r.readBodyUpTo(w, req, RestoreBodyBytes)
	if err != nil {
		r.fail(w, Problem(err))
		return
	}
	out, err := r.Restore(req.Context(), db, body)
	if err != nil {
		r.fail(w, Problem(err))
		return
	}
	writeJSON(w, http.StatusOK, out)
}

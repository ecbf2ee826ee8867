package router

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cortado-db/cortado/internal/admission"
	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/problem"
	"github.com/cortado-db/cortado/internal/storage"
)

// Response headers.
const (
	HeaderSCN = "X-Cortado-SCN"
	// HeaderReplica says a slave answered (a read with max-stale).
	HeaderReplica = "X-Cortado-Replica"
	// HeaderCache says the router's hot-key cache answered (a read with
	// max-stale; Age says how old its answer may be).
	HeaderCache         = "X-Cortado-Cache"
	HeaderSchemaVersion = "X-Cortado-Schema-Version"
	MediaAvro           = "avro/binary"
)

// Route names label metrics.
const (
	RouteDocument   = "document"
	RouteCollection = "collection"
	RouteMultiGet   = "multiget"
	RouteTxn        = "txn"
	RouteSchemata   = "schemata"
)

// RouteOf names the route of a request for metrics, without parsing it
// fully.
func RouteOf(req *http.Request) string {
	p := req.URL.EscapedPath()
	switch {
	case strings.HasPrefix(p, "/_schemata"):
		return RouteSchemata
	case strings.Contains(p, "/_txn/"):
		return RouteTxn
	case strings.HasSuffix(p, ")"):
		return RouteMultiGet
	case strings.HasSuffix(p, "/_changes"):
		return RouteChanges
	case strings.HasSuffix(p, "/_backup"):
		return RouteBackup
	case strings.HasSuffix(p, "/_restore"):
		return RouteRestore
	}
	return RouteDocument
}

// ClassOf is a request's priority under overload: the change stream and
// backups are shed before document traffic, schema administration and
// restores before both.
func ClassOf(req *http.Request) admission.Class {
	switch RouteOf(req) {
	case RouteChanges, RouteBackup:
		return admission.Stream
	case RouteSchemata, RouteRestore:
		return admission.Bulk
	}
	return admission.Interactive
}

// ServeHTTP serves the document API and the schema registry.
func (r *Router) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	// The response must be taken within WriteTimeout of the request's
	// deadline; without a deadline, the response may take as long as the
	// request did. (The change stream renews it with each write.)
	deadline := time.Time{}
	if d, ok := req.Context().Deadline(); ok {
		deadline = d.Add(r.opts.WriteTimeout)
	}
	http.NewResponseController(w).SetWriteDeadline(deadline)
	raw := strings.Split(strings.TrimPrefix(req.URL.EscapedPath(), "/"), "/")
	if len(raw) == 1 && raw[0] == "" {
		r.fail(w, problem.New(http.StatusNotFound, problem.TypeMalformed, "Not found", "paths are /{db}/{table}/{key…} or /_schemata/{db}[/{table}]"))
		return
	}
	// Paths are taken as sent, never cleaned or redirected: a segment
	// that is empty, "." or ".." names nothing (escape a key that is:
	// %2E%2E). A trailing "/" is an empty segment too: trimmed, DELETE
	// /demo/Message/alice/ (a document's key with an empty last part, as
	// a client joining parts would send) would delete the collection.
	for _, seg := range raw {
		switch seg {
		case "":
			r.fail(w, problem.New(http.StatusBadRequest, problem.TypeMalformed, "Malformed path", `a path segment is empty (a "//" or a trailing "/"): key parts may not be empty`))
			return
		case ".", "..":
			r.fail(w, problem.New(http.StatusBadRequest, problem.TypeMalformed, "Malformed path", `a path segment is "." or "..": percent-encode such a key part (%2E)`))
			return
		}
	}
	if raw[0] == "_schemata" {
		if len(raw) == 1 {
			r.serveDatabases(w, req)
			return
		}
		if err := Params(req, "a schema request"); err != nil {
			r.fail(w, err)
			return
		}
		r.serveSchemata(w, req, raw[1:])
		return
	}
	if len(raw) == 2 && raw[1] == "_changes" {
		r.serveChanges(w, req, raw[0])
		return
	}
	if len(raw) == 2 && raw[1] == "_backup" {
		r.serveBackup(w, req, raw[0])
		return
	}
	if len(raw) == 2 && raw[1] == "_restore" {
		r.serveRestore(w, req, raw[0])
		return
	}
	if len(raw) >= 2 && raw[1] == "_txn" {
		if err := Params(req, "a transaction"); err != nil {
			r.fail(w, err)
			return
		}
		r.serveTxn(w, req, raw)
		return
	}
	if len(raw) < 2 {
		r.fail(w, problem.New(http.StatusNotFound, problem.TypeMalformed, "Not found", "document paths are /{db}/{table}/{key…}"))
		return
	}
	segs, err := unescapeAll(raw)
	if err != nil {
		r.fail(w, Problem(&keyError{err}))
		return
	}
	db, table, key := segs[0], segs[1], segs[2:]
	// Multi-get: the last segment is (a,b,c).
	if n := len(raw); n > 2 && strings.HasPrefix(raw[n-1], "(") && strings.HasSuffix(raw[n-1], ")") {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			methodNotAllowed(w, "GET, HEAD")
			return
		}
		q, bad := parseQuery(req)
		if bad == nil {
			bad = checkParams(q, "a multi-get", "fields")
		}
		if bad != nil {
			r.fail(w, bad)
			return
		}
		elems := strings.Split(raw[n-1][1:len(raw[n-1])-1], ",")
		keyTexts := make([][]string, len(elems))
		for i, e := range elems {
			v, err := url.PathUnescape(e)
			if err != nil {
				r.fail(w, Problem(&keyError{err}))
				return
			}
			keyTexts[i] = append(append([]string(nil), key[:len(key)-1]...), v)
		}
		f, err := readFormat(req, q)
		if err != nil {
			r.fail(w, Problem(err))
			return
		}
		if f.Lines {
			r.streamMultiGet(w, req, db, table, keyTexts, f)
			return
		}
		page, err := r.MultiGet(req.Context(), db, table, keyTexts, f)
		if err != nil {
			r.fail(w, Problem(err))
			return
		}
		writePage(w, req, page)
		return
	}
	r.serveDocument(w, req, db, table, key)
}

func (r *Router) serveDocument(w http.ResponseWriter, req *http.Request, db, table string, key []string) {
	ctx := req.Context()
	cond, err := preconditions(req)
	if err != nil {
		r.fail(w, problem.New(http.StatusBadRequest, problem.TypeMalformed, "Malformed conditional header", err.Error()))
		return
	}
	switch req.Method {
	case http.MethodPut, http.MethodPost, http.MethodPatch, http.MethodDelete:
		if bad := Params(req, "a write"); bad != nil {
			r.fail(w, bad)
			return
		}
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead:
		q, bad := parseQuery(req)
		f, err := readFormat(req, q)
		if err == nil && f.Lines {
			err = errLinesMulti
		}
		if err != nil {
			r.fail(w, Problem(err))
			return
		}
		if bad != nil {
			r.fail(w, bad)
			return
		}
		// A query may leave out the partition key: all partitions.
		tg, err := r.resolve(db, table, key, q.Has("query"))
		if err != nil {
			r.fail(w, Problem(err))
			return
		}
		switch {
		case r.full(tg):
			bad = checkParams(q, "a document read", "fields")
		case q.Has("query"):
			bad = checkParams(q, "a query", "fields", "limit", "next", "query", "sort")
		default:
			bad = checkParams(q, "a collection read", "fields", "limit", "next")
		}
		if bad != nil {
			r.fail(w, bad)
			return
		}
		if !r.full(tg) {
			limit := 0
			if s := q.Get("limit"); s != "" {
				if limit, err = strconv.Atoi(s); err != nil || limit < 1 {
					r.fail(w, malformed("Bad query parameter", fmt.Sprintf("limit must be a positive integer, not %q", s)))
					return
				}
			}
			var page *Page
			if q.Has("query") {
				page, err = r.Query(ctx, db, table, key, q.Get("query"), q.Get("sort"), limit, q.Get("next"), f)
			} else {
				page, err = r.Collection(ctx, db, table, key, limit, q.Get("next"), f)
			}
			if err != nil {
				r.fail(w, Problem(err))
				return
			}
			writePage(w, req, page)
			return
		}
		r.serveGet(w, req, tg, f, cond)
	case http.MethodPut, http.MethodPost:
		if req.Method == http.MethodPost && !cond.Empty() {
			// Not ignored: the caller would take its insert for a
			// conditional write.
			r.fail(w, problem.New(http.StatusBadRequest, problem.TypeMalformed, "Conditional header does not apply",
				"conditional headers apply to one existing document; a POST makes a new one (to create a document only if it is absent, PUT it with If-None-Match: *)"))
			return
		}
		avroVersion, err := bodyFormat(req)
		if err != nil {
			r.fail(w, Problem(err))
			return
		}
		body, err := r.readBody(w, req)
		if err != nil {
			r.fail(w, Problem(err))
			return
		}
		var res *WriteResult
		if req.Method == http.MethodPut {
			res, err = r.Put(ctx, db, table, key, body, avroVersion, cond)
		} else {
			res, err = r.Insert(ctx, db, table, key, body, avroVersion)
		}
		if err != nil {
			r.fail(w, Problem(err))
			return
		}
		writeResult(w, req, db, table, res)
	case http.MethodPatch:
		if err := jsonBody(req); err != nil {
			r.fail(w, Problem(err))
			return
		}
		body, err := r.readBody(w, req)
		if err != nil {
			r.fail(w, Problem(err))
			return
		}
		res, err := r.Patch(ctx, db, table, key, body, cond)
		if err != nil {
			r.fail(w, Problem(err))
			return
		}
		writeResult(w, req, db, table, res)
	case http.MethodDelete:
		res, err := r.Delete(ctx, db, table, key, cond)
		if err != nil {
			r.fail(w, Problem(err))
			return
		}
		writeResult(w, req, db, table, res)
	default:
		methodNotAllowed(w, "GET, HEAD, PUT, POST, PATCH, DELETE")
	}
}

func (r *Router) serveTxn(w http.ResponseWriter, req *http.Request, raw []string) {
	if req.Method != http.MethodPost {
		methodNotAllowed(w, "POST")
		return
	}
	if len(raw) != 3 {
		r.fail(w, Problem(&keyError{fmt.Errorf("transactions are POST /{db}/_txn/{partitionKey}")}))
		return
	}
	if err := jsonBody(req); err != nil {
		r.fail(w, Problem(err))
		return
	}
	if cond, err := preconditions(req); err != nil || !cond.Empty() {
		// Not ignored: the caller would take the transaction for a
		// conditional one.
		r.fail(w, problem.New(http.StatusBadRequest, problem.TypeMalformed, "Conditional header does not apply",
			`a transaction's conditions are its operations' own ("ifMatch", "ifNoneMatch"), not headers`))
		return
	}
	segs, err := unescapeAll(raw)
	if err != nil {
		r.fail(w, Problem(&keyError{err}))
		return
	}
	body, err := r.readBody(w, req)
	if err != nil {
		r.fail(w, Problem(err))
		return
	}
	res, err := r.Txn(req.Context(), segs[0], segs[2], body)
	if err != nil {
		r.fail(w, Problem(err))
		return
	}
	w.Header().Set(HeaderSCN, res.SCN.String())
	writeJSON(w, http.StatusOK, res.Body)
}

// serveDatabases answers GET /_schemata: a page of the databases, in
// name order, after the one named by after.
func (r *Router) serveDatabases(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		methodNotAllowed(w, "GET, HEAD")
		return
	}
	q, bad := parseQuery(req)
	if bad == nil {
		bad = checkParams(q, "a list of databases", "after", "limit")
	}
	if bad != nil {
		r.fail(w, bad)
		return
	}
	limit := 0 // Databases' default
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxDatabasesPage {
			r.fail(w, malformed("Bad query parameter", fmt.Sprintf("limit must be a whole number from 1 to %d, not %q", MaxDatabasesPage, s)))
			return
		}
		limit = n
	}
	writeJSON(w, http.StatusOK, r.Databases(q.Get("after"), limit))
}

func (r *Router) serveSchemata(w http.ResponseWriter, req *http.Request, raw []string) {
	segs, err := unescapeAll(raw)
	if err != nil || len(segs) == 0 || segs[0] == "" || len(segs) > 3 {
		r.fail(w, problem.New(http.StatusNotFound, problem.TypeMalformed, "Not found", "schema paths are /_schemata/{db}[/{table}[/{version}|/_config]]"))
		return
	}
	ctx := req.Context()
	switch {
	case req.Method == http.MethodPut:
		if err := jsonBody(req); err != nil {
			r.fail(w, Problem(err))
			return
		}
	case req.Method == http.MethodPatch && len(segs) == 1:
		if err := mergePatchBody(req); err != nil {
			r.fail(w, Problem(err))
			return
		}
	}
	var (
		body    []byte
		created bool
	)
	switch {
	case len(segs) == 1 && req.Method == http.MethodPut:
		if body, err = r.readBody(w, req); err == nil {
			body, created, err = r.CreateDatabase(ctx, segs[0], body)
		}
	case len(segs) == 1 && req.Method == http.MethodPatch:
		if body, err = r.readBody(w, req); err == nil {
			body, err = r.AlterDatabase(ctx, segs[0], body)
		}
	case len(segs) == 1 && (req.Method == http.MethodGet || req.Method == http.MethodHead):
		body, err = r.DatabaseInfo(segs[0])
	case len(segs) == 2 && req.Method == http.MethodPut:
		if body, err = r.readBody(w, req); err == nil {
			body, created, err = r.RegisterSchema(ctx, segs[0], segs[1], body)
		}
	case len(segs) == 2 && (req.Method == http.MethodGet || req.Method == http.MethodHead):
		body, err = r.TableInfo(segs[0], segs[1])
	case len(segs) == 3 && segs[2] == "_config" && req.Method == http.MethodPut:
		if body, err = r.readBody(w, req); err == nil {
			body, err = r.SetCompatibility(ctx, segs[0], segs[1], body)
		}
	case len(segs) == 3 && segs[2] == "_config":
		methodNotAllowed(w, "PUT")
		return
	case len(segs) == 3 && (req.Method == http.MethodGet || req.Method == http.MethodHead):
		v, perr := strconv.Atoi(segs[2])
		if perr != nil {
			r.fail(w, Problem(&keyError{fmt.Errorf("schema version %q is not a number", segs[2])}))
			return
		}
		body, err = r.SchemaVersion(segs[0], segs[1], v)
	case len(segs) == 3:
		methodNotAllowed(w, "GET, HEAD")
		return
	case len(segs) == 1:
		methodNotAllowed(w, "GET, HEAD, PUT, PATCH")
		return
	default:
		methodNotAllowed(w, "GET, HEAD, PUT")
		return
	}
	if err != nil {
		r.fail(w, Problem(err))
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, body)
}

// readBody reads a request body within the size limit and the body
// timeout. A client that sends too slowly is cut off (408), one that goes
// away is a canceled request (499 in the metrics), and a body that is not
// valid HTTP (a malformed chunk) is 400.
func (r *Router) readBody(w http.ResponseWriter, req *http.Request) ([]byte, error) {
	return r.readBodyUpTo(w, req, r.opts.MaxBodyBytes)
}

// readBodyUpTo is readBody with a size limit of its own.
func (r *Router) readBodyUpTo(w http.ResponseWriter, req *http.Request, limit int64) ([]byte, error) {
	if req.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	rc := http.NewResponseController(w)
	deadline := rc.SetReadDeadline(time.Now().Add(r.opts.BodyTimeout)) == nil
	b, err := readAll(http.MaxBytesReader(w, req.Body, limit), req.ContentLength)
	if err != nil {
		// The connection is of no further use; the expired deadline
		// keeps the server from waiting for the rest of the body.
		w.Header().Set("Connection", "close")
	} else if deadline {
		rc.SetReadDeadline(time.Time{})
	}
	var mbe *http.MaxBytesError
	switch {
	case err == nil:
		return b, nil
	case errors.As(err, &mbe):
		return nil, err
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, errBodyTimeout
	case req.Context().Err() != nil, errors.Is(err, io.ErrUnexpectedEOF):
		return nil, context.Canceled // the client went away mid-body
	}
	return nil, &bodyError{err}
}

// readAll reads a body of size bytes (-1: unknown) into a buffer of its
// size: io.ReadAll grows one from 512 bytes, allocating twice a 1 KB
// document's size to read it. A body declared larger than
// exactAllocation is read as it arrives, so that a client that declares a
// large body and sends little holds no more memory than it sent.
func readAll(body io.Reader, size int64) ([]byte, error) {
	if size <= 0 || size > exactAllocation {
		return io.ReadAll(body)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(body, b); err != nil {
		return nil, err
	}
	return b, nil
}

const exactAllocation = 64 << 10

func unescapeAll(raw []string) ([]string, error) {
	out := make([]string, len(raw))
	for i, s := range raw {
		v, err := url.PathUnescape(s)
		if err != nil {
			return nil, fmt.Errorf("bad path segment %s", quoteShort(s))
		}
		out[i] = v
	}
	return out, nil
}

// Params checks a request's query parameters (checkParams): only those
// it takes (allowed), each once, in a well-formed query string; what
// names the request in the refusal. Other HTTP endpoints of the process
// use it too.
func Params(req *http.Request, what string, allowed ...string) *problem.Problem {
	q, bad := parseQuery(req)
	if bad == nil {
		bad = checkParams(q, what, allowed...)
	}
	return bad
}

// parseQuery parses a request's query string (nil without one, as most
// requests have), refusing a malformed one (a ";" separator, a bad
// escape), which req.URL.Query would silently cut short.
func parseQuery(req *http.Request) (url.Values, *problem.Problem) {
	if req.URL.RawQuery == "" {
		return nil, nil
	}
	q, err := url.ParseQuery(req.URL.RawQuery)
	if err != nil {
		return nil, problem.New(http.StatusBadRequest, problem.TypeMalformed, "Malformed query string", err.Error())
	}
	return q, nil
}

// malformed is a request's query parameter it cannot take: 400
// malformed-request.
func malformed(title, detail string) *problem.Problem {
	return problem.New(http.StatusBadRequest, problem.TypeMalformed, title, detail)
}

// checkParams checks query parameters q: only those the request takes
// (allowed), each at most once. A parameter it does not take is refused,
// not ignored: DELETE /db/T/k?query=from:bob would otherwise delete the
// whole collection its caller meant to filter, and ?feilds= would read
// every field.
func checkParams(q url.Values, what string, allowed ...string) *problem.Problem {
	if len(q) == 0 {
		return nil
	}
	takes := "none"
	if n := len(allowed); n > 0 {
		takes = allowed[n-1]
		if n > 1 {
			takes = strings.Join(allowed[:n-1], ", ") + " and " + takes
		}
	}
	names := slices.Sorted(maps.Keys(q)) // the same answer for the same request
	for _, name := range names {
		if !slices.Contains(allowed, name) {
			return malformed("Unknown query parameter", fmt.Sprintf("%q is not a parameter of %s, which takes %s", name, what, takes))
		}
		if len(q[name]) > 1 {
			return malformed("Repeated query parameter", fmt.Sprintf("%q is given %d times; give it once", name, len(q[name])))
		}
	}
	return nil
}

// readFormat reads Accept and ?fields= (of q, the request's query
// parameters, parsed once by its caller).
func readFormat(req *http.Request, q url.Values) (Format, error) {
	f := Format{MaxStale: maxStale(req), PartialOK: preferPartial(req)}
	if fields := q.Get("fields"); fields != "" { // most reads have none
		for _, p := range strings.Split(fields, ",") {
			if p = strings.TrimSpace(p); p != "" {
				f.Fields = append(f.Fields, p)
			}
		}
	}
	accept := req.Header.Get("Accept")
	switch accept {
	case "", "application/json", "*/*": // the common ones, without parsing
		return f, nil
	}
	ranges := acceptRanges(accept)
	for _, a := range ranges {
		if a.q == 0 {
			break // the rest are refused too
		}
		mt := a.mt
		if mt == "application/*" || mt == "*/*" {
			// A wildcard means JSON, unless JSON itself was refused
			// (q=0): then there is nothing it could mean here.
			if refused(ranges, "application/json") {
				continue
			}
			mt = "application/json"
		}
		switch mt {
		case "application/json", MediaAvro, MediaNDJSON:
			if cs, ok := a.params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
				continue // JSON is UTF-8 only
			}
			f.Avro = mt == MediaAvro
			f.Lines = mt == MediaNDJSON
			if v := a.params["version"]; v != "" {
				n, err := strconv.Atoi(v)
				if err != nil || n < 0 {
					return f, fmt.Errorf("%w: version parameter %q must be a non-negative integer", ErrNotAcceptable, v)
				}
				f.Version = n
			}
			return f, nil
		}
	}
	return f, fmt.Errorf("%w: %q (use application/json, avro/binary; version=N, or for multi-gets application/x-ndjson)", ErrNotAcceptable, accept)
}

// acceptRange is one media range of an Accept header.
type acceptRange struct {
	mt     string
	params map[string]string // without q
	q      float64
}

// acceptRanges parses an Accept header (RFC 9110 §12.5.1) into its media
// ranges, most preferred first (by q; ties in the header's order). Ranges
// with q=0 are kept, at the end, so that refused can find them; a range
// that does not parse, or whose q is malformed, is left out.
func acceptRanges(accept string) []acceptRange {
	var out []acceptRange
	for _, part := range strings.Split(accept, ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		q := 1.0
		if v, ok := params["q"]; ok {
			if q, err = strconv.ParseFloat(v, 64); err != nil || q < 0 || q > 1 {
				continue
			}
			delete(params, "q")
		}
		out = append(out, acceptRange{mt, params, q})
	}
	slices.SortStableFunc(out, func(a, b acceptRange) int { return cmp.Compare(b.q, a.q) })
	return out
}

// refused reports whether the ranges name media type mt with q=0: "not
// acceptable".
func refused(ranges []acceptRange, mt string) bool {
	return slices.ContainsFunc(ranges, func(a acceptRange) bool { return a.q == 0 && a.mt == mt })
}

// bodyFormat reads Content-Type: 0 for JSON, N for avro/binary; version=N.
func bodyFormat(req *http.Request) (int, error) {
	mt, params, err := bodyMedia(req)
	switch {
	case err != nil:
		return 0, err
	case mt == "" || mt == "application/json":
		return 0, nil
	case mt == MediaAvro:
		n, err := strconv.Atoi(params["version"])
		if err != nil || n < 1 {
			return 0, fmt.Errorf("%w: avro/binary bodies need version=N naming their schema version", ErrUnsupportedMedia)
		}
		return n, nil
	}
	return 0, fmt.Errorf("%w: %q (use application/json or avro/binary; version=N)", ErrUnsupportedMedia, req.Header.Get("Content-Type"))
}

// jsonBody checks the body of a call that takes only JSON (a patch, a
// transaction, a schema call): declared as JSON, or not declared.
func jsonBody(req *http.Request) error { return bodyOneOf(req, "application/json") }

// mergePatchBody checks that a request body is a JSON merge patch
// (application/merge-patch+json, RFC 7396) or JSON, or undeclared.
func mergePatchBody(req *http.Request) error {
	return bodyOneOf(req, "application/merge-patch+json", "application/json")
}

// bodyOneOf checks that a request body is of one of the media types
// given, or undeclared.
func bodyOneOf(req *http.Request, types ...string) error {
	mt, _, err := bodyMedia(req)
	if err == nil && mt != "" && !slices.Contains(types, mt) {
		err = fmt.Errorf("%w: %q (this call takes %s)", ErrUnsupportedMedia, req.Header.Get("Content-Type"), strings.Join(types, " or "))
	}
	return err
}

// bodyMedia is a request body's media type ("" when undeclared) and its
// parameters. A body in a content coding (gzip, br…) would be read as
// its coded bytes, and JSON in a charset other than UTF-8 (RFC 8259)
// could pass as UTF-8 and be stored as other characters: both are
// refused, never stored as something they are not.
func bodyMedia(req *http.Request) (string, map[string]string, error) {
	for _, v := range req.Header.Values("Content-Encoding") {
		for _, c := range strings.Split(v, ",") {
			if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
				return "", nil, fmt.Errorf("%w: Content-Encoding %q (bodies are read as sent; send them uncoded)", ErrUnsupportedMedia, c)
			}
		}
	}
	ct := req.Header.Get("Content-Type")
	if ct == "" {
		return "", nil, nil
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return "", nil, fmt.Errorf("%w: %q", ErrUnsupportedMedia, ct)
	}
	if cs, ok := params["charset"]; ok && mt == "application/json" && !strings.EqualFold(cs, "utf-8") {
		return "", nil, fmt.Errorf("%w: charset %q (JSON bodies are UTF-8)", ErrUnsupportedMedia, cs)
	}
	return mt, params, nil
}

// preconditions reads the conditional headers. An If-Match or
// If-None-Match that is present but empty or not a list of entity tags
// (RFC 9110 §8.8.3) is an error: taking it as absent would turn a
// compare-and-swap into an unconditional write.
func preconditions(req *http.Request) (node.Preconditions, error) {
	var c node.Preconditions
	var err error
	if c.IfMatch, err = etagList(req.Header, "If-Match"); err != nil {
		return c, err
	}
	if c.IfNoneMatch, err = etagList(req.Header, "If-None-Match"); err != nil {
		return c, err
	}
	// Unparseable dates are ignored, as RFC 9110 requires.
	if v := req.Header.Get("If-Modified-Since"); v != "" {
		if t, err := http.ParseTime(v); err == nil {
			c.IfModifiedSince = t
		}
	}
	if v := req.Header.Get("If-Unmodified-Since"); v != "" {
		if t, err := http.ParseTime(v); err == nil {
			c.IfUnmodifiedSince = t
		}
	}
	return c, nil
}

// etagList parses a header of entity tags: "*", or a comma-separated
// list of "opaque" or W/"opaque". Absent is nil; present but empty or
// malformed is an error.
func etagList(h http.Header, name string) ([]string, error) {
	values, present := h[name]
	if !present {
		return nil, nil
	}
	var out []string
	for _, v := range values {
		for _, t := range strings.Split(v, ",") {
			t = strings.TrimSpace(t)
			if t == "" {
				continue
			}
			if t != "*" && !validETag(t) {
				return nil, fmt.Errorf("%s: %s is not an entity tag (\"…\" or W/\"…\")", name, quoteShort(t))
			}
			out = append(out, t)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s is present but names no entity tag", name)
	}
	return out, nil
}

// validETag reports whether t is an entity-tag (RFC 9110 §8.8.3).
func validETag(t string) bool {
	t = strings.TrimPrefix(t, "W/")
	if len(t) < 2 || t[0] != '"' || t[len(t)-1] != '"' {
		return false
	}
	for _, c := range []byte(t[1 : len(t)-1]) {
		if c == '"' || c < 0x21 || c == 0x7f {
			return false
		}
	}
	return true
}

// quoteShort quotes s for an error detail, cut to a few dozen bytes.
func quoteShort(s string) string {
	if len(s) > 40 {
		return strconv.Quote(s[:37]) + "…"
	}
	return strconv.Quote(s)
}

// serveGet answers a read of one document. A JSON body is rendered into
// a pooled buffer, returned to the pool once written.
func (r *Router) serveGet(w http.ResponseWriter, req *http.Request, tg *target, f Format, cond node.Preconditions) {
	buf := bodyBuffers.get(0)
	defer func() { bodyBuffers.put(buf, *buf) }()
	doc, err := r.get(req.Context(), tg, f, cond, (*buf)[:0])
	if errors.Is(err, node.ErrNotModified) {
		docHeaders(w, doc)
		w.WriteHeader(http.StatusNotModified)
		return
	}
	if err != nil {
		if doc != nil { // a slave's not found: how stale it may be
			staleHeaders(w.Header(), doc)
		}
		r.fail(w, Problem(err))
		return
	}
	docHeaders(w, doc)
	h := w.Header()
	v := []string{strconv.Itoa(doc.BodyVersion), strconv.Itoa(len(doc.Body))}
	h[keySchemaVersion], h["Content-Length"] = v[0:1:1], v[1:2:2]
	if f.Avro {
		// A projection is not version N's encoding: say which
		// fields it carries, so nothing decodes it as the whole.
		ct := fmt.Sprintf("%s; version=%d", MediaAvro, doc.BodyVersion)
		if len(f.Fields) > 0 {
			ct += fmt.Sprintf("; fields=%q", strings.Join(f.Fields, ","))
		}
		h.Set("Content-Type", ct)
	} else {
		h["Content-Type"] = contentTypeJSON
		*buf = doc.Body[:0] // the buffer, grown if it had to
	}
	w.WriteHeader(http.StatusOK)
	if req.Method == http.MethodGet {
		w.Write(doc.Body)
	}
}

// bodyBuffers hold the JSON bodies of document reads.
var bodyBuffers = &bufferPool{initial: 4 << 10, max: 64 << 10}

// Header values every document response carries, shared: net/http only
// reads them (Header.Set would allocate a slice per response).
var (
	contentTypeJSON = []string{"application/json"}
	varyAccept      = []string{"Accept"}
)

// Canonical forms of the header names document responses set directly.
var (
	keySCN           = http.CanonicalHeaderKey(HeaderSCN)
	keySchemaVersion = http.CanonicalHeaderKey(HeaderSchemaVersion)
)

func docHeaders(w http.ResponseWriter, d *Document) {
	h := w.Header()
	h["Vary"] = varyAccept
	// One array holds the values (Header.Set allocates a slice each).
	v := []string{d.ETag, httpDate(d.Modified), d.SCN.String()}
	h["Etag"], h["Last-Modified"], h[keySCN] = v[0:1:1], v[1:2:2], v[2:3:3]
	staleHeaders(h, d)
}

// staleHeaders says what answered a read other than the master, and how
// stale the answer may be.
func staleHeaders(h http.Header, d *Document) {
	if d.FromSlave || d.FromCache || d.FromTier {
		// RFC 9111 Age: how long the answer may have been stale.
		h.Set("Age", strconv.Itoa(AgeSeconds(d.Stale)))
	}
	if d.FromSlave {
		h.Set(HeaderReplica, "slave")
	}
	switch {
	case d.FromCache:
		h.Set(HeaderCache, "hit")
	case d.FromTier:
		h.Set(HeaderCache, "redis")
	}
}

// AgeSeconds is an Age header's value for an answer that may be stale
// by up to d: whole seconds, rounded up (the embedded client reports its
// Age the same way), from 0 to a year whatever a node said.
func AgeSeconds(d time.Duration) int {
	d = min(max(d, 0), AnyStaleness)
	return int((d + time.Second - 1) / time.Second)
}

// AnyStaleness is the bound of Cache-Control: max-stale without a value
// (any staleness is accepted).
const AnyStaleness = 365 * 24 * time.Hour

// httpDate formats t as HTTP's dates are (http.TimeFormat), without
// time.Format's parsing of the layout on every document read.
func httpDate(t time.Time) string {
	t = t.UTC()
	yy, mm, dd := t.Date()
	if yy < 0 || yy > 9999 {
		return t.Format(http.TimeFormat)
	}
	hh, mn, ss := t.Clock()
	day := "SunMonTueWedThuFriSat"[3*t.Weekday():]
	mon := "JanFebMarAprMayJunJulAugSepOctNovDec"[3*(mm-1):]
	b := [29]byte{day[0], day[1], day[2], ',', ' ',
		byte('0' + dd/10), byte('0' + dd%10), ' ',
		mon[0], mon[1], mon[2], ' ',
		byte('0' + yy/1000), byte('0' + (yy/100)%10), byte('0' + (yy/10)%10), byte('0' + yy%10), ' ',
		byte('0' + hh/10), byte('0' + hh%10), ':', byte('0' + mn/10), byte('0' + mn%10), ':', byte('0' + ss/10), byte('0' + ss%10),
		' ', 'G', 'M', 'T'}
	return string(b[:])
}

// maxStale reads Cache-Control: max-stale[=seconds] (RFC 9111 §5.2.1.2):
// without a value any staleness is accepted.
func maxStale(req *http.Request) time.Duration {
	for _, v := range req.Header.Values("Cache-Control") {
		for _, d := range strings.Split(v, ",") {
			d = strings.TrimSpace(strings.ToLower(d))
			if d == "max-stale" {
				return AnyStaleness
			}
			if s, ok := strings.CutPrefix(d, "max-stale="); ok {
				if n, err := strconv.Atoi(strings.Trim(s, `"`)); err == nil && n > 0 {
					return time.Duration(n) * time.Second
				}
			}
		}
	}
	return 0
}

// HeaderMissingPartitions lists the partitions a partial answer lacks.
const HeaderMissingPartitions = "X-Cortado-Missing-Partitions"

// preferPartial reports whether the request says Prefer: partial-ok
// (RFC 7240 preferences, comma-separated).
func preferPartial(req *http.Request) bool {
	for _, v := range req.Header.Values("Prefer") {
		for _, p := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(p), "partial-ok") {
				return true
			}
		}
	}
	return false
}

func writePage(w http.ResponseWriter, req *http.Request, p *Page) {
	defer p.Release()
	w.Header()["Vary"] = varyAccept // a multi-get may be streamed instead
	if p.FromSlave {
		w.Header().Set("Age", strconv.Itoa(AgeSeconds(p.Stale)))
		w.Header().Set(HeaderReplica, "slave")
	}
	if p.SCN != (storage.SCN{}) {
		w.Header().Set(HeaderSCN, p.SCN.String())
	}
	if preferPartial(req) {
		w.Header().Set("Preference-Applied", "partial-ok")
		if len(p.MissingPartitions) > 0 {
			w.Header().Set(HeaderMissingPartitions, string(appendInts(nil, p.MissingPartitions)))
		}
	}
	etag := fmt.Sprintf(`W/"%08x"`, crc(p.Body))
	w.Header().Set("ETag", etag)
	// If-None-Match compares weakly (RFC 9110 §13.1.2).
	if tags, err := etagList(req.Header, "If-None-Match"); err == nil {
		for _, t := range tags {
			if t == "*" || strings.TrimPrefix(t, "W/") == strings.TrimPrefix(etag, "W/") {
				w.WriteHeader(http.StatusNotModified)
				return
			}
		}
	}
	if req.Method == http.MethodHead {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		return
	}
	writeJSON(w, http.StatusOK, p.Body)
}

// streamMultiGet answers a multi-get as NDJSON, partition by partition
// (StreamMultiGet). Nothing is sent before the first partition answers,
// so a multi-get that fails before that is a problem as usual. The last
// line is {"end":true,"documents":N,"missingKeys":M} — with
// "missingPartitions" (and the trailer X-Cortado-Missing-Partitions) when
// a partial-ok answer lacks some: a stream without it is incomplete.
// A failure after the first lines ends the stream with
// {"error":{problem}} instead.
func (r *Router) streamMultiGet(w http.ResponseWriter, req *http.Request, db, table string, keyTexts [][]string, f Format) {
	rc := http.NewResponseController(w)
	started := false
	var gone error // the client's connection failed: nothing more to say
	start := func() {
		started = true
		h := w.Header()
		h.Set("Content-Type", MediaNDJSON)
		h.Set("X-Content-Type-Options", "nosniff")
		h["Vary"] = varyAccept
		if f.PartialOK {
			h.Set("Preference-Applied", "partial-ok")
			h.Set("Trailer", HeaderMissingPartitions)
		}
		w.WriteHeader(http.StatusOK)
	}
	end, err := r.StreamMultiGet(req.Context(), db, table, keyTexts, f, func(lines []byte, remote bool) error {
		if !started {
			start()
		}
		if req.Method == http.MethodHead {
			return nil
		}
		if _, gone = w.Write(lines); gone != nil {
			return gone
		}
		if !remote {
			return nil // the writer sends what fills its buffer; the rest follows soon
		}
		gone = rc.Flush()
		return gone
	})
	if gone != nil {
		return
	}
	if err != nil {
		p := Problem(err)
		if !started {
			r.fail(w, p)
			return
		}
		if p.Status >= 500 && p.Type == problem.TypeInternal {
			r.log.Error("internal error ending a stream", "detail", p.Detail)
		}
		b, _ := json.Marshal(map[string]any{"error": p})
		w.Write(append(b, '\n'))
		return
	}
	if !started {
		start()
	}
	if len(end.MissingPartitions) > 0 {
		w.Header().Set(HeaderMissingPartitions, string(appendInts(nil, end.MissingPartitions)))
	}
	w.Write(end.AppendLine(nil))
}

func writeResult(w http.ResponseWriter, req *http.Request, db, table string, res *WriteResult) {
	h := w.Header()
	h.Set(HeaderSCN, res.SCN.String())
	if res.ETag != "" {
		h.Set("ETag", res.ETag)
		h.Set("Last-Modified", httpDate(res.Modified))
	}
	status := http.StatusNoContent
	if res.Created {
		status = http.StatusCreated
		h.Set("Location", location(db, table, res.Key))
	}
	if res.Body != nil {
		if status == http.StatusNoContent {
			status = http.StatusOK
		}
		writeJSON(w, status, res.Body)
		return
	}
	w.WriteHeader(status)
}

func location(db, table string, key []keys.Part) string {
	var b strings.Builder
	b.WriteString("/" + url.PathEscape(db) + "/" + url.PathEscape(table))
	for _, p := range key {
		b.WriteString("/" + url.PathEscape(p.String()))
	}
	return b.String()
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}

// fail answers with p. An internal error is a bug or a failure nothing
// else names: it is logged, so an operator sees more than a client's 500.
func (r *Router) fail(w http.ResponseWriter, p *problem.Problem) {
	if p.Status >= 500 && p.Type == problem.TypeInternal {
		r.log.Error("internal error answered", "detail", p.Detail)
	}
	problem.Write(w, p)
}

func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	problem.Write(w, problem.New(http.StatusMethodNotAllowed, problem.TypeMethodNotAllowed, "Method not allowed", "allowed: "+allow))
}

func crc(b []byte) uint32 { return crc32.ChecksumIEEE(b) }

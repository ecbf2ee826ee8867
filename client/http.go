package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Option configures an HTTP client.
type Option func(*httpTransport)

// WithHTTPClient sets the *http.Client used (default: one with bounded
// idle connections per host and no overall timeout; use contexts).
func WithHTTPClient(hc *http.Client) Option { return func(t *httpTransport) { t.hc = hc } }

// WithClientID names this client in every request (X-Cortado-Client, at
// most 128 bytes): a router started with --quota-rate gives each name its
// own quota, and answers one over it 429 quota-exceeded (ErrQuotaExceeded,
// with Error.RetryAfter).
func WithClientID(id string) Option { return func(t *httpTransport) { t.clientID = id } }

// New returns a client of the router at baseURL (e.g.
// "http://127.0.0.1:8080").
func New(baseURL string, opts ...Option) *Client {
	t := &httpTransport{base: strings.TrimSuffix(baseURL, "/"), hc: &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: 64, MaxConnsPerHost: 256, IdleConnTimeout: 90 * time.Second},
	}}
	for _, o := range opts {
		o(t)
	}
	return &Client{t: t, local: newLocalSchemas()}
}

type httpTransport struct {
	base     string
	hc       *http.Client
	clientID string
}

// prepare sets what every request carries: the client's name, and the
// caller's deadline as Request-Timeout, so that the router and its
// storage nodes drop the work once nobody waits for it (without it, a
// router gives a request its --request-timeout, 30 s by default, however
// early the caller gave up).
func (t *httpTransport) prepare(ctx context.Context, req *http.Request) {
	if t.clientID != "" {
		req.Header.Set("X-Cortado-Client", t.clientID)
	}
	if dl, ok := ctx.Deadline(); ok {
		req.Header.Set("Request-Timeout", requestTimeout(time.Until(dl)))
	}
}

// requestTimeout is a Request-Timeout value for a deadline d from now:
// whole milliseconds, at least one (a deadline already past fails in the
// client before anything is sent).
func requestTimeout(d time.Duration) string {
	return strconv.FormatInt(max(1, d.Milliseconds()), 10) + "ms"
}

// problemOf is the *Error of an answer with status ≥ 400 and body b.
func problemOf(resp *http.Response, b []byte) *Error {
	e := &Error{Status: resp.StatusCode, Title: http.StatusText(resp.StatusCode)}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		json.Unmarshal(b, e)
		e.Status = resp.StatusCode
	}
	e.RetryAfter = retryAfter(resp.Header.Get("Retry-After"), time.Now())
	return e
}

// retryAfter reads a Retry-After header (RFC 9110: delay-seconds or an
// HTTP-date) as a wait from now; 0 when absent, malformed or past.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(n) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil && at.After(now) {
		return at.Sub(now)
	}
	return 0
}

func (t *httpTransport) Close() error {
	t.hc.CloseIdleConnections()
	return nil
}

func docPath(db, table string, key []string) string {
	var b strings.Builder
	b.WriteString("/" + url.PathEscape(db) + "/" + url.PathEscape(table))
	for _, k := range key {
		b.WriteString("/" + segment(k))
	}
	return b.String()
}

// segment escapes a key part as one path segment. A part that is "." or
// ".." is percent-encoded whole, as the server asks: url.PathEscape leaves
// dots alone, and a path segment "." or ".." is refused.
func segment(k string) string {
	switch k {
	case ".":
		return "%2E"
	case "..":
		return "%2E%2E"
	}
	return url.PathEscape(k)
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (t *httpTransport) do(ctx context.Context, method, path string, query url.Values, header http.Header, body []byte) (*response, error) {
	u := t.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if body != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	t.prepare(ctx, req)
	resp, err := t.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	r := &response{status: resp.StatusCode, header: resp.Header, body: b}
	if resp.StatusCode == http.StatusNotModified {
		return r, ErrNotModified
	}
	if resp.StatusCode >= 400 {
		return r, problemOf(resp, b)
	}
	return r, nil
}

func condHeaders(h http.Header, c *Conditions) http.Header {
	if h == nil {
		h = http.Header{}
	}
	if c == nil {
		return h
	}
	if c.IfMatch != "" {
		h.Set("If-Match", c.IfMatch)
	}
	if c.IfNoneMatch != "" {
		h.Set("If-None-Match", c.IfNoneMatch)
	}
	if !c.IfModifiedSince.IsZero() {
		h.Set("If-Modified-Since", c.IfModifiedSince.UTC().Format(http.TimeFormat))
	}
	if !c.IfUnmodifiedSince.IsZero() {
		h.Set("If-Unmodified-Since", c.IfUnmodifiedSince.UTC().Format(http.TimeFormat))
	}
	return h
}

func readQuery(o *ReadOptions) (url.Values, http.Header) {
	q, h := url.Values{}, http.Header{}
	if o == nil {
		return q, h
	}
	if len(o.Fields) > 0 {
		q.Set("fields", strings.Join(o.Fields, ","))
	}
	if o.Version > 0 {
		h.Set("Accept", fmt.Sprintf("application/json; version=%d", o.Version))
	}
	if o.PartialOK {
		h.Set("Prefer", "partial-ok")
	}
	switch {
	case o.MaxStale < 0:
		h.Set("Cache-Control", "max-stale")
	case o.MaxStale > 0:
		h.Set("Cache-Control", "max-stale="+strconv.FormatInt(int64((o.MaxStale+time.Second-1)/time.Second), 10))
	}
	condHeaders(h, &o.Conditions)
	return q, h
}

func (t *httpTransport) CreateDatabase(ctx context.Context, name string, body []byte) error {
	_, err := t.do(ctx, http.MethodPut, "/_schemata/"+url.PathEscape(name), nil, nil, body)
	return err
}

func (t *httpTransport) AlterDatabase(ctx context.Context, name string, patch []byte) error {
	_, err := t.do(ctx, http.MethodPatch, "/_schemata/"+url.PathEscape(name), nil, nil, patch)
	return err
}

func (t *httpTransport) RegisterSchema(ctx context.Context, db, table string, body []byte) (int, error) {
	r, err := t.do(ctx, http.MethodPut, "/_schemata/"+url.PathEscape(db)+"/"+url.PathEscape(table), nil, nil, body)
	if err != nil {
		return 0, err
	}
	var v struct{ Version int }
	return v.Version, json.Unmarshal(r.body, &v)
}

func (t *httpTransport) TableInfo(ctx context.Context, db, table string) ([]byte, error) {
	r, err := t.do(ctx, http.MethodGet, "/_schemata/"+url.PathEscape(db)+"/"+url.PathEscape(table), nil, nil, nil)
	if err != nil {
		return nil, err
	}
	return r.body, nil
}

func (t *httpTransport) Databases(ctx context.Context, after string, limit int) ([]byte, error) {
	q := url.Values{}
	if after != "" {
		q.Set("after", after)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	r, err := t.do(ctx, http.MethodGet, "/_schemata", q, nil, nil)
	if err != nil {
		return nil, err
	}
	return r.body, nil
}

func (t *httpTransport) DatabaseInfo(ctx context.Context, db string) ([]byte, error) {
	r, err := t.do(ctx, http.MethodGet, "/_schemata/"+url.PathEscape(db), nil, nil, nil)
	if err != nil {
		return nil, err
	}
	return r.body, nil
}

func (t *httpTransport) SetCompatibility(ctx context.Context, db, table string, body []byte) error {
	_, err := t.do(ctx, http.MethodPut, "/_schemata/"+url.PathEscape(db)+"/"+url.PathEscape(table)+"/_config", nil, nil, body)
	return err
}

func (t *httpTransport) SchemaVersion(ctx context.Context, db, table string, version int) ([]byte, error) {
	r, err := t.do(ctx, http.MethodGet, "/_schemata/"+url.PathEscape(db)+"/"+url.PathEscape(table)+"/"+strconv.Itoa(version), nil, nil, nil)
	if err != nil {
		return nil, err
	}
	return r.body, nil
}

func (t *httpTransport) Get(ctx context.Context, db, table string, key []string, o *ReadOptions, avro bool) (*Document, error) {
	q, h := readQuery(o)
	if avro {
		v := 0
		if o != nil {
			v = o.Version
		}
		h.Set("Accept", fmt.Sprintf("avro/binary; version=%d", v))
	}
	r, err := t.do(ctx, http.MethodGet, docPath(db, table, key), q, h, nil)
	if err != nil && r == nil {
		return nil, err
	}
	d := &Document{Key: keyOf(key), SCN: r.header.Get("X-Cortado-SCN"), ETag: r.header.Get("ETag"), Body: r.body}
	d.LastModified, _ = http.ParseTime(r.header.Get("Last-Modified"))
	d.SchemaVersion, _ = strconv.Atoi(r.header.Get("X-Cortado-Schema-Version"))
	if age, err := strconv.ParseInt(r.header.Get("Age"), 10, 64); err == nil {
		d.Age = seconds(age)
	}
	d.FromReplica, d.Cache = r.header.Get("X-Cortado-Replica"), r.header.Get("X-Cortado-Cache")
	return d, err
}

func keyOf(texts []string) Key {
	k := make(Key, len(texts))
	for i, s := range texts {
		k[i] = s
	}
	return k
}

func (t *httpTransport) Collection(ctx context.Context, db, table string, prefix []string, limit int, next string, o *ReadOptions) ([]byte, string, error) {
	q, h := readQuery(o)
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if next != "" {
		q.Set("next", next)
	}
	r, err := t.do(ctx, http.MethodGet, docPath(db, table, prefix), q, h, nil)
	if err != nil {
		return nil, "", err
	}
	return r.body, r.header.Get("X-Cortado-SCN"), nil
}

func (t *httpTransport) Query(ctx context.Context, db, table string, prefix []string, qo *Query, o *ReadOptions) ([]byte, string, error) {
	q, h := readQuery(o)
	q.Set("query", qo.Where)
	if qo.Sort != "" {
		q.Set("sort", qo.Sort)
	}
	if qo.Limit > 0 {
		q.Set("limit", strconv.Itoa(qo.Limit))
	}
	if qo.Next != "" {
		q.Set("next", qo.Next)
	}
	r, err := t.do(ctx, http.MethodGet, docPath(db, table, prefix), q, h, nil)
	if err != nil {
		return nil, "", err
	}
	return r.body, r.header.Get("X-Cortado-SCN"), nil
}

func (t *httpTransport) MultiGet(ctx context.Context, db, table string, keys [][]string, o *ReadOptions) ([]byte, string, error) {
	path, err := multiGetPath(db, table, keys)
	if err != nil {
		return nil, "", err
	}
	q, h := readQuery(o)
	r, err := t.do(ctx, http.MethodGet, path, q, h, nil)
	if err != nil {
		return nil, "", err
	}
	return r.body, r.header.Get("X-Cortado-SCN"), nil
}

func (t *httpTransport) MultiGetLines(ctx context.Context, db, table string, keys [][]string, o *ReadOptions, fn func([]byte) error) error {
	path, err := multiGetPath(db, table, keys)
	if err != nil {
		return err
	}
	q, h := readQuery(o)
	accept := "application/x-ndjson"
	if o != nil && o.Version > 0 {
		accept += fmt.Sprintf("; version=%d", o.Version)
	}
	h.Set("Accept", accept)
	return t.lines(ctx, path, q, h, maxChangeEventBytes, fn)
}

// multiGetPath is /db/table/k1/(a,b): every key shares all parts but
// the last.
func multiGetPath(db, table string, keys [][]string) (string, error) {
	if len(keys) == 0 {
		return "", fmt.Errorf("cortado: multi-get needs keys")
	}
	lead := keys[0][:len(keys[0])-1]
	lasts := make([]string, len(keys))
	for i, k := range keys {
		if len(k) != len(keys[0]) || strings.Join(k[:len(k)-1], "\x00") != strings.Join(lead, "\x00") {
			return "", fmt.Errorf("cortado: multi-get keys must share every part but the last")
		}
		lasts[i] = strings.ReplaceAll(segment(k[len(k)-1]), ",", "%2C")
	}
	return docPath(db, table, lead) + "/(" + strings.Join(lasts, ",") + ")", nil
}

func writeResult(r *response, key []string) *WriteResult {
	w := &WriteResult{SCN: r.header.Get("X-Cortado-SCN"), ETag: r.header.Get("ETag"), Created: r.status == http.StatusCreated, Key: keyOf(key)}
	w.LastModified, _ = http.ParseTime(r.header.Get("Last-Modified"))
	if len(r.body) > 0 {
		var b struct {
			Key     Key `json:"key"`
			Deleted int `json:"deleted"`
		}
		dec := json.NewDecoder(bytes.NewReader(r.body))
		dec.UseNumber()
		if dec.Decode(&b) == nil {
			if b.Key != nil {
				w.Key = b.Key
			}
			w.Deleted = b.Deleted
		}
	}
	return w
}

func (t *httpTransport) Put(ctx context.Context, db, table string, key []string, body []byte, c *Conditions) (*WriteResult, error) {
	r, err := t.do(ctx, http.MethodPut, docPath(db, table, key), nil, condHeaders(nil, c), body)
	if err != nil {
		return nil, err
	}
	return writeResult(r, key), nil
}

func (t *httpTransport) Insert(ctx context.Context, db, table string, prefix []string, body []byte) (*WriteResult, error) {
	r, err := t.do(ctx, http.MethodPost, docPath(db, table, prefix), nil, nil, body)
	if err != nil {
		return nil, err
	}
	return writeResult(r, prefix), nil
}

func (t *httpTransport) Patch(ctx context.Context, db, table string, key []string, body []byte, c *Conditions) (*WriteResult, error) {
	r, err := t.do(ctx, http.MethodPatch, docPath(db, table, key), nil, condHeaders(nil, c), body)
	if err != nil {
		return nil, err
	}
	return writeResult(r, key), nil
}

func (t *httpTransport) Delete(ctx context.Context, db, table string, key []string, c *Conditions) (*WriteResult, error) {
	r, err := t.do(ctx, http.MethodDelete, docPath(db, table, key), nil, condHeaders(nil, c), nil)
	if err != nil {
		return nil, err
	}
	w := writeResult(r, key)
	if r.status == http.StatusNoContent {
		w.Deleted = 1
	}
	return w, nil
}

func (t *httpTransport) Txn(ctx context.Context, db, partitionKey string, body []byte) ([]byte, error) {
	r, err := t.do(ctx, http.MethodPost, "/"+url.PathEscape(db)+"/_txn/"+segment(partitionKey), nil, nil, body)
	if err != nil {
		return nil, err
	}
	return r.body, nil
}

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

// maxChangeEventBytes bounds one line of a stream: a change event (a
// document before and after, each up to a router's response limit, and
// the envelope), or a streamed multi-get's document.
const maxChangeEventBytes = 16 << 20

// maxBackupLineBytes bounds one line of a backup: a document of the
// largest body a router takes, in base64.
const maxBackupLineBytes = 24 << 20

func (t *httpTransport) Changes(ctx context.Context, db string, query url.Values, fn func([]byte) error) error {
	h := http.Header{}
	h.Set("Accept", "application/x-ndjson")
	if err := t.lines(ctx, "/"+url.PathEscape(db)+"/_changes", query, h, maxChangeEventBytes, fn); err != nil {
		return err
	}
	return io.ErrUnexpectedEOF // the server never ends a stream
}

func (t *httpTransport) Backup(ctx context.Context, db string, query url.Values, fn func([]byte) error) error {
	h := http.Header{}
	h.Set("Accept", "application/x-ndjson")
	return t.lines(ctx, "/"+url.PathEscape(db)+"/_backup", query, h, maxBackupLineBytes, fn)
}

func (t *httpTransport) Restore(ctx context.Context, db string, body []byte) ([]byte, error) {
	h := http.Header{}
	h.Set("Content-Type", "application/x-ndjson")
	r, err := t.do(ctx, http.MethodPost, "/"+url.PathEscape(db)+"/_restore", nil, h, body)
	if err != nil {
		return nil, err
	}
	return r.body, nil
}

// lines sends a GET answered with NDJSON and passes each line to fn
// until the answer ends, ctx does, or fn fails; an error status is an
// *Error.
func (t *httpTransport) lines(ctx context.Context, path string, query url.Values, header http.Header, maxLine int, fn func([]byte) error) error {
	u := t.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	t.prepare(ctx, req)
	resp, err := t.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	// Leaving a stream early closes its connection at once (before the
	// body, whose Close would otherwise wait on the rest of it).
	defer cancel()
	if resp.StatusCode >= 400 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return problemOf(resp, b)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	for sc.Scan() {
		if len(sc.Bytes()) == 0 {
			continue
		}
		if err := fn(sc.Bytes()); err != nil {
			return err
		}
	}
	return sc.Err()
}

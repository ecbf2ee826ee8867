// Package embedded opens a Cortado data directory in-process and serves a
// client.Client from it with no network hop: the registry on an embedded
// etcd bound to loopback, the storage engine and the router, called
// directly. It is the server in a library (etcd's server/embed to its
// client/v3); programs that talk HTTP import only package client.
package embedded

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cortado-db/cortado/client"
	"github.com/cortado-db/cortado/internal/changes"
	"github.com/cortado-db/cortado/internal/coord"
	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/router"
	"github.com/cortado-db/cortado/internal/server"
)

// Options configures Open.
type Options struct {
	// Logger receives the embedded server's logs (default: discarded).
	Logger *slog.Logger
}

// Open opens a Cortado data directory in-process: the registry
// (on an embedded etcd bound to loopback), the storage engine and the
// router, called directly with no HTTP. Only one process may open a data
// directory at a time. Close the client to close the directory.
func Open(ctx context.Context, dir string, opts *Options) (*client.Client, error) {
	o := Options{}
	if opts != nil {
		o = *opts
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	for attempt := 1; ; attempt++ {
		clientURL, peerURL, fresh, err := embeddedURLs(dir)
		if err != nil {
			return nil, err
		}
		s, err := server.Open(ctx, server.Options{DataDir: dir, EtcdClientURL: clientURL, EtcdPeerURL: peerURL, Logger: o.Logger,
			HeapFloor: -1, ProcsPerCPU: -1})
		if err != nil && attempt < 5 && coord.IsAddrInUse(err) {
			// Another process took a port: since it was found free, for
			// a new directory, or since the last open, for one opened
			// before (ports are reused). Pick again. A single-member
			// etcd starts on new ports with its data: the peer URL its
			// member recorded is never dialled.
			os.Remove(filepath.Join(dir, "etcd-urls"))
			if fresh {
				os.RemoveAll(filepath.Join(dir, "etcd"))
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		return client.NewWithTransport(&embedded{s: s, r: s.Router}), nil
	}
}

// embeddedURLs picks loopback ports for the embedded etcd the first time a
// directory is opened and remembers them for the next opens, until one is
// found taken (Open).
func embeddedURLs(dir string) (clientURL, peerURL string, fresh bool, err error) {
	file := filepath.Join(dir, "etcd-urls")
	if b, err := os.ReadFile(file); err == nil {
		if c, p, ok := strings.Cut(strings.TrimSpace(string(b)), " "); ok {
			return c, p, false, nil
		}
	}
	if clientURL, err = coord.FreeLoopbackURL(); err != nil {
		return "", "", false, err
	}
	if peerURL, err = coord.FreeLoopbackURL(); err != nil {
		return "", "", false, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", false, err
	}
	return clientURL, peerURL, true, os.WriteFile(file, []byte(clientURL+" "+peerURL+"\n"), 0o644)
}

type embedded struct {
	s *server.Server
	r *router.Router
}

func (e *embedded) Close() error { return e.s.Close() }

// problemErr converts a router error to the *client.Error an HTTP client gets.
func problemErr(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, node.ErrNotModified) {
		return client.ErrNotModified
	}
	p := router.Problem(err)
	return &client.Error{Status: p.Status, Type: p.Type, Title: p.Title, Detail: p.Detail, Field: p.Field, Operation: p.Operation, Position: p.Position,
		RetryAfter: time.Duration(p.RetryAfter) * time.Second}
}

func toConditions(c *client.Conditions) node.Preconditions {
	var p node.Preconditions
	if c == nil {
		return p
	}
	if c.IfMatch != "" {
		p.IfMatch = []string{c.IfMatch}
	}
	if c.IfNoneMatch != "" {
		p.IfNoneMatch = []string{c.IfNoneMatch}
	}
	p.IfModifiedSince = c.IfModifiedSince
	p.IfUnmodifiedSince = c.IfUnmodifiedSince
	return p
}

func format(o *client.ReadOptions, avro bool) router.Format {
	f := router.Format{Avro: avro}
	if o != nil {
		f.Fields, f.Version, f.PartialOK = o.Fields, o.Version, o.PartialOK
		// As the HTTP transport sends it: whole seconds, rounded up.
		switch {
		case o.MaxStale < 0:
			f.MaxStale = router.AnyStaleness
		case o.MaxStale > 0:
			f.MaxStale = time.Duration(router.AgeSeconds(o.MaxStale)) * time.Second
		}
	}
	return f
}

func keyFromParts(parts []keys.Part) client.Key {
	k := make(client.Key, len(parts))
	for i, p := range parts {
		if p.IsInt {
			k[i] = p.Int
		} else {
			k[i] = p.Str
		}
	}
	return k
}

func (e *embedded) CreateDatabase(ctx context.Context, name string, body []byte) error {
	_, _, err := e.r.CreateDatabase(ctx, name, body)
	return problemErr(err)
}

func (e *embedded) AlterDatabase(ctx context.Context, name string, patch []byte) error {
	_, err := e.r.AlterDatabase(ctx, name, patch)
	return problemErr(err)
}

func (e *embedded) RegisterSchema(ctx context.Context, db, table string, body []byte) (int, error) {
	b, _, err := e.r.RegisterSchema(ctx, db, table, body)
	if err != nil {
		return 0, problemErr(err)
	}
	var v struct{ Version int }
	return v.Version, json.Unmarshal(b, &v)
}

func (e *embedded) TableInfo(_ context.Context, db, table string) ([]byte, error) {
	b, err := e.r.TableInfo(db, table)
	return b, problemErr(err)
}

func (e *embedded) DatabaseInfo(_ context.Context, db string) ([]byte, error) {
	b, err := e.r.DatabaseInfo(db)
	return b, problemErr(err)
}

func (e *embedded) Databases(_ context.Context, after string, limit int) ([]byte, error) {
	return e.r.Databases(after, limit), nil
}

func (e *embedded) SetCompatibility(ctx context.Context, db, table string, body []byte) error {
	_, err := e.r.SetCompatibility(ctx, db, table, body)
	return problemErr(err)
}

func (e *embedded) Backup(ctx context.Context, db string, query url.Values, fn func([]byte) error) error {
	b, err := e.r.OpenBackup(db, query)
	if err != nil {
		return problemErr(err)
	}
	lw := &lineWriter{fn: fn}
	if _, err := b.Run(ctx, lw, func() error { return nil }); err != nil {
		return problemErr(err)
	}
	return nil
}

// lineWriter passes what is written to it to fn a line at a time.
type lineWriter struct {
	fn  func([]byte) error
	buf []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		if err := w.fn(w.buf[:i]); err != nil {
			return 0, err
		}
		w.buf = w.buf[i+1:]
	}
}

func (e *embedded) Restore(ctx context.Context, db string, body []byte) ([]byte, error) {
	b, err := e.r.Restore(ctx, db, body)
	return b, problemErr(err)
}

func (e *embedded) SchemaVersion(_ context.Context, db, table string, version int) ([]byte, error) {
	b, err := e.r.SchemaVersion(db, table, version)
	return b, problemErr(err)
}

func (e *embedded) Get(ctx context.Context, db, table string, key []string, o *client.ReadOptions, avro bool) (*client.Document, error) {
	var cond node.Preconditions
	if o != nil {
		cond = toConditions(&o.Conditions)
	}
	d, err := e.r.Get(ctx, db, table, key, format(o, avro), cond)
	if d == nil {
		return nil, problemErr(err)
	}
	doc := &client.Document{Key: keyFromParts(d.Key), SCN: d.SCN.String(), ETag: d.ETag, LastModified: d.Modified.Truncate(1e9),
		SchemaVersion: d.BodyVersion, Body: d.Body}
	if d.FromSlave || d.FromCache || d.FromTier {
		doc.Age = time.Duration(router.AgeSeconds(d.Stale)) * time.Second // as the Age header says it
	}
	switch {
	case d.FromSlave:
		doc.FromReplica = "slave"
	case d.FromCache:
		doc.Cache = "hit"
	case d.FromTier:
		doc.Cache = "redis"
	}
	return doc, problemErr(err)
}

func (e *embedded) Collection(ctx context.Context, db, table string, prefix []string, limit int, next string, o *client.ReadOptions) ([]byte, string, error) {
	p, err := e.r.Collection(ctx, db, table, prefix, limit, next, format(o, false))
	if err != nil {
		return nil, "", problemErr(err)
	}
	return p.Body, scnString(p), nil
}

func (e *embedded) Query(ctx context.Context, db, table string, prefix []string, q *client.Query, o *client.ReadOptions) ([]byte, string, error) {
	p, err := e.r.Query(ctx, db, table, prefix, q.Where, q.Sort, q.Limit, q.Next, format(o, false))
	if err != nil {
		return nil, "", problemErr(err)
	}
	return p.Body, scnString(p), nil
}

func scnString(p *router.Page) string {
	if p.SCN.IsZero() {
		return ""
	}
	return p.SCN.String()
}

func (e *embedded) MultiGet(ctx context.Context, db, table string, keys [][]string, o *client.ReadOptions) ([]byte, string, error) {
	p, err := e.r.MultiGet(ctx, db, table, keys, format(o, false))
	if err != nil {
		return nil, "", problemErr(err)
	}
	return p.Body, scnString(p), nil
}

func (e *embedded) MultiGetLines(ctx context.Context, db, table string, keys [][]string, o *client.ReadOptions, fn func([]byte) error) error {
	f := format(o, false)
	f.Lines = true
	var fnErr error // fn's own, passed back as it is
	end, err := e.r.StreamMultiGet(ctx, db, table, keys, f, func(lines []byte, _ bool) error {
		for len(lines) > 0 {
			line, rest, _ := bytes.Cut(lines, []byte{'\n'})
			if fnErr = fn(line); fnErr != nil {
				return fnErr
			}
			lines = rest
		}
		return nil
	})
	if fnErr != nil {
		return fnErr
	}
	if err != nil {
		return problemErr(err)
	}
	return fn(bytes.TrimSuffix(end.AppendLine(nil), []byte{'\n'}))
}

func (e *embedded) result(res *router.WriteResult) *client.WriteResult {
	w := &client.WriteResult{SCN: res.SCN.String(), Key: keyFromParts(res.Key), Created: res.Created, ETag: res.ETag, Deleted: res.Deleted}
	if !res.Modified.IsZero() {
		w.LastModified = res.Modified.Truncate(1e9)
	}
	return w
}

func (e *embedded) Put(ctx context.Context, db, table string, key []string, body []byte, c *client.Conditions) (*client.WriteResult, error) {
	res, err := e.r.Put(ctx, db, table, key, body, 0, toConditions(c))
	if err != nil {
		return nil, problemErr(err)
	}
	return e.result(res), nil
}

func (e *embedded) Insert(ctx context.Context, db, table string, prefix []string, body []byte) (*client.WriteResult, error) {
	res, err := e.r.Insert(ctx, db, table, prefix, body, 0)
	if err != nil {
		return nil, problemErr(err)
	}
	return e.result(res), nil
}

func (e *embedded) Patch(ctx context.Context, db, table string, key []string, body []byte, c *client.Conditions) (*client.WriteResult, error) {
	res, err := e.r.Patch(ctx, db, table, key, body, toConditions(c))
	if err != nil {
		return nil, problemErr(err)
	}
	return e.result(res), nil
}

func (e *embedded) Delete(ctx context.Context, db, table string, key []string, c *client.Conditions) (*client.WriteResult, error) {
	res, err := e.r.Delete(ctx, db, table, key, toConditions(c))
	if err != nil {
		return nil, problemErr(err)
	}
	return e.result(res), nil
}

func (e *embedded) Txn(ctx context.Context, db, partitionKey string, body []byte) ([]byte, error) {
	res, err := e.r.Txn(ctx, db, partitionKey, body)
	if err != nil {
		return nil, problemErr(err)
	}
	return res.Body, nil
}

func (e *embedded) Changes(ctx context.Context, db string, query url.Values, fn func([]byte) error) error {
	st, err := e.s.Router.OpenChanges(ctx, db, query, "")
	if err != nil {
		return problemErr(err)
	}
	return st.Run(ctx, func(ev changes.Event) error { return fn(ev.JSON) }, func() error { return nil })
}

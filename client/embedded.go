package client

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/cortado-db/cortado/internal/coord"
	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/router"
	"github.com/cortado-db/cortado/internal/server"
)

// EmbeddedOptions configures OpenEmbedded.
type EmbeddedOptions struct {
	// Logger receives the embedded server's logs (default: discarded).
	Logger *slog.Logger
}

// OpenEmbedded opens a Cortado data directory in-process: the registry
// (on an embedded etcd bound to loopback), the storage engine and the
// router, called directly with no HTTP. Only one process may open a data
// directory at a time. Close the client to close the directory.
func OpenEmbedded(ctx context.Context, dir string, opts *EmbeddedOptions) (*Client, error) {
	o := EmbeddedOptions{}
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
		s, err := server.Open(ctx, server.Options{DataDir: dir, EtcdClientURL: clientURL, EtcdPeerURL: peerURL, Logger: o.Logger})
		if err != nil && fresh && attempt < 5 && strings.Contains(err.Error(), "address already in use") {
			// The ports were free when picked but another process took
			// them; a new directory can pick again.
			os.Remove(filepath.Join(dir, "etcd-urls"))
			os.RemoveAll(filepath.Join(dir, "etcd"))
			continue
		}
		if err != nil {
			return nil, err
		}
		return &Client{t: &embedded{s: s, r: s.Router}, local: newLocalSchemas()}, nil
	}
}

// embeddedURLs picks loopback ports for the embedded etcd the first time a
// directory is opened and remembers them, since etcd records its peer URL
// in its data.
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

func (e *embedded) close() error { return e.s.Close() }

// problemErr converts a router error to the *Error an HTTP client gets.
func problemErr(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, node.ErrNotModified) {
		return ErrNotModified
	}
	p := router.Problem(err)
	return &Error{Status: p.Status, Type: p.Type, Title: p.Title, Detail: p.Detail, Field: p.Field, Operation: p.Operation}
}

func toConditions(c *Conditions) node.Preconditions {
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

func format(o *ReadOptions, avro bool) router.Format {
	f := router.Format{Avro: avro}
	if o != nil {
		f.Fields, f.Version = o.Fields, o.Version
	}
	return f
}

func keyFromParts(parts []keys.Part) Key {
	k := make(Key, len(parts))
	for i, p := range parts {
		if p.IsInt {
			k[i] = p.Int
		} else {
			k[i] = p.Str
		}
	}
	return k
}

func (e *embedded) createDatabase(ctx context.Context, name string, body []byte) error {
	_, _, err := e.r.CreateDatabase(ctx, name, body)
	return problemErr(err)
}

func (e *embedded) registerSchema(ctx context.Context, db, table string, body []byte) (int, error) {
	b, _, err := e.r.RegisterSchema(ctx, db, table, body)
	if err != nil {
		return 0, problemErr(err)
	}
	var v struct{ Version int }
	return v.Version, jsonUnmarshal(b, &v)
}

func (e *embedded) tableInfo(_ context.Context, db, table string) ([]byte, error) {
	b, err := e.r.TableInfo(db, table)
	return b, problemErr(err)
}

func (e *embedded) schemaVersion(_ context.Context, db, table string, version int) ([]byte, error) {
	b, err := e.r.SchemaVersion(db, table, version)
	return b, problemErr(err)
}

func (e *embedded) get(ctx context.Context, db, table string, key []string, o *ReadOptions, avro bool) (*Document, error) {
	var cond node.Preconditions
	if o != nil {
		cond = toConditions(&o.Conditions)
	}
	d, err := e.r.Get(ctx, db, table, key, format(o, avro), cond)
	if d == nil {
		return nil, problemErr(err)
	}
	return &Document{Key: keyFromParts(d.Key), SCN: d.SCN.String(), ETag: d.ETag, LastModified: d.Modified.Truncate(1e9),
		SchemaVersion: d.BodyVersion, Body: d.Body}, problemErr(err)
}

func (e *embedded) collection(ctx context.Context, db, table string, prefix []string, limit int, next string, o *ReadOptions) ([]byte, *Page, error) {
	p, err := e.r.Collection(ctx, db, table, prefix, limit, next, format(o, false))
	if err != nil {
		return nil, nil, problemErr(err)
	}
	page, err := parsePage(p.Body, scnString(p))
	return p.Body, page, err
}

func scnString(p *router.Page) string {
	if p.SCN.IsZero() {
		return ""
	}
	return p.SCN.String()
}

func (e *embedded) multiGet(ctx context.Context, db, table string, keys [][]string, o *ReadOptions) ([]byte, *Page, error) {
	p, err := e.r.MultiGet(ctx, db, table, keys, format(o, false))
	if err != nil {
		return nil, nil, problemErr(err)
	}
	page, err := parsePage(p.Body, scnString(p))
	return p.Body, page, err
}

func (e *embedded) result(res *router.WriteResult) *WriteResult {
	w := &WriteResult{SCN: res.SCN.String(), Key: keyFromParts(res.Key), Created: res.Created, ETag: res.ETag, Deleted: res.Deleted}
	if !res.Modified.IsZero() {
		w.LastModified = res.Modified.Truncate(1e9)
	}
	return w
}

func (e *embedded) put(ctx context.Context, db, table string, key []string, body []byte, c *Conditions) (*WriteResult, error) {
	res, err := e.r.Put(ctx, db, table, key, body, 0, toConditions(c))
	if err != nil {
		return nil, problemErr(err)
	}
	return e.result(res), nil
}

func (e *embedded) insert(ctx context.Context, db, table string, prefix []string, body []byte) (*WriteResult, error) {
	res, err := e.r.Insert(ctx, db, table, prefix, body, 0)
	if err != nil {
		return nil, problemErr(err)
	}
	return e.result(res), nil
}

func (e *embedded) patch(ctx context.Context, db, table string, key []string, body []byte, c *Conditions) (*WriteResult, error) {
	res, err := e.r.Patch(ctx, db, table, key, body, toConditions(c))
	if err != nil {
		return nil, problemErr(err)
	}
	return e.result(res), nil
}

func (e *embedded) delete(ctx context.Context, db, table string, key []string, c *Conditions) (*WriteResult, error) {
	res, err := e.r.Delete(ctx, db, table, key, toConditions(c))
	if err != nil {
		return nil, problemErr(err)
	}
	return e.result(res), nil
}

func (e *embedded) txn(ctx context.Context, db, partitionKey string, body []byte) ([]byte, error) {
	res, err := e.r.Txn(ctx, db, partitionKey, body)
	if err != nil {
		return nil, problemErr(err)
	}
	return res.Body, nil
}

package router

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
)

// Options configures a Router. Zero values take the documented defaults.
type Options struct {
	// MaxBodyBytes caps request bodies (default 2 MiB); larger is 413.
	MaxBodyBytes int64
	// MaxResponseBytes caps response bodies (default 2 MiB); larger is 413
	// with a hint to use projection.
	MaxResponseBytes int
	// DefaultLimit is a collection page's size when the request sets none
	// (default 100); MaxLimit caps it (default 1000).
	DefaultLimit, MaxLimit int
}

func (o *Options) fill() {
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = 2 << 20
	}
	if o.MaxResponseBytes == 0 {
		o.MaxResponseBytes = 2 << 20
	}
	if o.DefaultLimit == 0 {
		o.DefaultLimit = 100
	}
	if o.MaxLimit == 0 {
		o.MaxLimit = 1000
	}
}

// Backend finds the storage node serving a partition.
type Backend interface {
	Node(db string, partition int) (node.Service, error)
}

// Router serves the document API.
type Router struct {
	reg     *registry.Registry
	plans   *schema.Plans
	backend Backend
	opts    Options
	log     *slog.Logger
}

// New returns a router.
func New(reg *registry.Registry, plans *schema.Plans, backend Backend, opts Options, log *slog.Logger) *Router {
	opts.fill()
	return &Router{reg: reg, plans: plans, backend: backend, opts: opts, log: log}
}

// Options returns the router's effective options.
func (r *Router) Options() Options { return r.opts }

// Format says how a read wants documents.
type Format struct {
	// Avro asks for Avro binary instead of JSON.
	Avro bool
	// Version is the schema version to return: 0 is the latest for JSON;
	// for Avro, 0 means each document as written.
	Version int
	Fields  []string
}

// Document is one rendered document.
type Document struct {
	Key      []keys.Part
	SCN      storage.SCN
	ETag     string
	Modified time.Time
	// Body is JSON, or Avro of schema BodyVersion.
	Body        []byte
	BodyVersion int
}

// Page is a rendered multi-document response (collection or multi-get).
type Page struct {
	// Body is the JSON page: {"documents":[…],"missing":[…],"next":"…"}.
	Body []byte
	// SCN is set when the page came from one partition.
	SCN storage.SCN
	// Documents counts the documents in Body.
	Documents int
}

// WriteResult reports a committed write.
type WriteResult struct {
	SCN      storage.SCN
	Key      []keys.Part
	Created  bool
	ETag     string
	Modified time.Time
	Deleted  int
	// Body is the JSON response body, if the call has one.
	Body []byte
}

type target struct {
	db    *schema.Database
	table *schema.Table
	key   []keys.Part
	part  int
}

// resolve finds the database, table, key and partition of a request. A key
// must have at least the partition key unless allowEmpty.
func (r *Router) resolve(db, table string, keyText []string, allowEmpty bool) (*target, error) {
	d, err := r.reg.Database(db)
	if err != nil {
		return nil, err
	}
	t, err := r.reg.Table(db, table)
	if err != nil {
		return nil, err
	}
	key, err := t.ParseKey(keyText)
	if err != nil {
		return nil, &keyError{err}
	}
	tg := &target{db: d, table: t, key: key, part: -1}
	if len(key) > 0 {
		tg.part = d.PartitionOf(key[0])
	} else if !allowEmpty {
		return nil, &keyError{fmt.Errorf("table %s needs at least its partition key %s", t.Name, t.Key[0].Name)}
	}
	return tg, nil
}

func (r *Router) full(tg *target) bool { return len(tg.key) == len(tg.table.Key) }

func (r *Router) nodeFor(tg *target) (node.Service, error) {
	return r.backend.Node(tg.db.Name, tg.part)
}

// readSpec checks a format against the table and turns it into what the
// node needs.
func (r *Router) readSpec(t *schema.Table, f Format) (node.ReadSpec, error) {
	v := f.Version
	if v == 0 && !f.Avro {
		v = t.Latest().Number
	}
	if v != 0 && t.Version(v) == nil {
		return node.ReadSpec{}, fmt.Errorf("table %s version %d: %w", t.Name, v, registry.ErrNoVersion)
	}
	if len(f.Fields) > 0 {
		// Check the paths once against the version asked for (or the
		// latest), so a bad path is a 400 even when nothing is found.
		check := v
		if check == 0 {
			check = t.Latest().Number
		}
		if _, err := r.plans.Reader(t, check, f.Fields); err != nil {
			return node.ReadSpec{}, &projectionError{err}
		}
	}
	return node.ReadSpec{Version: v, Fields: f.Fields}, nil
}

func (r *Router) document(t *schema.Table, it *node.Item, f Format) (*Document, error) {
	d := &Document{Key: it.Key, SCN: it.SCN, ETag: it.ETag, Modified: it.Modified, BodyVersion: it.BodyVersion}
	if f.Avro {
		d.Body = it.Body
		return d, nil
	}
	rd, err := r.plans.Reader(t, it.BodyVersion, f.Fields)
	if err != nil {
		return nil, err
	}
	if d.Body, err = rd.JSON.Append(nil, it.Body); err != nil {
		return nil, err
	}
	return d, nil
}

// Get reads one document by full key.
func (r *Router) Get(ctx context.Context, db, table string, key []string, f Format, cond node.Preconditions) (*Document, error) {
	tg, err := r.resolve(db, table, key, false)
	if err != nil {
		return nil, err
	}
	if !r.full(tg) {
		return nil, &keyError{fmt.Errorf("a document read needs the full key (%d parts)", len(tg.table.Key))}
	}
	spec, err := r.readSpec(tg.table, f)
	if err != nil {
		return nil, err
	}
	n, err := r.nodeFor(tg)
	if err != nil {
		return nil, err
	}
	it, err := n.Get(ctx, node.GetRequest{DB: db, Table: table, Partition: tg.part, Key: tg.key, Read: spec, Cond: cond})
	if err != nil {
		if it != nil { // not modified: headers only
			return &Document{Key: it.Key, SCN: it.SCN, ETag: it.ETag, Modified: it.Modified}, err
		}
		return nil, err
	}
	doc, err := r.document(tg.table, it, f)
	if err != nil {
		return nil, err
	}
	if len(doc.Body) > r.opts.MaxResponseBytes {
		return nil, &responseTooLarge{size: len(doc.Body), limit: r.opts.MaxResponseBytes}
	}
	return doc, nil
}

// Collection reads one page of the documents under a partial key, in key
// order. token is the previous page's "next", or "".
func (r *Router) Collection(ctx context.Context, db, table string, prefix []string, limit int, token string, f Format) (*Page, error) {
	tg, err := r.resolve(db, table, prefix, false)
	if err != nil {
		return nil, err
	}
	if f.Avro {
		return nil, errAvroMulti
	}
	spec, err := r.readSpec(tg.table, f)
	if err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = r.opts.DefaultLimit
	}
	if limit > r.opts.MaxLimit {
		return nil, &keyError{fmt.Errorf("limit %d is over the maximum %d", limit, r.opts.MaxLimit)}
	}
	var after []byte
	if token != "" {
		if after, err = base64.RawURLEncoding.DecodeString(token); err != nil {
			return nil, &keyError{fmt.Errorf("bad continuation token")}
		}
		if parts, err := keys.Decode(after); err != nil || len(parts) != len(tg.table.Key) {
			return nil, &keyError{fmt.Errorf("bad continuation token")}
		}
	}
	n, err := r.nodeFor(tg)
	if err != nil {
		return nil, err
	}
	res, err := n.Scan(ctx, node.ScanRequest{DB: db, Table: table, Partition: tg.part, Prefix: tg.key, After: after, Limit: limit, Read: spec})
	if err != nil {
		return nil, err
	}
	next := ""
	if res.Next != nil {
		next = base64.RawURLEncoding.EncodeToString(res.Next)
	}
	page, err := r.renderPage(tg.table, res.Items, nil, next, f)
	if err != nil {
		return nil, err
	}
	page.SCN = res.SCN
	return page, nil
}

// MultiGet reads documents by full keys, fanning out to their partitions in
// parallel. Documents come back in request order; keys not found are
// listed under "missing".
func (r *Router) MultiGet(ctx context.Context, db, table string, keyTexts [][]string, f Format) (*Page, error) {
	if f.Avro {
		return nil, errAvroMulti
	}
	if len(keyTexts) == 0 {
		return nil, &keyError{fmt.Errorf("a multi-get needs at least one key")}
	}
	if len(keyTexts) > r.opts.MaxLimit {
		return nil, &keyError{fmt.Errorf("a multi-get takes at most %d keys", r.opts.MaxLimit)}
	}
	var t *schema.Table
	type group struct {
		part int
		keys [][]keys.Part
	}
	groups := map[int]*group{}
	var order []int
	all := make([][]keys.Part, len(keyTexts))
	for i, kt := range keyTexts {
		tg, err := r.resolve(db, table, kt, false)
		if err != nil {
			return nil, err
		}
		if !r.full(tg) {
			return nil, &keyError{fmt.Errorf("multi-get key %d has %d of %d key parts", i, len(tg.key), len(tg.table.Key))}
		}
		t = tg.table
		all[i] = tg.key
		g, ok := groups[tg.part]
		if !ok {
			g = &group{part: tg.part}
			groups[tg.part] = g
			order = append(order, tg.part)
		}
		g.keys = append(g.keys, tg.key)
	}
	spec, err := r.readSpec(t, f)
	if err != nil {
		return nil, err
	}
	d, _ := r.reg.Database(db)
	results := make([][]*node.Item, len(order))
	errs := make([]error, len(order))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan int, len(order))
	for i, p := range order {
		go func() {
			defer func() { done <- i }()
			n, err := r.backend.Node(d.Name, p)
			if err != nil {
				errs[i] = err
				return
			}
			results[i], errs[i] = n.MultiGet(ctx, node.MultiGetRequest{DB: db, Table: table, Partition: p, Keys: groups[p].keys, Read: spec})
		}()
	}
	for range order {
		if i := <-done; errs[i] != nil {
			cancel()
			for range len(order) - 1 {
				<-done
			}
			return nil, errs[i]
		}
	}
	found := map[string]*node.Item{}
	for _, items := range results {
		for _, it := range items {
			found[string(keys.Encode(it.Key))] = it
		}
	}
	var items []*node.Item
	var missing [][]keys.Part
	for _, k := range all {
		if it, ok := found[string(keys.Encode(k))]; ok {
			items = append(items, it)
		} else {
			missing = append(missing, k)
		}
	}
	page, err := r.renderPage(t, items, missing, "", f)
	if err != nil {
		return nil, err
	}
	if len(order) == 1 {
		// One partition: its SCNs are comparable; report the newest.
		for _, it := range items {
			if page.SCN.Less(it.SCN) {
				page.SCN = it.SCN
			}
		}
	}
	return page, nil
}

func (r *Router) renderPage(t *schema.Table, items []*node.Item, missing [][]keys.Part, next string, f Format) (*Page, error) {
	b := []byte(`{"documents":[`)
	for i, it := range items {
		if i > 0 {
			b = append(b, ',')
		}
		doc, err := r.document(t, it, f)
		if err != nil {
			return nil, err
		}
		b = append(b, `{"key":`...)
		b = append(b, schema.KeyJSON(it.Key)...)
		b = fmt.Appendf(b, `,"etag":%q,"scn":"%s","lastModified":%q,"document":`, it.ETag, it.SCN, it.Modified.UTC().Format(time.RFC3339Nano))
		b = append(b, doc.Body...)
		b = append(b, '}')
		if len(b) > r.opts.MaxResponseBytes {
			return nil, &responseTooLarge{size: len(b), limit: r.opts.MaxResponseBytes, partial: true}
		}
	}
	b = append(b, ']')
	if missing != nil {
		b = append(b, `,"missing":[`...)
		for i, k := range missing {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, schema.KeyJSON(k)...)
		}
		b = append(b, ']')
	}
	if next != "" {
		b = fmt.Appendf(b, `,"next":%q`, next)
	}
	b = append(b, '}')
	return &Page{Body: b, Documents: len(items)}, nil
}

// encodeDocument validates a document body against the table's latest
// schema (JSON) or the version it names (Avro) and returns its Avro bytes.
func (r *Router) encodeDocument(t *schema.Table, body []byte, avroVersion int) (int, []byte, error) {
	if avroVersion > 0 {
		v := t.Version(avroVersion)
		if v == nil {
			return 0, nil, fmt.Errorf("table %s version %d: %w", t.Name, avroVersion, registry.ErrNoVersion)
		}
		if err := schema.NewValidator(v.Schema).Validate(body); err != nil {
			return 0, nil, err
		}
		return v.Number, body, nil
	}
	tree, err := schema.DecodeJSON(body)
	if err != nil {
		return 0, nil, err
	}
	latest := t.Latest()
	value, err := schema.EncodeJSON(nil, latest.Schema, tree)
	if err != nil {
		return 0, nil, err
	}
	return latest.Number, value, nil
}

func (r *Router) write(ctx context.Context, tg *target, ops []node.Op) (*node.WriteResult, error) {
	n, err := r.nodeFor(tg)
	if err != nil {
		return nil, err
	}
	return n.Write(ctx, node.WriteRequest{DB: tg.db.Name, Partition: tg.part, Ops: ops})
}

func single(res *node.WriteResult) *WriteResult {
	o := res.Results[0]
	return &WriteResult{SCN: res.SCN, Key: o.Key, Created: o.Created, ETag: o.ETag, Modified: o.Modified, Deleted: o.Deleted}
}

// Put inserts or replaces one document by full key. avroVersion > 0 says
// the body is Avro binary of that schema version; 0 means JSON.
func (r *Router) Put(ctx context.Context, db, table string, key []string, body []byte, avroVersion int, cond node.Preconditions) (*WriteResult, error) {
	tg, err := r.resolve(db, table, key, false)
	if err != nil {
		return nil, err
	}
	if !r.full(tg) {
		return nil, &keyError{fmt.Errorf("a put needs the full key (%d parts); use POST on the collection to auto-increment", len(tg.table.Key))}
	}
	version, value, err := r.encodeDocument(tg.table, body, avroVersion)
	if err != nil {
		return nil, err
	}
	res, err := r.write(ctx, tg, []node.Op{{Kind: node.OpPut, Table: table, Key: tg.key, Version: version, Value: value, Cond: cond}})
	if err != nil {
		return nil, err
	}
	return single(res), nil
}

// Insert adds a document under a collection, giving it the next value of
// the table's auto-increment last key part.
func (r *Router) Insert(ctx context.Context, db, table string, prefix []string, body []byte, avroVersion int) (*WriteResult, error) {
	tg, err := r.resolve(db, table, prefix, false)
	if err != nil {
		return nil, err
	}
	if !tg.table.AutoIncrement() {
		return nil, &keyError{fmt.Errorf("table %s has no auto-increment key part; use PUT with the full key", table)}
	}
	if len(tg.key) != len(tg.table.Key)-1 {
		return nil, &keyError{fmt.Errorf("POST takes every key part but the last (%d parts)", len(tg.table.Key)-1)}
	}
	version, value, err := r.encodeDocument(tg.table, body, avroVersion)
	if err != nil {
		return nil, err
	}
	res, err := r.write(ctx, tg, []node.Op{{Kind: node.OpInsert, Table: table, Key: tg.key, Version: version, Value: value}})
	if err != nil {
		return nil, err
	}
	wr := single(res)
	wr.Body = append(append([]byte(`{"key":`), schema.KeyJSON(wr.Key)...), '}')
	return wr, nil
}

// Patch applies a partial update (see node.Patch) to one document.
func (r *Router) Patch(ctx context.Context, db, table string, key []string, body []byte, cond node.Preconditions) (*WriteResult, error) {
	tg, err := r.resolve(db, table, key, false)
	if err != nil {
		return nil, err
	}
	if !r.full(tg) {
		return nil, &keyError{fmt.Errorf("a patch needs the full key (%d parts)", len(tg.table.Key))}
	}
	p, err := parsePatch(body)
	if err != nil {
		return nil, err
	}
	res, err := r.write(ctx, tg, []node.Op{{Kind: node.OpPatch, Table: table, Key: tg.key, Patch: p, Cond: cond}})
	if err != nil {
		return nil, err
	}
	return single(res), nil
}

func parsePatch(body []byte) (*node.Patch, error) {
	tree, err := schema.DecodeJSON(body)
	if err != nil {
		return nil, err
	}
	obj, ok := tree.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%w: a patch is a JSON object", node.ErrBadPatch)
	}
	p := &node.Patch{}
	for k, v := range obj {
		switch k {
		case "set", "increment":
			m, ok := v.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("%w: %s must be an object of path: value", node.ErrBadPatch, k)
			}
			if k == "set" {
				p.Set = m
			} else {
				p.Increment = m
			}
		case "remove":
			arr, ok := v.([]any)
			if !ok {
				return nil, fmt.Errorf("%w: remove must be an array of paths", node.ErrBadPatch)
			}
			for _, e := range arr {
				s, ok := e.(string)
				if !ok {
					return nil, fmt.Errorf("%w: remove must be an array of paths", node.ErrBadPatch)
				}
				p.Remove = append(p.Remove, s)
			}
		default:
			return nil, fmt.Errorf("%w: unknown member %q (use set, remove, increment)", node.ErrBadPatch, k)
		}
	}
	if p.Empty() {
		return nil, fmt.Errorf("%w: empty patch", node.ErrBadPatch)
	}
	return p, nil
}

// Delete removes one document (full key) or a whole collection (partial
// key, as one commit).
func (r *Router) Delete(ctx context.Context, db, table string, key []string, cond node.Preconditions) (*WriteResult, error) {
	tg, err := r.resolve(db, table, key, false)
	if err != nil {
		return nil, err
	}
	kind := node.OpDelete
	if !r.full(tg) {
		if !cond.Empty() {
			return nil, &keyError{fmt.Errorf("conditional headers apply to one document, not a collection")}
		}
		kind = node.OpDeleteCollection
	}
	res, err := r.write(ctx, tg, []node.Op{{Kind: kind, Table: table, Key: tg.key, Cond: cond}})
	if err != nil {
		return nil, err
	}
	wr := single(res)
	if kind == node.OpDeleteCollection {
		wr.Body = fmt.Appendf(nil, `{"deleted":%d}`, wr.Deleted)
	}
	return wr, nil
}

// TxnOp is one operation of a transaction body.
type TxnOp struct {
	Op       string          `json:"op"`
	Table    string          `json:"table"`
	Key      []any           `json:"key"`
	Document json.RawMessage `json:"document,omitempty"`
	Patch    json.RawMessage `json:"patch,omitempty"`
	IfMatch  string          `json:"ifMatch,omitempty"`
	// IfNoneMatch "*" makes a put create-only.
	IfNoneMatch string `json:"ifNoneMatch,omitempty"`
}

// Txn applies operations to documents of one document group atomically:
// all commit under one SCN, or none does. body is {"ops":[TxnOp…]}.
func (r *Router) Txn(ctx context.Context, db, partitionKey string, body []byte) (*WriteResult, error) {
	var req struct {
		Ops []TxnOp `json:"ops"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return nil, &schema.FieldError{Reason: "malformed transaction: " + err.Error()}
	}
	if len(req.Ops) == 0 {
		return nil, &schema.FieldError{Reason: "a transaction needs at least one op"}
	}
	if len(req.Ops) > r.opts.MaxLimit {
		return nil, &schema.FieldError{Reason: fmt.Sprintf("a transaction takes at most %d ops", r.opts.MaxLimit)}
	}
	var group *target
	ops := make([]node.Op, len(req.Ops))
	for i, o := range req.Ops {
		op, tg, err := r.txnOp(db, partitionKey, o)
		if err != nil {
			return nil, &node.OpError{Index: i, Err: err}
		}
		if group == nil {
			group = tg
		}
		ops[i] = op
	}
	res, err := r.write(ctx, group, ops)
	if err != nil {
		return nil, err
	}
	b := fmt.Appendf(nil, `{"scn":"%s","results":[`, res.SCN)
	for i, o := range res.Results {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"key":`...)
		b = append(b, schema.KeyJSON(o.Key)...)
		if o.ETag != "" {
			b = fmt.Appendf(b, `,"etag":%q`, o.ETag)
		}
		if req.Ops[i].Op == "delete" {
			b = fmt.Appendf(b, `,"deleted":%d`, o.Deleted)
		}
		b = append(b, '}')
	}
	b = append(b, "]}"...)
	return &WriteResult{SCN: res.SCN, Body: b}, nil
}

func (r *Router) txnOp(db, partitionKey string, o TxnOp) (node.Op, *target, error) {
	keyText := make([]string, len(o.Key))
	for i, k := range o.Key {
		switch v := k.(type) {
		case string:
			keyText[i] = v
		case json.Number:
			keyText[i] = v.String()
		default:
			return node.Op{}, nil, &keyError{fmt.Errorf("key parts must be strings or integers")}
		}
	}
	tg, err := r.resolve(db, o.Table, keyText, false)
	if err != nil {
		return node.Op{}, nil, err
	}
	pk, err := keys.Parse(tg.table.Key[0].Type, partitionKey)
	if err != nil || pk != tg.key[0] {
		return node.Op{}, nil, &keyError{fmt.Errorf("key %v is not in document group %q: a transaction stays in one document group", keyText, partitionKey)}
	}
	var cond node.Preconditions
	if o.IfMatch != "" {
		cond.IfMatch = []string{o.IfMatch}
	}
	if o.IfNoneMatch != "" {
		cond.IfNoneMatch = []string{o.IfNoneMatch}
	}
	op := node.Op{Table: o.Table, Key: tg.key, Cond: cond}
	switch o.Op {
	case "put", "insert":
		op.Kind = node.OpPut
		want := len(tg.table.Key)
		if o.Op == "insert" {
			op.Kind = node.OpInsert
			want--
			if !tg.table.AutoIncrement() {
				return node.Op{}, nil, &keyError{fmt.Errorf("table %s has no auto-increment key part", o.Table)}
			}
		}
		if len(tg.key) != want {
			return node.Op{}, nil, &keyError{fmt.Errorf("%s on %s needs %d key parts, got %d", o.Op, o.Table, want, len(tg.key))}
		}
		if len(o.Document) == 0 {
			return node.Op{}, nil, &schema.FieldError{Reason: o.Op + " needs a document"}
		}
		if op.Version, op.Value, err = r.encodeDocument(tg.table, o.Document, 0); err != nil {
			return node.Op{}, nil, err
		}
	case "patch":
		op.Kind = node.OpPatch
		if !r.full(tg) {
			return node.Op{}, nil, &keyError{fmt.Errorf("patch needs the full key")}
		}
		if op.Patch, err = parsePatch(o.Patch); err != nil {
			return node.Op{}, nil, err
		}
	case "delete":
		op.Kind = node.OpDelete
		if !r.full(tg) {
			op.Kind = node.OpDeleteCollection
		}
	default:
		return node.Op{}, nil, &schema.FieldError{Reason: fmt.Sprintf("unknown op %q (use put, insert, patch, delete)", o.Op)}
	}
	return op, tg, nil
}

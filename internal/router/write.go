package router

import (
	"context"
	"errors"
	"fmt"

	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/schema"
)

// encodeDocument validates a document body against the table's latest
// schema (JSON) or the version it names (Avro) and returns its Avro bytes.
func (r *Router) encodeDocument(t *schema.Table, body []byte, avroVersion int) (int, []byte, error) {
	if avroVersion > 0 {
		v := t.Version(avroVersion)
		if v == nil {
			return 0, nil, fmt.Errorf("table %s version %d: %w", t.Name, avroVersion, registry.ErrNoVersion)
		}
		value, err := v.Canonical(body)
		if err != nil {
			return 0, nil, err
		}
		return v.Number, value, nil
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
	defer r.writing(tg.db.Name, ops)()
	return n.Write(ctx, node.WriteRequest{DB: tg.db.Name, Partition: tg.part, Ops: ops})
}

// writeOne writes one document outside a transaction. Its problem names
// no operation: that is a transaction's, whose one op is still op 0.
func (r *Router) writeOne(ctx context.Context, tg *target, op node.Op) (*node.WriteResult, error) {
	res, err := r.write(ctx, tg, []node.Op{op})
	var oe *node.OpError
	if errors.As(err, &oe) {
		return nil, oe.Err
	}
	return res, err
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
	res, err := r.writeOne(ctx, tg, node.Op{Kind: node.OpPut, Table: table, Key: tg.key, Version: version, Value: value, Cond: cond})
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
	res, err := r.writeOne(ctx, tg, node.Op{Kind: node.OpInsert, Table: table, Key: tg.key, Version: version, Value: value})
	if err != nil {
		return nil, err
	}
	wr := single(res)
	wr.Body = append(schema.AppendKeyJSON([]byte(`{"key":`), wr.Key), '}')
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
	res, err := r.writeOne(ctx, tg, node.Op{Kind: node.OpPatch, Table: table, Key: tg.key, Patch: p, Cond: cond})
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
	res, err := r.writeOne(ctx, tg, node.Op{Kind: kind, Table: table, Key: tg.key, Cond: cond})
	if err != nil {
		return nil, err
	}
	wr := single(res)
	if kind == node.OpDeleteCollection {
		wr.Body = fmt.Appendf(nil, `{"deleted":%d}`, wr.Deleted)
	}
	return wr, nil
}

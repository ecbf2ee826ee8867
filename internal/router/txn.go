package router

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/schema"
)

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
	if err := schema.DecodeInto(body, &req, "transaction"); err != nil {
		return nil, err
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
		b = schema.AppendKeyJSON(b, o.Key)
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
	keyText, err := schema.KeyTexts(o.Key)
	if err != nil {
		return node.Op{}, nil, &keyError{err}
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

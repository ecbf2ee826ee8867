package node

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/cortado-db/cortado/internal/index"
	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
)

// PlanQuery parses and plans a query over table t, in a partition holding
// counts[v] documents of each schema version v (nil: unknown, so an index
// some version lacks is building; empty: none is), with est for the
// posting counts (nil: every list taken as small), and resolves its
// order. Errors are ErrInvalidQuery or ErrIndexBuilding, with the
// parser's or planner's error (position, field) inside.
func PlanQuery(t *schema.Table, query, sort string, counts map[int]uint64, est index.Estimator) (index.Plan, index.Order, error) {
	if est == nil {
		est = func(string, []byte, []byte) int { return 1 }
	}
	q, err := index.Parse(query)
	if err != nil {
		return nil, index.Order{}, fmt.Errorf("%w: %w", ErrInvalidQuery, err)
	}
	plan, err := index.NewPlan(q, index.TableMetadata(t, counts), est)
	if err != nil {
		var be *index.BuildingError
		if errors.As(err, &be) {
			return nil, index.Order{}, fmt.Errorf("%w: %w", ErrIndexBuilding, err)
		}
		return nil, index.Order{}, fmt.Errorf("%w: %w", ErrInvalidQuery, err)
	}
	var o index.Order
	switch field := strings.TrimPrefix(sort, "-"); {
	case sort == "":
		o.Relevance = index.Scored(plan)
	default:
		ix, remaining, err := t.IndexStateFor(field, counts)
		switch {
		case err != nil:
			return nil, o, fmt.Errorf("%w: sort: %w", ErrInvalidQuery, err)
		case remaining > 0:
			if counts == nil {
				remaining = 0
			}
			return nil, o, fmt.Errorf("%w: sort: %w", ErrIndexBuilding, &index.BuildingError{Field: field, Remaining: remaining})
		case ix.Kind != schema.IndexAttribute || ix.Array:
			return nil, o, fmt.Errorf("%w: sort: field %s: sorting needs an attribute index on a field that is not an array", ErrInvalidQuery, field)
		}
		o.Field, o.Desc = field, strings.HasPrefix(sort, "-")
	}
	return plan, o, nil
}

// query answers a Scan with a query: the matching documents of the
// collection (the prefix's first part), or with no prefix of every
// collection of the partition, in the query's order, one page.
func (n *Node) query(ctx context.Context, t *schema.Table, p *storage.Partition, req ScanRequest) (*ScanResult, error) {
	r := p.IndexReader()
	defer r.Close()
	var coll []byte
	if len(req.Prefix) > 0 {
		coll = keys.Encode(req.Prefix[:1])
	}
	counts, err := r.VersionCounts(t.Name)
	if err != nil {
		return nil, err
	}
	plan, order, err := PlanQuery(t, req.Query, req.Sort, counts, index.Estimate(r, t.Name, coll))
	if err != nil {
		return nil, err
	}
	limit := req.CountLimit()
	var hits []index.Hit
	var more bool
	if coll != nil {
		s := &index.Search{Ctx: ctx, R: r, Table: t.Name, Coll: coll, Prefix: keys.Encode(req.Prefix)}
		var next []byte
		hits, next, err = s.Run(plan, order, req.After, limit)
		more = next != nil
	} else {
		hits, more, err = queryPartition(ctx, r, t.Name, plan, order, req.After, limit)
	}
	if errors.Is(err, index.ErrBadToken) || errors.Is(err, index.ErrTooBroad) {
		return nil, fmt.Errorf("%w: %w", ErrInvalidQuery, err)
	}
	if err != nil {
		return nil, err
	}
	res := &ScanResult{SCN: r.SCN}
	maxBytes, size := req.ByteLimit(), 0
	for i, h := range hits {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if size >= maxBytes {
			hits, more = hits[:i], true // the rest on the next page
			break
		}
		d, ok, err := r.Doc(t.Name, h.Key)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("partition %s/%d: the index names %x, which has no document", p.DB, p.ID, h.Key)
		}
		parts, err := keys.Decode(h.Key)
		if err != nil {
			return nil, err
		}
		it, err := n.render(t, parts, &d, req.Read)
		if err != nil {
			return nil, err
		}
		it.Position = index.Position(h)
		res.Items = append(res.Items, it)
		size += it.ScanBytes()
	}
	if more && len(hits) > 0 {
		res.Next = index.Position(hits[len(hits)-1])
	}
	return res, nil
}

// queryPartition runs a query over every collection of a partition and
// keeps the first limit hits after the token in the query's order (each
// collection's own, merged: relevance is scored per collection, as the
// index is local to it).
func queryPartition(ctx context.Context, r *storage.IndexReader, table string, plan index.Plan, order index.Order, after []byte, limit int) ([]index.Hit, bool, error) {
	var hits []index.Hit
	more := false
	var runErr error
	err := r.Collections(table, func(coll []byte) bool {
		if runErr = ctx.Err(); runErr != nil {
			return false
		}
		s := &index.Search{Ctx: ctx, R: r, Table: table, Coll: coll, Prefix: coll}
		h, next, err := s.Run(plan, order, after, limit)
		if err != nil {
			runErr = err
			return false
		}
		more = more || next != nil
		if len(h) > 0 { // most collections have no hit for most queries
			var cut bool
			hits, cut = index.Merge(order, [][]index.Hit{hits, h}, limit)
			more = more || cut
		}
		return true
	})
	if err == nil {
		err = runErr
	}
	return hits, more, err
}

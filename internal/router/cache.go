package router

import (
	"context"
	"time"

	"github.com/cortado-db/cortado/internal/keycache"
	"github.com/cortado-db/cortado/internal/node"
)

// cachedGet answers a read that accepts staleness (and sets no
// precondition) from the hot-key cache when it holds the document young
// enough; else it reads the document as written, hedged, and keeps it.
// The item returned is in req.Read's version and projection, as a
// storage node answers: the cache keeps whole documents, and projects
// and converts them here with the node's own node.Render (DESIGN §8).
func (r *Router) cachedGet(ctx context.Context, n node.Service, tg *target, req node.GetRequest, maxStale time.Duration) (it *node.Item, fromSlave, fromCache bool, err error) {
	k := keycache.Key(tg.db.Name, tg.table.Name, tg.key)
	if whole, age, ok := r.cache.Get(k, maxStale); ok {
		it, err := node.Render(ctx, r.reg, r.plans, tg.table, whole, req.Read)
		if err != nil {
			return nil, false, false, err
		}
		it.Stale = age
		return it, false, true, nil
	}
	read := r.cache.Begin(k)
	spec := req.Read
	req.Read = node.ReadSpec{}
	whole, fromSlave, err := r.hedgedGet(ctx, n, req, maxStale)
	if err != nil {
		return whole, fromSlave, false, err
	}
	if it, err = node.Render(ctx, r.reg, r.plans, tg.table, whole, spec); err != nil {
		return nil, false, false, err
	}
	r.cache.Put(read, whole)
	return it, fromSlave, false, nil
}

// CacheStats returns the hot-key cache's hits, misses, answers not kept
// because a write of their key went through this router meanwhile, and
// its entries and bytes.
func (r *Router) CacheStats() (hits, misses, skipped uint64, entries int, bytes uint64) {
	return r.cache.Stats()
}

// writing tells the hot-key cache that ops begin (see keycache.Writing),
// and returns what tells it they ended.
func (r *Router) writing(db string, ops []node.Op) (written func()) {
	if r.cache == nil {
		return func() {}
	}
	var ks []string
	for _, o := range ops {
		switch o.Kind {
		case node.OpInsert:
			// A new key: no read found it, and none was kept.
		case node.OpDeleteCollection:
			r.cache.WritingUnder(keycache.Key(db, o.Table, o.Key))
		default:
			k := keycache.Key(db, o.Table, o.Key)
			r.cache.Writing(k)
			ks = append(ks, k)
		}
	}
	return func() {
		for _, k := range ks {
			r.cache.Written(k)
		}
	}
}

package router

import (
	"context"
	"time"

	"github.com/cortado-db/cortado/internal/keycache"
	"github.com/cortado-db/cortado/internal/node"
)

// cachedGet answers a read that accepts staleness (and sets no
// precondition but If-None-Match or If-Modified-Since) from the hot-key
// cache when it holds the document young enough; else it reads the
// document as written, hedged, and keeps it. The item returned is in
// req.Read's version and projection, as a storage node answers: the
// cache keeps whole documents, and projects and converts them here with
// the node's own node.Render (DESIGN §8). A read its conditions find not
// modified returns node.ErrNotModified with the item's headers, as a
// node does.
func (r *Router) cachedGet(ctx context.Context, n node.Service, tg *target, req node.GetRequest, maxStale time.Duration) (it *node.Item, fromSlave, fromCache bool, err error) {
	k := keycache.Key(tg.db.Name, tg.table.Name, tg.key)
	cond, spec := req.Cond, req.Read
	whole, age, fromCache := r.cache.Get(k, maxStale)
	if fromCache {
		// The entry's age, not the answer's staleness when it was
		// read.
		cp := *whole
		cp.Stale, whole = age, &cp
	} else {
		read := r.cache.Begin(k)
		req.Read, req.Cond = node.ReadSpec{}, node.Preconditions{}
		if whole, fromSlave, err = r.hedgedGet(ctx, n, req, maxStale); err != nil {
			return whole, fromSlave, false, err
		}
		r.cache.Put(read, whole)
	}
	if err := cond.CheckRead(whole, spec.Version); err != nil {
		return node.NotModified(whole, spec.Version), fromSlave, fromCache, err
	}
	if it, err = node.Render(ctx, r.reg, r.plans, tg.table, whole, spec); err != nil {
		return nil, false, false, err
	}
	return it, fromSlave, fromCache, nil
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

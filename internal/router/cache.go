package router

import (
	"context"
	"time"

	"github.com/cortado-db/cortado/internal/cachetier"
	"github.com/cortado-db/cortado/internal/keycache"
	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
)

// cachedGet answers a read that accepts staleness (and sets no
// precondition but If-None-Match or If-Modified-Since) from the hot-key
// cache, or else the Redis cache tier, when it holds the document young
// enough; else it reads the document as written, hedged. It keeps what
// it read in the hot-key cache. The item returned is in req.Read's
// version and projection, as a storage node answers: the caches keep
// whole documents, projected and converted here with the node's own
// node.Render (DESIGN §8). A read its conditions find not
// modified returns node.ErrNotModified with the item's headers, as a
// node does.
func (r *Router) cachedGet(ctx context.Context, n node.Service, tg *target, req node.GetRequest, maxStale time.Duration) (it *node.Item, from source, err error) {
	k := keycache.Key(tg.db.Name, tg.table.Name, tg.key)
	cond, spec := req.Cond, req.Read
	whole, age, hit := r.cache.Get(k, maxStale)
	if hit {
		// The entry's age, not the answer's staleness when it was
		// read.
		cp := *whole
		cp.Stale, whole, from = age, &cp, fromHotKeys
	} else {
		read := r.cache.Begin(k)
		if d, age, ok := r.tier.Get(ctx, tg.db.Name, tg.part, tg.table.Name, keys.Encode(tg.key), maxStale); ok {
			whole = &node.Item{Key: tg.key, SCN: d.SCN, Modified: d.Modified, ETag: d.ETag(), Body: d.Value, BodyVersion: d.Version, Stale: age}
			from = fromTier
		} else {
			req.Read, req.Cond = node.ReadSpec{}, node.Preconditions{}
			var fromSlave bool
			if whole, fromSlave, err = r.hedgedGet(ctx, n, req, maxStale); err != nil {
				return whole, sourceOf(fromSlave), err
			}
			from = sourceOf(fromSlave)
		}
		r.cache.Put(read, whole)
	}
	if err := cond.CheckRead(whole, spec.Version); err != nil {
		return node.NotModified(whole, spec.Version), from, err
	}
	if it, err = node.Render(ctx, r.reg, r.plans, tg.table, whole, spec); err != nil {
		return nil, fromNode, err
	}
	return it, from, nil
}

// source says what answered a read.
type source uint8

const (
	fromNode    source = iota // the master, or a node that answered as one
	fromSlave                 // a slave, within the read's max-stale
	fromHotKeys               // the router's hot-key cache
	fromTier                  // the Redis cache tier
)

func sourceOf(slave bool) source {
	if slave {
		return fromSlave
	}
	return fromNode
}

// SetTier makes the router answer reads that accept staleness from the
// Redis cache tier t, after its hot-key cache and before the storage
// nodes (DESIGN §8); nil: no tier.
func (r *Router) SetTier(t *cachetier.Tier) { r.tier = t }

// TierStats returns the cache tier's read counts (cachetier.Tier.Stats).
func (r *Router) TierStats() (hits, misses, tooOld, failed, skipped uint64) {
	return r.tier.Stats()
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
		case node.OpInsert, node.OpKeepMark:
			// A new key: no read found it, and none was kept. A mark
			// changes no document.
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

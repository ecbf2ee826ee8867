package router

import (
	"context"
	"time"

	"github.com/cortado-db/cortado/internal/keycache"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/schema"
)

// cachedGet answers a read that accepts staleness (and sets no
// precondition) from the hot-key cache when it holds the document young
// enough; else it reads the document as written, hedged, and keeps it.
// The item returned is in req.Read's version and projection, as a
// storage node answers: the cache keeps whole documents, and projects
// and converts them here (DESIGN §8).
func (r *Router) cachedGet(ctx context.Context, n node.Service, tg *target, req node.GetRequest, maxStale time.Duration) (it *node.Item, fromSlave, fromCache bool, err error) {
	k := keycache.Key(tg.db.Name, tg.table.Name, tg.key)
	if whole, age, ok := r.cache.Get(k, maxStale); ok {
		it, err := r.asRead(ctx, tg.table, whole, req.Read)
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
	if it, err = r.asRead(ctx, tg.table, whole, spec); err != nil {
		return nil, false, false, err
	}
	r.cache.Put(read, whole)
	return it, fromSlave, false, nil
}

// asRead is a document read as written in spec's version and projection,
// with the entity tag a storage node gives that representation. The
// stored bytes are shared when nothing changes them.
func (r *Router) asRead(ctx context.Context, t *schema.Table, whole *node.Item, spec node.ReadSpec) (*node.Item, error) {
	version := spec.Version
	if version == 0 {
		version = whole.BodyVersion
	}
	if t.Version(whole.BodyVersion) == nil || t.Version(version) == nil {
		// Written with a version registered through another process
		// that this one has not seen yet (as a storage node's render).
		var err error
		if t, err = r.reg.TableAtLeast(ctx, t.Database, t.Name, max(whole.BodyVersion, version)); err != nil {
			return nil, err
		}
	}
	plan, err := r.plans.Plan(t, whole.BodyVersion, version, spec.Fields)
	if err != nil {
		return nil, err
	}
	body := whole.Body
	if !plan.Identity() {
		if body, err = plan.Apply(nil, whole.Body); err != nil {
			return nil, err
		}
	}
	return &node.Item{Key: whole.Key, SCN: whole.SCN, Modified: whole.Modified,
		ETag: schema.WithSuffix(whole.ETag, schema.VersionSuffix(whole.BodyVersion, version)),
		Body: body, BodyVersion: version, Stale: whole.Stale}, nil
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

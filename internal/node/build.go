package node

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
)

// Building an index for existing documents. A document is indexed as the
// schema version it was written with says, so an index that a later
// version adds lacks the documents written before it; a partition knows
// how many documents of each version it holds, and a query on such a
// field answers 409 index-building until none is left. A master builds
// the index by rewriting those documents in the latest version — ordinary
// replicated writes (conditional on the document not having changed
// meanwhile), so slaves index them as they apply them, and a restart, a
// failover or a new master simply goes on with what is left. The content
// does not change; its schema version, ETag, SCN and Last-Modified do, and
// the change stream shows the rewrite as an update.

// DefaultIndexBuildRate is how many documents a second a storage node
// rewrites to build indexes.
const DefaultIndexBuildRate = 500

// buildCursor is where a build resumes in a partition's table.
type buildCursor struct {
	db    string
	id    int
	table string
}

// RunIndexBuilds builds, until ctx ends, the indexes the latest schema
// versions add on the partitions this node masters, rewriting at most
// rate documents a second (default DefaultIndexBuildRate).
func (n *Node) RunIndexBuilds(ctx context.Context, rate int) {
	if rate <= 0 {
		rate = DefaultIndexBuildRate
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	cursors := map[buildCursor][]byte{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n.BuildIndexes(ctx, rate, cursors)
	}
}

// BuildIndexes rewrites, once, up to budget documents that an index of
// their table's latest version lacks, on the partitions this node
// masters; cursors (nil: from the start) remember where each table's scan
// stopped. It reports what is left through Options.IndexBuilding.
func (n *Node) BuildIndexes(ctx context.Context, budget int, cursors map[buildCursor][]byte) {
	if cursors == nil {
		cursors = map[buildCursor][]byte{}
	}
	left := map[[2]string]uint64{}
	defer func() {
		if n.opts.IndexBuilding != nil {
			for k, v := range left {
				n.opts.IndexBuilding(k[0], k[1], v)
			}
		}
	}()
	for _, k := range n.hosted() {
		if n.Role(k.db, k.id) != Master {
			continue
		}
		p, err := n.partition(k.db, k.id)
		if err != nil {
			continue
		}
		for _, t := range n.reg.Tables(k.db) {
			stale, remaining := toRewrite(p, t)
			if len(stale) == 0 {
				continue
			}
			left[[2]string{k.db, t.Name}] += remaining
			if remaining == 0 || budget <= 0 {
				continue
			}
			c := buildCursor{k.db, k.id, t.Name}
			done, next := n.rewrite(ctx, p, k, t, stale, cursors[c], budget)
			budget -= done
			cursors[c] = next
			left[[2]string{k.db, t.Name}] -= uint64(min(uint64(done), remaining))
		}
	}
}

// staleVersions are the versions of t that do not index some field the
// latest version indexes the way it does.
func staleVersions(t *schema.Table) []int {
	latest := t.Latest()
	var out []int
	for _, v := range t.Versions[:len(t.Versions)-1] {
		for _, ix := range latest.Indexes {
			if o := v.Index(ix.Field); o == nil || *o != ix {
				out = append(out, v.Number)
				break
			}
		}
	}
	return out
}

// rewrite rewrites up to max documents of stale versions after cursor,
// one write each; it returns how many it rewrote and where to resume (nil:
// the table's end was reached, start over next time).
func (n *Node) rewrite(ctx context.Context, p *storage.Partition, k partitionKey, t *schema.Table, stale []int, cursor []byte, max int) (int, []byte) {
	type doc struct {
		key []keys.Part
		enc []byte
		d   storage.Doc
	}
	var found []doc
	var last []byte
	end := true
	err := p.Scan(storage.ScanOptions{Table: t.Name, After: cursor}, func(key []keys.Part, enc []byte, d storage.Doc) bool {
		last = append(last[:0], enc...)
		if slices.Contains(stale, d.Version) {
			found = append(found, doc{key, append([]byte(nil), enc...), d})
		}
		if len(found) >= max {
			end = false
			return false
		}
		return true
	})
	if err != nil {
		n.log.Warn("index build: scan", "db", k.db, "partition", k.id, "table", t.Name, "err", err)
		return 0, nil
	}
	latest := t.Latest().Number
	done := 0
	for _, f := range found {
		if ctx.Err() != nil {
			return done, f.enc
		}
		plan, err := n.plans.Plan(t, f.d.Version, latest, nil)
		if err != nil {
			continue
		}
		value, err := plan.Apply(nil, f.d.Value)
		if err != nil {
			continue
		}
		op := Op{Kind: OpPut, Table: t.Name, Key: f.key, Version: latest, Value: value, Cond: Preconditions{IfMatch: []string{f.d.ETag()}}}
		_, err = n.Write(ctx, WriteRequest{DB: k.db, Partition: k.id, Ops: []Op{op}})
		switch {
		case err == nil:
			done++
		case errors.Is(err, ErrPreconditionFailed):
			// Changed meanwhile: its new version decides.
		default:
			n.log.Warn("index build: rewrite", "db", k.db, "partition", k.id, "table", t.Name, "err", err)
			return done, f.enc // not master any more, or no replicas: later
		}
	}
	if end {
		return done, nil
	}
	return done, last
}

// indexBuildLeft is, per table of db, how many documents of partition p
// the indexes of the latest schema version still lack (nil: none).
func (n *Node) indexBuildLeft(db string, p *storage.Partition) map[string]uint64 {
	var out map[string]uint64
	for _, t := range n.reg.Tables(db) {
		if _, left := toRewrite(p, t); left > 0 {
			if out == nil {
				out = map[string]uint64{}
			}
			out[t.Name] = left
		}
	}
	return out
}

// toRewrite returns the versions of t whose documents an index build
// rewrites, and how many such documents partition p holds.
func toRewrite(p *storage.Partition, t *schema.Table) (stale []int, documents uint64) {
	stale = staleVersions(t)
	if len(stale) == 0 {
		return nil, 0
	}
	counts, err := p.VersionCounts(t.Name)
	if err != nil {
		return nil, 0
	}
	for _, v := range stale {
		documents += counts[v]
	}
	return stale, documents
}

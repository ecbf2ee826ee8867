package controller

import (
	"context"

	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
	"github.com/cortado-db/cortado/internal/topo"
)

// raise follows a raise of a database's minInSync to k
// (schema.Database.FailoverInSync): for each partition, the master and
// generation that first reported counting acknowledgements by k, and its
// SCN then.
type raise struct {
	k     int
	marks map[int]raiseMark
}

type raiseMark struct {
	master string
	gen    uint32
	at     storage.SCN
}

// settleRaise ends a raise of db's minInSync once every partition's
// writes of before it are held by as many replicas as the raised value:
// from then on a failover may count replicas' answers by it
// (Registry.SettleInSync clears FailoverInSync).
//
// A master reports the minInSync it counts by before its SCN
// (node.PartitionStatus.InSync), and counts every write made durable
// after that SCN by it or more: so once a partition's master, in its
// generation, has reported the raised value at some SCN and, in a later
// round, that many of its replicas hold that SCN, no acknowledged write
// of the partition is held by fewer. A partition whose master or
// generation changes starts over; nothing settles in a round whose table
// was not the one in force throughout (the caller's), nor while a
// partition has no master.
func (c *Controller) settleRaise(ctx context.Context, db *schema.Database, t *topo.RoutingTable, statuses map[string]map[int]node.PartitionStatus) {
	if t == nil || statuses == nil {
		return
	}
	k := db.InSync()
	if c.raising == nil {
		c.raising = map[string]*raise{}
	}
	r := c.raising[db.Name]
	if r == nil || r.k != k {
		r = &raise{k: k, marks: map[int]raiseMark{}}
		c.raising[db.Name] = r
	}
	settled := 0
	for p, route := range t.Partitions {
		if len(route.Replicas) == 0 {
			delete(r.marks, p)
			continue
		}
		m := route.Replicas[0]
		st, ok := statuses[m][p]
		if !ok || st.Role != node.Master || st.Generation != route.Generation || st.InSync < k {
			delete(r.marks, p)
			continue
		}
		mark, ok := r.marks[p]
		if !ok || mark.master != m || mark.gen != route.Generation {
			r.marks[p] = raiseMark{master: m, gen: route.Generation, at: st.SCN}
			continue
		}
		held := 0
		for _, id := range route.Replicas {
			if s, ok := statuses[id][p]; ok && !s.SCN.Less(mark.at) {
				held++
			}
		}
		if held >= k {
			settled++
		}
	}
	if settled < len(t.Partitions) {
		return
	}
	if err := c.Registry.SettleInSync(ctx, db.Name, k); err != nil {
		c.Log.Warn("controller: settle a raised minInSync", "db", db.Name, "minInSync", k, "err", err)
		return
	}
	delete(c.raising, db.Name)
	c.Log.Info("controller: minInSync raised: failovers count by it now", "db", db.Name, "minInSync", k)
}

package node

import (
	"context"
	"time"

	"github.com/cortado-db/cortado/internal/storage"
)

// DefaultRetentionInterval is how often RunRetention trims.
const DefaultRetentionInterval = 10 * time.Second

// RunRetention trims the commit logs of the partitions this node hosts
// every interval (default DefaultRetentionInterval) until ctx ends.
func (n *Node) RunRetention(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultRetentionInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n.Retain(time.Now())
	}
}

// Retain trims, once, each hosted partition's log by its database's
// retention (schema.Retention). A master keeps what a live slave of the
// partition has not acknowledged, unless that slave is more than the
// database's maxSlaveLag behind (it is rebuilt from a snapshot when it
// asks), and trims nothing until each live slave has acknowledged once in
// its mastership. Nor does it trim past the SCN of a snapshot it streams,
// or streamed within Options.SnapshotPinGrace (snapshotPins). Every
// replica keeps what is not acknowledged to clients: a truncation needs
// it.
func (n *Node) Retain(now time.Time) {
	n.pins.prune(now)
	ids := n.hosted()
	type totals struct{ trimmed, bytes int64 }
	sums := map[string]*totals{}
	defer func() {
		if n.opts.Retained != nil {
			for db, t := range sums {
				n.opts.Retained(db, t.trimmed, t.bytes)
			}
		}
	}()
	for _, k := range ids {
		d, err := n.reg.Database(k.db)
		if err != nil {
			continue
		}
		p, err := n.partition(k.db, k.id)
		if err != nil {
			continue
		}
		t := sums[k.db]
		if t == nil {
			t = &totals{}
			sums[k.db] = t
		}
		t.bytes += p.LogBytes()
		age, size, slaveLag := d.Retention.Limits()
		policy := storage.RetentionPolicy{MaxAge: age, MaxBytes: size, Now: now}
		if n.Role(k.db, k.id) == Master {
			keep, ok := n.slavePin(p, k, now.Add(-slaveLag))
			if !ok {
				continue
			}
			policy.Keep = keep
			if n.syncSlaves(k.db) == 0 {
				// Without semi-sync no write waits for slaves, so none
				// raises the acknowledged watermark: what every live
				// slave holds (all of it, with none) can never be
				// truncated, and is.
				n.holdAll(p, k)
			}
		}
		if pin, ok := n.pins.oldest(k, now); ok {
			if pin.IsZero() {
				continue // a snapshot of the empty partition: all of it
			}
			if policy.Keep.IsZero() || pin.Less(policy.Keep) {
				policy.Keep = pin
			}
		}
		point, err := p.TrimPoint(policy)
		if err != nil || point.IsZero() {
			if err != nil {
				n.log.Warn("retention: trim point", "db", k.db, "partition", k.id, "err", err)
			}
			continue
		}
		if pin, ok := n.pins.oldest(k, now); ok && pin.Less(point) {
			// A snapshot pinned the log since the look above: trim at
			// the next pass. One that pins after this look pins the
			// partition's SCN then, no less than the point.
			continue
		}
		freed, err := p.Trim(point)
		if err != nil {
			n.log.Warn("retention: trim", "db", k.db, "partition", k.id, "through", point, "err", err)
			continue
		}
		t.trimmed += freed
		t.bytes -= freed
	}
}

// slavePin returns the oldest position of the partition's live slaves
// that committed after laggard (zero: none pins), and false when a live
// slave has not acknowledged anything in this mastership yet.
func (n *Node) slavePin(p *storage.Partition, k partitionKey, laggard time.Time) (storage.SCN, bool) {
	e := n.roles.entry(k.db, k.id)
	e.ackMu.Lock()
	positions := make([]storage.SCN, 0, len(e.slaves))
	for _, id := range e.slaves {
		scn, ok := e.acks[id]
		if !ok {
			e.ackMu.Unlock()
			return storage.SCN{}, false
		}
		positions = append(positions, scn)
	}
	e.ackMu.Unlock()
	var keep storage.SCN
	for _, scn := range positions {
		if !scn.IsZero() {
			when, held, err := p.CommitTime(scn)
			if err != nil {
				return storage.SCN{}, false
			}
			if held && when.Before(laggard) {
				continue // too far behind: rebuilt from a snapshot instead
			}
		}
		if keep.IsZero() || scn.Less(keep) {
			keep = scn
			if scn.IsZero() {
				// A slave at the very beginning pins everything (zero
				// means "no pin" to TrimPoint).
				return storage.SCN{}, false
			}
		}
	}
	return keep, true
}

// holdAll raises an asynchronous (or single-replica) master's
// acknowledged watermark to what each of its live slaves holds, or to its
// last commit when it has none.
func (n *Node) holdAll(p *storage.Partition, k partitionKey) {
	e := n.roles.entry(k.db, k.id)
	e.ackMu.Lock()
	held := p.SCN()
	for _, id := range e.slaves {
		scn, ok := e.acks[id]
		if !ok {
			e.ackMu.Unlock()
			return
		}
		if scn.Less(held) {
			held = scn
		}
	}
	e.ackMu.Unlock()
	p.Acknowledged(held)
}

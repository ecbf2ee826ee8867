package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cortado-db/cortado/internal/storage"
)

// SnapshotRequest asks for a consistent snapshot of one partition.
type SnapshotRequest struct {
	DB        string
	Partition int
	// BytesPerSecond throttles the stream below the node's own limit
	// (0: the node's limit).
	BytesPerSecond int64
	// Replicated waits, before the first chunk, until every commit the
	// snapshot holds is held by as many replicas as a write's
	// acknowledgement needs, as a read on the master waits for what it
	// returns: what it streams cannot un-happen in a failover. A backup
	// and a change stream ask for it. A replica's rebuild must not: the
	// commits it lacks may be waiting for its own acknowledgement.
	Replicated bool
}

// SnapshotChunk is one part of a snapshot stream. The first says the SCN
// the snapshot is consistent at, the timeline's history up to it and the
// acknowledged watermark; the last (Last) carries the auto-increment
// marks. Rows come in key order.
type SnapshotChunk struct {
	SCN     storage.SCN
	History []storage.SCN
	Acked   storage.SCN
	Rows    []storage.Row
	Marks   []storage.Mark
	Last    bool
	// Replicated, on the first chunk, says the master waited as the
	// request's Replicated asked (a node of protocol 6 or older does
	// not).
	Replicated bool
}

// Snapshotter streams partition snapshots: a Node, or a Remote one.
type Snapshotter interface {
	Snapshot(ctx context.Context, req SnapshotRequest, fn func(*SnapshotChunk) error) error
}

// DefaultSnapshotRate is how fast a node streams a snapshot unless
// Options.SnapshotBytesPerSecond says otherwise: interactive traffic keeps
// most of the disk.
const DefaultSnapshotRate = 64 << 20

// MaxSnapshots is how many snapshots a node streams at once; minSnapshotRate
// the slowest an asker may ask one to go.
const (
	MaxSnapshots    = 4
	minSnapshotRate = 1 << 20
)

// snapshotChunkBytes bounds one chunk (far below wire.MaxMessageBytes).
const snapshotChunkBytes = 1 << 20

// snapshotRate is how fast a snapshot streams, in bytes a second: the
// node's rate, or the asker's if slower, but never below minSnapshotRate
// (or the node's rate, if that is lower).
func (n *Node) snapshotRate(req SnapshotRequest) int64 {
	rate := n.opts.SnapshotBytesPerSecond
	if req.BytesPerSecond > 0 && req.BytesPerSecond < rate {
		rate = max(req.BytesPerSecond, min(rate, minSnapshotRate))
	}
	return rate
}

// Snapshot streams a consistent snapshot of a partition to fn, throttled.
func (n *Node) Snapshot(ctx context.Context, req SnapshotRequest, fn func(*SnapshotChunk) error) error {
	p, err := n.partition(req.DB, req.Partition)
	if err != nil {
		return err
	}
	// Only the master in force streams a snapshot: every asker (a
	// replica being rebuilt, a relay, a change stream, a backup, the
	// cache tier) takes it for the partition's state, and a slave — one
	// behind, or one being rebuilt and empty, named master by a stale
	// routing table — would give it an older one. (The fault run's
	// backups found that: a backup through a router cut off from etcd
	// lacked thousands of acknowledged writes.)
	lease, ok := n.roles.masterLease(req.DB, req.Partition)
	if !ok {
		e, _ := n.roles.lookup(req.DB, req.Partition)
		if e != nil {
			e.mu.RLock()
			defer e.mu.RUnlock()
		}
		return fmt.Errorf("a snapshot: %w", notMaster(req.DB, req.Partition, e))
	}
	if req.Replicated {
		// The replicas catch up with what the partition holds now
		// before the snapshot takes a slot, so that while no replica
		// acknowledges, askers waiting for them hold none of the slots
		// a replica's rebuild needs. Only the commits made meanwhile
		// are waited for with a slot held, below.
		if err := n.awaitReplicated(ctx, p, p.SCN()); err != nil {
			return fmt.Errorf("partition %s/%d: a snapshot: %w", req.DB, req.Partition, err)
		}
	}
	// A snapshot pins Pebble's files while it streams: a node streams a
	// few at once, each at least at minSnapshotRate, so none lasts
	// without bound whatever the asker says.
	select {
	case n.snapshots <- struct{}{}:
		defer func() { <-n.snapshots }()
	default:
		return fmt.Errorf("partition %s/%d: %d snapshots already streaming: %w", req.DB, req.Partition, cap(n.snapshots), ErrUnavailable)
	}
	rate := n.snapshotRate(req)
	// Taken before the snapshot, so the snapshot holds what it names.
	acked := n.acknowledged(p, req.DB, req.Partition)
	// The asker reads the log on from the snapshot's SCN: it stays in
	// the log while the snapshot streams, and for a grace after. Pinned
	// before the snapshot is taken, at the partition's SCN then (no
	// later than the snapshot's), so that a retention pass that has not
	// seen the pin trims no further than that (Retain).
	pin := n.pins.add(partitionKey{req.DB, req.Partition}, p.SCN(), time.Now())
	defer func() { n.pins.release(pin, time.Now().Add(n.opts.SnapshotPinGrace)) }()
	snap, err := p.Snapshot(ctx)
	if err != nil {
		return err
	}
	defer snap.Close()
	// A master paused between the check and the snapshot may have been
	// replaced meanwhile, as for a fresh read.
	if err := n.inForce(req.DB, req.Partition, lease); err != nil {
		return err
	}
	if req.Replicated {
		// Bounded as a write's wait for its replicas is: a snapshot
		// whose commits no replica takes fails (its asker tries again),
		// and pins nothing meanwhile but the snapshot itself.
		if err := n.awaitReplicated(ctx, p, snap.SCN); err != nil {
			return fmt.Errorf("partition %s/%d: a snapshot at %s: %w", req.DB, req.Partition, snap.SCN, err)
		}
	}
	pace := pacer{rate: rate, start: time.Now()}
	if snap.SCN.Less(acked) {
		acked = snap.SCN
	}
	chunk := &SnapshotChunk{SCN: snap.SCN, History: snap.History, Acked: later(snap.Acked, acked), Replicated: req.Replicated}
	size := 0
	flush := func() error {
		if err := pace.wait(ctx, size); err != nil {
			return err
		}
		if err := fn(chunk); err != nil {
			return err
		}
		chunk, size = &SnapshotChunk{SCN: snap.SCN}, 0
		return nil
	}
	err = snap.Rows(func(r storage.Row) error {
		chunk.Rows = append(chunk.Rows, storage.Row{Table: r.Table, Key: append([]byte(nil), r.Key...), Value: append([]byte(nil), r.Value...)})
		size += len(r.Table) + len(r.Key) + len(r.Value) + 8
		if size >= snapshotChunkBytes {
			return flush()
		}
		return ctx.Err()
	})
	if err != nil {
		return fmt.Errorf("partition %s/%d: snapshot: %w", req.DB, req.Partition, err)
	}
	if chunk.Marks, err = snap.Marks(); err != nil {
		return err
	}
	chunk.Last = true
	return flush()
}

// pacer spreads bytes over time at rate bytes a second.
type pacer struct {
	rate  int64
	start time.Time
	sent  int64
}

func (p *pacer) wait(ctx context.Context, n int) error {
	p.sent += int64(n)
	if p.rate <= 0 {
		return ctx.Err()
	}
	due := p.start.Add(time.Duration(float64(p.sent) / float64(p.rate) * float64(time.Second)))
	d := time.Until(due)
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ErrRebuild is returned by Follow when the replica must be rebuilt from
// a snapshot: its position is before its source's retained log, or a
// truncation would need commits its own log no longer holds.
var ErrRebuild = errors.New("replica must be rebuilt from a snapshot")

// Rebuild replaces this node's replica of a partition with a snapshot of
// it streamed from src (its master), and returns how many rows it
// installed. The replica then follows on from the snapshot's SCN.
func (n *Node) Rebuild(ctx context.Context, db string, id int, src Snapshotter) (int, error) {
	p, err := n.partition(db, id)
	if err != nil {
		return 0, err
	}
	if n.Role(db, id) == Master {
		return 0, fmt.Errorf("partition %s/%d: a master is never rebuilt", db, id)
	}
	// No read is answered from a half-installed replica.
	e := n.roles.entry(db, id)
	e.setRebuilding(true)
	defer e.setRebuilding(false)
	in, err := p.BeginInstall()
	if err != nil {
		return 0, err
	}
	var first *SnapshotChunk
	finished := false
	err = src.Snapshot(ctx, SnapshotRequest{DB: db, Partition: id}, func(c *SnapshotChunk) error {
		if first == nil {
			first = c
		}
		for _, r := range c.Rows {
			if err := in.Row(r); err != nil {
				return err
			}
		}
		if !c.Last {
			return nil
		}
		_, err := in.Finish(first.SCN, first.History, first.Acked, c.Marks)
		finished = err == nil
		return err
	})
	if err == nil && !finished {
		err = fmt.Errorf("partition %s/%d: the snapshot stream ended early", db, id)
	}
	if err != nil {
		in.Abort()
		return 0, err
	}
	return in.Rows(), nil
}

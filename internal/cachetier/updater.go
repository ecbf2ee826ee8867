package cachetier

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
)

// Sources tells the updater where to read: a partition's log (a relay,
// or its master), its snapshot, and its master, asked for its newest
// commit.
type Sources interface {
	Log(db string, partition int) (node.LogSource, error)
	Snapshot(db string, partition int) (node.Snapshotter, error)
	Master(db string, partition int) (node.Acker, error)
}

// Updater keeps the tier current: one follower a partition of each
// database it follows, and one bootstrapper.
type Updater struct {
	tier *Tier
	reg  *registry.Registry
	src  Sources
	log  *slog.Logger

	// walks bounds the snapshots read at once (a storage node streams
	// only node.MaxSnapshots, for replicas too).
	walks chan struct{}

	// Counters (UpdaterStats).
	written, loads, passes atomic.Uint64
}

// maxWalks is how many snapshots an updater reads at once.
const maxWalks = 2

// NewUpdater returns an updater writing through t.
func NewUpdater(t *Tier, reg *registry.Registry, src Sources, log *slog.Logger) *Updater {
	return &Updater{tier: t, reg: reg, src: src, log: log, walks: make(chan struct{}, maxWalks)}
}

// Stats counts entries written, snapshots loaded after an updater lost
// its place (or started), and bootstrap passes over a partition.
func (u *Updater) Stats() (written, loads, passes uint64) {
	return u.written.Load(), u.loads.Load(), u.passes.Load()
}

// discoverEvery is how often Run looks for databases to follow.
const discoverEvery = 2 * time.Second

// Run follows every database the options name (all: those the registry
// holds, and those created later) until ctx ends, then waits for its
// goroutines.
func (u *Updater) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		u.bootstrap(ctx)
	}()
	following := map[string]bool{}
	tick := time.NewTicker(discoverEvery)
	defer tick.Stop()
	for {
		for _, db := range u.databases() {
			if following[db.Name] {
				continue
			}
			following[db.Name] = true
			for p := range db.Partitions {
				wg.Add(1)
				go func() {
					defer wg.Done()
					u.follow(ctx, db.Name, p)
				}()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// databases are those the updater follows.
func (u *Updater) databases() []*schema.Database {
	var out []*schema.Database
	for _, d := range u.reg.Databases() {
		if u.tier.holds(d.Name) {
			out = append(out, d)
		}
	}
	return out
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// follow keeps one partition's entries current until ctx ends or its
// database is gone, starting again after a pause when a read or write
// fails.
func (u *Updater) follow(ctx context.Context, db string, part int) {
	pause := 100 * time.Millisecond
	for ctx.Err() == nil {
		if _, err := u.reg.Database(db); err != nil {
			sleep(ctx, discoverEvery) // deleted, or not here yet: created again, it is followed again
			continue
		}
		err := u.followOnce(ctx, db, part)
		if ctx.Err() != nil {
			return
		}
		u.log.Debug("cache tier: following a partition", "db", db, "partition", part, "err", err)
		sleep(ctx, pause)
		pause = min(2*pause, 5*time.Second)
	}
}

// markLife is how long a follower waits to reach the newest commit a
// master named before it asks again.
const markLife = 2 * time.Second

// heldBackPause is how long a follower first waits before asking again
// when its source had commits but none yet acknowledged.
const heldBackPause = 5 * time.Millisecond

// followOnce resumes where Redis says the partition's entries are (after
// loading a snapshot when they are nowhere) and follows its log.
func (u *Updater) followOnce(ctx context.Context, db string, part int) error {
	epoch, pos, ok, err := u.tier.meta(ctx, db, part)
	if err != nil {
		return err
	}
	var at storage.SCN
	if ok && pos != "" {
		at, err = storage.ParseSCN(pos)
	}
	// fallback, after a load, is the snapshot's SCN: where to go on
	// from if the log no longer holds the position the load left.
	var fallback storage.SCN
	if !ok || pos == "" || err != nil {
		if epoch, at, fallback, err = u.load(ctx, db, part); err != nil {
			return err
		}
	}
	var mark struct {
		set  bool
		t0   int64
		head storage.SCN
	}
	var asked time.Time
	heldBack := heldBackPause
	for ctx.Err() == nil {
		if time.Since(asked) >= u.tier.opts.FreshEvery && (!mark.set || time.Since(asked) >= markLife) {
			// Each time, Redis must still hold what this follower left:
			// an idle partition's follower writes nothing that would
			// find out it lost it (restarted empty, meta evicted).
			if e, pos, ok, err := u.tier.meta(ctx, db, part); err != nil {
				return err
			} else if !ok || e != epoch || pos != at.String() {
				return errLost
			}
			// A mark not reached in markLife (its head a commit not
			// acknowledged yet, which may stay so until a later write
			// is) gives way to a new one.
			asked, mark.set = time.Now(), false
			t0, head, err := u.head(ctx, db, part, at)
			switch {
			case errors.Is(err, errOffTimeline):
				if epoch, at, fallback, err = u.load(ctx, db, part); err != nil {
					return err
				}
				continue
			case err == nil:
				mark.set, mark.t0, mark.head = true, t0, head
			default:
				u.log.Debug("cache tier: asking a master for its newest commit", "db", db, "partition", part, "err", err)
			}
		}
		if mark.set && !at.Less(mark.head) {
			if err := u.tier.setFresh(ctx, db, part, epoch, at.String(), mark.t0); err != nil {
				return err
			}
			mark.set = false
		}
		src, err := u.src.Log(db, part)
		if err != nil {
			return err
		}
		rctx, cancel := context.WithTimeout(ctx, u.tier.opts.WriteTimeout+time.Second)
		res, err := src.Log(rctx, node.LogRequest{DB: db, Partition: part, After: at, Wait: min(u.tier.opts.FreshEvery, time.Second), AckedOnly: true})
		cancel()
		switch {
		case err != nil:
			return err
		case res.Trimmed && at.Less(fallback):
			// Just loaded, from a watermark the log no longer holds:
			// on from the snapshot itself (its unacknowledged rows stay
			// placeholders until written again, or the bootstrapper).
			if err := u.tier.putEntries(ctx, db, part, epoch, at.String(), fallback.String(), nil); err != nil {
				return err
			}
			at, fallback = fallback, storage.SCN{}
			continue
		case res.Trimmed || res.Diverged:
			// Behind the retained log, or (which acknowledged commits
			// alone never make) off the timeline: start again from a
			// snapshot, in a new epoch.
			if epoch, at, fallback, err = u.load(ctx, db, part); err != nil {
				return err
			}
			continue
		case !res.Holds:
			return fmt.Errorf("partition %s/%d: the source does not hold %v", db, part, at)
		}
		var es []entry
		last := at
		for i := range res.Commits {
			c := &res.Commits[i]
			if res.Acked.Less(c.SCN) {
				break // not acknowledged yet: asked for again
			}
			for j := range c.Events {
				es = append(es, u.entryOf(c, &c.Events[j]))
			}
			last = c.SCN
		}
		if last != at {
			if err := u.tier.putEntries(ctx, db, part, epoch, at.String(), last.String(), es); err != nil {
				if errors.Is(err, errLost) {
					if epoch, at, fallback, err = u.load(ctx, db, part); err != nil {
						return err
					}
					continue
				}
				return err
			}
			u.written.Add(uint64(len(es)))
			at, heldBack = last, heldBackPause
		} else if len(res.Commits) > 0 {
			// Commits none of which is acknowledged yet (a new
			// master's first commit waits for the next write, or a
			// retention pass): ask again, less often the longer.
			sleep(ctx, heldBack)
			heldBack = min(2*heldBack, u.tier.opts.FreshEvery)
		}
	}
	return ctx.Err()
}

// entryOf is what a commit's event leaves: the document, a tombstone, or
// for a document larger than MaxDocBytes a placeholder that reads miss.
func (u *Updater) entryOf(c *storage.Commit, e *storage.Event) entry {
	en := entry{table: e.Table, key: e.Key, scn: c.SCN, known: true}
	switch {
	case e.Op == storage.OpDelete:
	case len(e.Value) > u.tier.opts.MaxDocBytes:
		en.known = false
	default:
		d := storage.Doc{Version: e.Version, SCN: c.SCN, Modified: c.Timestamp, CRC: crc32.ChecksumIEEE(e.Value), Value: e.Value}
		en.row = storage.AppendRow(nil, &d)
	}
	return en
}

// errOffTimeline says the partition's master does not hold the
// updater's position.
var errOffTimeline = errors.New("cachetier: the updater's position is not on the master's timeline")

// head asks the partition's master, in force and established, for its
// newest commit, and returns it with the Redis time taken before asking:
// every commit acknowledged before that time is at or before it. (Not
// the master's acknowledged watermark: a master newly promoted holds
// every commit its predecessor acknowledged, but its watermark is what
// it learned as a slave, and it lags until its own first write is
// acknowledged. The fault run found reads answered past their bound
// that way.)
func (u *Updater) head(ctx context.Context, db string, part int, at storage.SCN) (int64, storage.SCN, error) {
	t0, err := u.tier.now(ctx)
	if err != nil {
		return 0, storage.SCN{}, err
	}
	m, err := u.src.Master(db, part)
	if err != nil {
		return 0, storage.SCN{}, err
	}
	actx, cancel := context.WithTimeout(ctx, u.tier.opts.WriteTimeout)
	defer cancel()
	res, err := m.Ack(actx, node.AckRequest{DB: db, Partition: part, SCN: at})
	switch {
	case err != nil:
		return 0, storage.SCN{}, err
	case !res.Authoritative || res.Head.IsZero() && !at.IsZero():
		return 0, storage.SCN{}, fmt.Errorf("partition %s/%d: no master in force answered", db, part)
	case !res.Held:
		return 0, storage.SCN{}, errOffTimeline
	}
	return t0, res.Head, nil
}

// load starts the partition's next epoch and fills it from a snapshot;
// it returns the epoch and where to follow the log from: the
// snapshot's acknowledged watermark, so that the commits the snapshot
// held before they were acknowledged (placeholders) are written when the
// log says they are, and the snapshot's SCN, to follow from if the log
// no longer holds the watermark.
func (u *Updater) load(ctx context.Context, db string, part int) (epoch int64, from, snapAt storage.SCN, err error) {
	if epoch, err = u.tier.newEpoch(ctx, db, part); err != nil {
		return 0, from, snapAt, err
	}
	snapAt, acked, err := u.walk(ctx, db, part, epoch, "", time.Time{})
	if err != nil {
		return 0, from, snapAt, err
	}
	from = snapAt
	if acked.Less(snapAt) && !acked.IsZero() {
		from = acked
	}
	// The position last: until it is set, a follower elsewhere (or
	// this one, restarted) loads again.
	if err := u.tier.putEntries(ctx, db, part, epoch, "", from.String(), nil); err != nil {
		return 0, from, snapAt, err
	}
	u.loads.Add(1)
	return epoch, from, snapAt, nil
}

// walk writes a snapshot of the partition into epoch, checking its
// position is expect (anyPos: any) at each batch, and returns the SCN
// it was taken at and the acknowledged watermark it carried. Rows of commits not yet acknowledged when it was
// taken, and documents larger than MaxDocBytes, are placeholders. A
// walk with a deadline stops there (errTooLong).
func (u *Updater) walk(ctx context.Context, db string, part int, epoch int64, expect string, deadline time.Time) (at, acked storage.SCN, err error) {
	select {
	case u.walks <- struct{}{}:
		defer func() { <-u.walks }()
	case <-ctx.Done():
		return at, acked, ctx.Err()
	}
	snap, err := u.src.Snapshot(db, part)
	if err != nil {
		return at, acked, err
	}
	first := true
	req := node.SnapshotRequest{DB: db, Partition: part}
	if !deadline.IsZero() { // a bootstrap pass, not a load the follower waits for
		req.BytesPerSecond = u.tier.opts.BootstrapRate
	}
	err = snap.Snapshot(ctx, req, func(c *node.SnapshotChunk) error {
		if first {
			at, acked, first = c.SCN, c.Acked, false
		}
		if !deadline.IsZero() && time.Now().After(deadline) {
			return errTooLong
		}
		es := make([]entry, 0, len(c.Rows))
		for i := range c.Rows {
			r := &c.Rows[i]
			d, err := r.Doc()
			if err != nil {
				return fmt.Errorf("partition %s/%d: snapshot row: %w", db, part, err)
			}
			en := entry{table: r.Table, key: r.Key, scn: d.SCN, known: !acked.Less(d.SCN) && len(d.Value) <= u.tier.opts.MaxDocBytes}
			if en.known {
				en.row = r.Value
			}
			es = append(es, en)
		}
		if err := u.tier.putEntries(ctx, db, part, epoch, expect, anyPos, es); err != nil {
			return err
		}
		u.written.Add(uint64(len(es)))
		return nil
	})
	return at, acked, err
}

// errTooLong stops a bootstrap pass that outlived half the TTL: a
// tombstone written after its snapshot was taken could expire before
// the pass wrote the document it deleted.
var errTooLong = errors.New("cachetier: bootstrap pass outlived half the TTL")

// bootstrap walks every followed partition's snapshot every
// BootstrapEvery, refreshing the TTL of entries still current and
// writing those Redis lost, until ctx ends.
func (u *Updater) bootstrap(ctx context.Context) {
	every := u.tier.opts.BootstrapEvery
	for {
		sleep(ctx, every)
		if ctx.Err() != nil {
			return
		}
		start := time.Now()
		for _, db := range u.databases() {
			for p := range db.Partitions {
				if ctx.Err() != nil {
					return
				}
				epoch, pos, ok, err := u.tier.meta(ctx, db.Name, p)
				if err != nil || !ok || pos == "" {
					continue // its follower loads it
				}
				// Each partition's pass gets half the TTL from its own
				// snapshot's start.
				_, _, err = u.walk(ctx, db.Name, p, epoch, anyPos, time.Now().Add(u.tier.opts.TTL/2))
				if err != nil && ctx.Err() == nil {
					u.log.Warn("cache tier: bootstrap pass", "db", db.Name, "partition", p, "err", err)
					continue
				}
				u.passes.Add(1)
			}
		}
		u.log.Debug("cache tier: bootstrap pass", "took", time.Since(start))
	}
}

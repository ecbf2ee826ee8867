package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/coord"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/storage"
	"github.com/cortado-db/cortado/internal/topo"
)

// Agent carries out, on one storage node, what the routing tables say:
// it makes each of the node's partitions MASTER (in the table's
// generation), SLAVE (following the master's log) or OFFLINE.
type Agent struct {
	Client *clientv3.Client
	Prefix string
	ID     string
	Node   *node.Node
	Log    *slog.Logger
	// Truncated is told how many events a rejoining replica undid.
	Truncated func(int)
	// Alarm is told of a truncation refused because it would have
	// removed acknowledged commits (see storage.ErrTruncateAcknowledged).
	Alarm func(error)
	// Rebuilt, when set, is told of each replica rebuilt from a snapshot
	// (its position was behind its master's retained log) and how many
	// rows it installed.
	Rebuilt func(rows int)
	// Dropped, when set, is told of each copy deleted of a partition
	// this node is no replica of (topo.PartitionRoute.Drop).
	Dropped func()
	// LeftRelay, when set, is told each time a slave stops reading its
	// master's log through the relay: "behind" when the relay fell
	// silent while the master moved on (node.ErrRelayBehind), "failed"
	// when its stream failed or was silent for long.
	LeftRelay func(reason string)
	// Member, when set, is this node's membership: if its lease is lost
	// the agent fences every partition at once (no more writes).
	Member *topo.Member
	// DrainLimit bounds how long a new master waits for the old one to
	// step down and hand over its last commits (default 5s).
	DrainLimit time.Duration
	// MaxTransitions bounds the partitions changing role at once on this
	// node (default 16).
	MaxTransitions int
	// ProtocolVersion is the newest internal protocol version spoken to
	// masters and the relay (default wire.Version).
	ProtocolVersion uint32
	// Local, if set, holds the storage nodes and relay of this process
	// (serve --nodes N): replication calls them without the wire.
	Local *node.LocalPeers

	mu        sync.Mutex
	followers map[partKey]*follower
	relay     *topo.RelayWatch
	streams   node.Remotes // log streams: masters and the relay

	// takeOvers are the take-overs under way, by partition (under mu):
	// started by apply's transitions, ended on Run's goroutine. slots
	// bounds how many drain at once.
	takeOvers map[partKey]*takeOver
	slots     chan struct{}
}

// takeOver is one partition's take-over under way: the mastership it
// carries out (generation, and the old master it drains) and its
// goroutine.
type takeOver struct {
	gen  uint32
	from string
	task
}

// task is a goroutine the agent owns: cancel stops it, done is closed
// when it has finished.
type task struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func newTask(cancel context.CancelFunc) task { return task{cancel, make(chan struct{})} }

// end stops the goroutine and waits for it.
func (t *task) end() {
	t.cancel()
	<-t.done
}

// running says whether the goroutine has not finished.
func (t *task) running() bool {
	select {
	case <-t.done:
		return false
	default:
		return true
	}
}

// partitionsOf lists m's partitions (under a.mu).
func partitionsOf[V any](a *Agent, m map[partKey]*V) []partKey {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Collect(maps.Keys(m))
}

// take removes partition k's entry from m (under a.mu) and returns it.
func take[V any](a *Agent, m map[partKey]*V, k partKey) *V {
	a.mu.Lock()
	defer a.mu.Unlock()
	v := m[k]
	delete(m, k)
	return v
}

type partKey struct {
	db string
	id int
}

// follower is one partition's slave following its master.
type follower struct {
	master string
	url    string
	task
}

// Run applies every routing table, then each change, until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	a.followers = map[partKey]*follower{}
	a.takeOvers = map[partKey]*takeOver{}
	a.slots = make(chan struct{}, a.maxTransitions())
	a.streams.MaxVersion = a.ProtocolVersion
	a.streams.Local = a.Local
	defer a.streams.Close()
	rctx, stopRelays := context.WithCancel(ctx)
	a.relay = topo.WatchRelays(rctx, a.Client, a.Prefix)
	defer func() { stopRelays(); <-a.relay.Done() }()
	defer a.stopAll()
	var lost <-chan struct{}
	if a.Member != nil {
		lost = a.Member.Lost()
	}
	for ctx.Err() == nil {
		// Every table first (a Reset), then each change.
		wctx, cancel := context.WithCancel(ctx)
		w := coord.Watch(wctx, a.Client, topo.RoutingPrefix(a.Prefix))
	watching:
		for {
			select {
			case <-w.Done():
				break watching
			case c := <-w.Changes():
				// Of the tables that came meanwhile, each database's
				// newest: an older one would only be undone.
				var order []string
				latest := map[string][]byte{}
				for more := true; more; {
					for _, kv := range c.Puts() {
						if _, ok := latest[string(kv.Key)]; !ok {
							order = append(order, string(kv.Key))
						}
						latest[string(kv.Key)] = kv.Value
					}
					select {
					case c = <-w.Changes():
					default:
						more = false
					}
				}
				for _, k := range order {
					a.applyJSON(ctx, latest[k])
				}
			case <-lost:
				// Expelled from the cluster: whatever this node mastered
				// may have a new master already. Stop writing and
				// following, then start over from the current tables
				// (the member is rejoining meanwhile).
				a.Log.Warn("agent: lease lost; fencing every partition", "node", a.ID)
				a.endTakeOvers() // none becomes master after the fence
				a.Node.FenceAll()
				a.stopAll()
				lost = a.Member.Lost()
				break watching
			}
		}
		cancel()
		<-w.Done()
	}
	return nil
}

func (a *Agent) applyJSON(ctx context.Context, b []byte) {
	var t topo.RoutingTable
	if err := json.Unmarshal(b, &t); err != nil {
		a.Log.Error("agent: bad routing table", "err", err)
		return
	}
	a.apply(ctx, &t)
}

// apply carries out a routing table's transitions for this node, up to
// MaxTransitions at a time, in table order: it returns once each
// partition this node gives up, follows or keeps has its role, and every
// take-over has started. A take-over drains the old master (or the relay)
// in the background, so that a table that comes meanwhile is carried out
// at once: the partitions it takes from this node step down without
// waiting for this node's drains (the old masters those drains wait for
// may be waiting for this node's step-downs), and a take-over it changes
// is ended first. One it leaves as it was goes on, with the newest slaves.
func (a *Agent) apply(ctx context.Context, t *topo.RoutingTable) {
	if t.MinInSync > 0 {
		a.Node.SetInSyncFloor(t.DB, t.MinInSync)
	}
	var stepDown, takeOver []int
	for p, r := range t.Partitions {
		if len(r.Replicas) == 0 || r.Replicas[0] != a.ID {
			stepDown = append(stepDown, p)
			continue
		}
		if o := a.takeOverOf(partKey{t.DB, p}); o != nil && o.running() && o.gen == r.Generation && o.from == r.From {
			a.Node.SetSlaves(t.DB, p, liveSlaves(t, r))
			continue
		}
		takeOver = append(takeOver, p)
	}
	for _, parts := range [][]int{stepDown, takeOver} {
		sem := make(chan struct{}, a.maxTransitions())
		var wg sync.WaitGroup
		for _, p := range parts {
			if ctx.Err() != nil {
				break
			}
			// The take-over this table changes or ends, first.
			a.endTakeOver(partKey{t.DB, p})
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				if err := a.transition(ctx, t, p); err != nil {
					a.Log.Error("agent: transition", "db", t.DB, "partition", p, "err", err)
				}
			})
		}
		wg.Wait()
	}
}

func (a *Agent) maxTransitions() int {
	if a.MaxTransitions <= 0 {
		return DefaultMaxTransitions
	}
	return a.MaxTransitions
}

// liveSlaves are the replicas after the master in route that t lists
// as live nodes.
func liveSlaves(t *topo.RoutingTable, route topo.PartitionRoute) []string {
	var slaves []string
	for _, id := range route.Replicas[1:] {
		if _, live := t.Nodes[id]; live {
			slaves = append(slaves, id)
		}
	}
	return slaves
}

func (a *Agent) takeOverOf(k partKey) *takeOver {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.takeOvers[k]
}

// endTakeOver stops partition k's take-over, if one is under way, and
// waits for it; only Run's goroutine calls it, between transitions of k.
func (a *Agent) endTakeOver(k partKey) {
	if o := take(a, a.takeOvers, k); o != nil {
		o.end()
	}
}

// endTakeOvers is endTakeOver for every partition.
func (a *Agent) endTakeOvers() {
	for _, k := range partitionsOf(a, a.takeOvers) {
		a.endTakeOver(k)
	}
}

// startTakeOver makes this replica master of partition p (route) in the
// background, once a slot is free: it stops following, drains the old
// master or the relay (takeOver), and becomes master; if the drain fails
// it follows the old master again (its commits are still needed here) and
// the controller chooses again if the partition stays without a master.
// transition calls it on Run's goroutine.
func (a *Agent) startTakeOver(ctx context.Context, t *topo.RoutingTable, p int, route topo.PartitionRoute, lease int64) {
	k := partKey{t.DB, p}
	octx, cancel := context.WithCancel(ctx)
	o := &takeOver{gen: route.Generation, from: route.From, task: newTask(cancel)}
	a.mu.Lock()
	a.takeOvers[k] = o
	a.mu.Unlock()
	go func() {
		defer close(o.done)
		defer cancel()
		select {
		case a.slots <- struct{}{}:
			defer func() { <-a.slots }()
		case <-octx.Done():
			return
		}
		prev := a.follower(k)
		a.stop(k)
		a.Log.Info("agent: taking over a partition", "db", t.DB, "partition", p, "generation", route.Generation, "from", route.From)
		err := a.takeOver(octx, t, p, route)
		if err == nil && octx.Err() == nil {
			if err := a.Node.SetRole(t.DB, p, node.Master, route.Generation, lease); err != nil {
				a.Log.Error("agent: transition", "db", t.DB, "partition", p, "err", err)
			}
			return
		}
		// Not master (a drain after a failover that a newer table ended
		// says nothing: it is best effort): keep following the old one.
		if prev != nil && ctx.Err() == nil {
			a.follow(ctx, k, prev.master, prev.url)
		}
		if err != nil && octx.Err() == nil {
			a.Log.Error("agent: transition", "db", t.DB, "partition", p, "err", err)
		}
	}()
}

// transition brings one partition to its role in t.
func (a *Agent) transition(ctx context.Context, t *topo.RoutingTable, p int) error {
	k := partKey{t.DB, p}
	route := t.Partitions[p]
	idx := slices.Index(route.Replicas, a.ID)
	switch {
	case idx == 0:
		var lease int64
		if a.Member != nil {
			lease = t.MasterIncarnation(p)
			if lease != a.Member.Incarnation() {
				// Mastership granted to another run of this node (from
				// before it restarted or rejoined): not this one's. The
				// controller chooses again, in a new generation.
				// Offline meanwhile (it also makes the replica show in
				// this node's status, so the controller counts it when it
				// chooses).
				a.stop(k)
				return a.Node.SetRole(t.DB, p, node.Offline, 0, 0)
			}
		}
		a.Node.SetSlaves(t.DB, p, liveSlaves(t, route))
		if a.Node.Role(t.DB, p) == node.Master {
			return a.Node.SetRole(t.DB, p, node.Master, route.Generation, lease)
		}
		a.startTakeOver(ctx, t, p, route, lease)
		return nil
	case idx > 0:
		master, url := t.Master(p)
		hint := node.MasterHint{ID: master, URL: url, Generation: route.Generation}
		if f := a.follower(k); f != nil && f.master == master && f.url == url {
			a.Node.SetMasterHint(t.DB, p, hint)
			return nil
		}
		a.stop(k)
		if err := a.Node.SetRole(t.DB, p, node.Slave, 0, 0); err != nil {
			return err
		}
		a.Node.SetMasterHint(t.DB, p, hint)
		a.follow(ctx, k, master, url)
		return nil
	default:
		a.stop(k)
		if a.Node.Role(t.DB, p) != node.Offline {
			return a.Node.SetRole(t.DB, p, node.Offline, 0, 0)
		}
		if slices.Contains(route.Drop, a.ID) {
			// The replicas hold all this copy holds.
			dropped, err := a.Node.Drop(ctx, t.DB, p)
			if dropped && a.Dropped != nil {
				a.Dropped()
			}
			return err
		}
		return a.Node.ShowCopy(t.DB, p)
	}
}

// takeOver brings this replica up to what it must hold before it masters
// a partition. In a planned hand-over (route.From) it drains the old
// master completely — truncating first what that master's timeline does
// not hold — or fails. After a failover it drains what the relay still
// holds of the dead master's log, best effort: the controller chose this
// replica because it holds every acknowledged commit already.
//
// Either way it must then hold at least what the controller saw it hold
// when it chose it (route.At): a replica emptied since (a rebuild begun,
// a copy dropped) does not take over.
func (a *Agent) takeOver(ctx context.Context, t *topo.RoutingTable, p int, route topo.PartitionRoute) error {
	opts := node.FollowOptions{Replica: a.ID, Truncated: a.Truncated, Alarm: a.Alarm}
	var err error
	if route.From != "" && route.From != a.ID {
		url, alive := t.Nodes[route.From]
		if !alive {
			return fmt.Errorf("partition %s/%d: the master to take over from (%s) is gone: %w", t.DB, p, route.From, node.ErrDrainIncomplete)
		}
		err = a.Node.Drain(ctx, t.DB, p, a.streams.Peer(url), a.drainLimit(), true, opts)
	} else if relay := a.relay.URL(); relay != "" {
		err = a.Node.Drain(ctx, t.DB, p, a.streams.Source(relay), a.drainLimit(), false, opts)
	}
	if err != nil {
		return err
	}
	seen := storage.SCN{Gen: route.At.Gen, Seq: route.At.Seq}
	held, err := a.Node.SCN(t.DB, p)
	if err != nil {
		return err
	}
	if held.Less(seen) {
		return fmt.Errorf("partition %s/%d: chosen as master at %s, it holds %s: %w", t.DB, p, seen, held, ErrLessThanSeen)
	}
	return nil
}

// ErrLessThanSeen is a take-over refused because the replica holds less
// than the controller saw it hold when it chose it.
var ErrLessThanSeen = errors.New("the replica holds less than when it was chosen")

func (a *Agent) drainLimit() time.Duration {
	if a.DrainLimit == 0 {
		return 5 * time.Second
	}
	return a.DrainLimit
}

func (a *Agent) follower(k partKey) *follower {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.followers[k]
}

// follow keeps partition k following master until stopped, retrying after
// errors (the master may be unreachable until the controller moves on).
func (a *Agent) follow(ctx context.Context, k partKey, master, url string) {
	fctx, cancel := context.WithCancel(ctx)
	f := &follower{master: master, url: url, task: newTask(cancel)}
	a.mu.Lock()
	a.followers[k] = f
	a.mu.Unlock()
	direct := a.streams.Peer(url)
	go func() {
		defer close(f.done)
		// Read through the relay when there is one; when it fails, from
		// the master for a while, then try the relay again.
		var directUntil time.Time
		var retry node.StreamRetry
		for fctx.Err() == nil {
			began := time.Now()
			relay := a.relay.URL()
			viaRelay := relay != "" && time.Now().After(directUntil)
			opts := node.FollowOptions{Source: direct, Replica: a.ID, Truncated: a.Truncated, Alarm: a.Alarm}
			sctx, cancel := fctx, context.CancelFunc(func() {})
			if viaRelay {
				// The relay's copy is in memory: acknowledge to the
				// master what this replica durably applied.
				opts.Source, opts.Master = a.streams.Source(relay), direct
			} else {
				// Look for a (working) relay again after a while.
				sctx, cancel = context.WithTimeout(fctx, 5*time.Second)
			}
			err := a.Node.Follow(sctx, k.db, k.id, opts)
			cancel()
			if errors.Is(err, node.ErrRebuild) {
				// Behind the master's retained log: start over from a
				// snapshot of the master.
				a.Log.Info("agent: rebuilding a replica from its master's snapshot", "db", k.db, "partition", k.id, "master", master, "why", err)
				rows, err := a.Node.Rebuild(fctx, k.db, k.id, direct)
				if err != nil {
					a.Log.Warn("agent: rebuild", "db", k.db, "partition", k.id, "master", master, "err", err)
					select {
					case <-fctx.Done():
					case <-time.After(time.Second):
					}
				} else if a.Rebuilt != nil {
					a.Rebuilt(rows)
				}
				continue
			}
			if err != nil {
				a.Log.Debug("agent: follow", "db", k.db, "partition", k.id, "master", master, "err", err)
				if viaRelay {
					reason := "failed"
					if errors.Is(err, node.ErrRelayBehind) {
						reason = "behind"
						a.Log.Info("agent: reading the master's log directly: the relay fell silent while the master moved on", "db", k.db, "partition", k.id, "master", master)
					}
					if a.LeftRelay != nil {
						a.LeftRelay(reason)
					}
					directUntil = time.Now().Add(5 * time.Second)
					continue
				}
				retry.Wait(fctx, began, false)
			}
		}
	}()
}

func (a *Agent) stop(k partKey) {
	if f := take(a, a.followers, k); f != nil {
		f.end()
	}
}

// stopAll ends every take-over, then stops every follower; only Run's
// goroutine calls it.
func (a *Agent) stopAll() {
	a.endTakeOvers()
	for _, k := range partitionsOf(a, a.followers) {
		a.stop(k)
	}
}

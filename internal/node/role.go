package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/cortado-db/cortado/internal/admission"
	"github.com/cortado-db/cortado/internal/storage"
)

// Role is a partition's state on this node, as the controller sets it.
type Role int

// Partition roles (DESIGN.md §4). DROPPED partitions are simply absent.
const (
	Offline Role = iota
	Slave
	Master
)

func (r Role) String() string {
	switch r {
	case Slave:
		return "SLAVE"
	case Master:
		return "MASTER"
	}
	return "OFFLINE"
}

// ErrNotMaster is returned for a write to a partition this node does not
// master (503: the client retries, through a fresh routing table).
var ErrNotMaster = errors.New("this node is not the partition's master")

// MasterHint is who a slave follows: the master, by node ID and internal
// API URL, of the generation it was told of.
type MasterHint struct {
	ID, URL    string
	Generation uint32
}

// NotMasterError is ErrNotMaster from a slave that knows its master: a
// router whose routing table is older than Hint.Generation (it has not
// heard from etcd) may send the request there instead. Like every
// ErrNotMaster it means nothing was done.
type NotMasterError struct {
	Hint MasterHint
	Err  error // matches ErrNotMaster; its message names the master
}

func (e *NotMasterError) Error() string { return e.Err.Error() }

func (e *NotMasterError) Unwrap() error { return e.Err }

// ErrNotEnoughReplicas is returned for a write to a semi-sync partition
// with fewer live replicas than the database's minInSync: nothing is
// written (503: retry once replicas are back).
var ErrNotEnoughReplicas = errors.New("fewer live replicas than minInSync")

// ErrNotReplicated is returned for a write the master committed but no
// slave confirmed in time under semi-sync replication: its outcome is
// uncertain (a failover now may or may not keep it), so it is not
// acknowledged (503: retry; a retried PUT is idempotent). A read returns
// it when what it would return was not held by enough replicas in time
// (awaitReplicated): nothing it would show is certain yet.
var ErrNotReplicated = errors.New("not durable on enough replicas in time")

// roles holds the role of every partition this node hosts. With allMaster
// (single-node serve) every partition is master in generation 1.
type roles struct {
	mu        sync.RWMutex // guards m, allMaster and lease
	allMaster bool
	m         map[partitionKey]*partRole
	// lease, when set, is asked before every write and before its
	// acknowledgement: a node whose lease may have lapsed (it was paused,
	// or cut off from etcd) must not write, whatever role it last knew,
	// nor acknowledge a write it began under a lease since lost.
	lease func() (id int64, valid bool)
}

// partRole is one partition's role. Writes in flight hold mu shared, a
// change of role holds it exclusively, so a demotion waits for them and
// no write starts after it; other partitions are not held up.
type partRole struct {
	mu   sync.RWMutex
	role Role
	// lease is the membership lease (incarnation) a mastership was
	// granted to, when bound: the node writes and serves as master only
	// while it holds that same lease, so a node that lost its lease and
	// rejoined under a new one never acts on a mastership of the old.
	lease int64
	bound bool
	// master is who a slave follows (SetMasterHint), for the routers'
	// sake; empty unless the role is SLAVE.
	master MasterHint

	// Semi-sync state, under ackMu: the live slaves the routing table
	// gives this master, the newest SCN each replica durably holds, the
	// newest SCN known to be on the timeline of the partition's current
	// master (after a hand-over), and a channel closed when any of it
	// changes.
	ackMu sync.Mutex
	heard time.Time // a slave's last answer from its master
	// rebuilding is set while the replica is rebuilt from a snapshot: it
	// answers no read meanwhile (it holds part of a state).
	rebuilding bool
	slaves     []string
	acks       map[string]storage.SCN
	confirmed  storage.SCN
	// opened is the marker commit this master opened its generation
	// with (storage.Partition.StartGeneration): until need slaves hold
	// it, nothing this master serves is certain to survive a failover.
	opened  storage.SCN
	ackedCh chan struct{}
	// asks holds a read's request for an acknowledgement now
	// (askConfirm), for the slave's acknowledger.
	asks chan struct{}
	// alarm is set when this replica refused to truncate acknowledged
	// commits: the consistency check reports it until the replica
	// follows its master again.
	alarm error
}

// A read on a slave waiting for what it holds to be confirmed asks again
// after askMin, then at doubling intervals up to askMax (awaitAck).
const (
	askMin = 5 * time.Millisecond
	askMax = 200 * time.Millisecond
)

// askConfirm asks the replica's acknowledger (a slave's ackPipe) to
// acknowledge again now: the master's answer says what is confirmed.
// Asks made before it gets to them are one.
func (e *partRole) askConfirm() {
	select {
	case e.asks <- struct{}{}:
	default:
	}
}

// changedLocked wakes every waiter; the caller holds ackMu.
func (e *partRole) changedLocked() {
	if e.ackedCh != nil {
		close(e.ackedCh)
		e.ackedCh = nil
	}
}

// ackChanged returns a channel closed at the next acknowledgement or
// confirmation recorded.
func (e *partRole) ackChanged() <-chan struct{} {
	e.ackMu.Lock()
	defer e.ackMu.Unlock()
	return e.ackChangedLocked()
}

// ackChangedLocked is ackChanged for a caller holding ackMu.
func (e *partRole) ackChangedLocked() <-chan struct{} {
	if e.ackedCh == nil {
		e.ackedCh = make(chan struct{})
	}
	return e.ackedCh
}

// Acknowledgements from replicas the routing table does not name as
// this master's slaves (one about to be, or a caller that is none) are
// kept for at most maxStrangerAcks of them, with IDs of at most
// maxStrangerID bytes: the Ack call is an input from outside, and
// without the bound every new name (up to a message of 64 MiB) stayed
// for the whole mastership. A slave's is always kept; one turned away
// here is taken at its next acknowledgement, a second away at most.
const (
	maxStrangerAcks = 8
	maxStrangerID   = 256
)

// ack records that replica holds every commit up to scn, durably.
func (e *partRole) ack(replica string, scn storage.SCN) (prev storage.SCN) {
	e.ackMu.Lock()
	defer e.ackMu.Unlock()
	prev, kept := e.acks[replica]
	if !prev.Less(scn) {
		return prev
	}
	if !kept && !slices.Contains(e.slaves, replica) && (len(replica) > maxStrangerID || e.strangersLocked() >= maxStrangerAcks) {
		return prev
	}
	if e.acks == nil {
		e.acks = map[string]storage.SCN{}
	}
	e.acks[replica] = scn
	e.changedLocked()
	return prev
}

// strangersLocked counts the acknowledgements kept from replicas that
// are not slaves; the caller holds ackMu.
func (e *partRole) strangersLocked() int {
	n := 0
	for id := range e.acks {
		if !slices.Contains(e.slaves, id) {
			n++
		}
	}
	return n
}

// confirm records that the partition's current master holds every commit
// of this (former master) replica up to scn: writes it made before it
// handed mastership over survived the hand-over.
func (e *partRole) confirm(scn storage.SCN) {
	e.ackMu.Lock()
	defer e.ackMu.Unlock()
	if e.confirmed.Less(scn) {
		e.confirmed = scn
		e.changedLocked()
	}
}

// quorumLocked returns the newest SCN that need of the current slaves
// hold; the caller holds ackMu.
func (e *partRole) quorumLocked(need int) storage.SCN {
	if need <= 0 {
		return storage.SCN{Gen: ^uint32(0)}
	}
	var buf [8]storage.SCN // replicas rarely number more: no allocation per answer
	held := buf[:0]
	for _, id := range e.slaves {
		held = append(held, e.acks[id])
	}
	if len(held) < need {
		return storage.SCN{}
	}
	slices.SortFunc(held, func(a, b storage.SCN) int {
		switch {
		case b.Less(a):
			return -1
		case a.Less(b):
			return 1
		}
		return 0
	})
	return held[need-1]
}

// awaitAck waits until need slaves durably hold scn (or the partition's
// new master does), for at most timeout. With ask (a read on a slave,
// which learns what is confirmed from its master's answers to its
// acknowledgements), it has the replica acknowledge again at once and
// then every askMin to askMax while it waits (askConfirm), rather than
// wait for the acknowledgement its next log answer brings: on an idle
// partition that is up to a second away.
func (e *partRole) awaitAck(ctx context.Context, scn storage.SCN, need int, timeout time.Duration, ask bool) error {
	var timer <-chan time.Time
	var again *time.Timer
	every := askMin
	for {
		e.ackMu.Lock()
		q := e.quorumLocked(need)
		if !q.Less(scn) || !e.confirmed.Less(scn) {
			e.ackMu.Unlock()
			return nil
		}
		ch := e.ackChangedLocked()
		e.ackMu.Unlock()
		if timer == nil {
			t := time.NewTimer(timeout)
			defer t.Stop()
			timer = t.C
			// The wait is on other processes: this node's slot goes to
			// other work meanwhile (admission.Park).
			admission.Park(ctx)
		}
		var askAgain <-chan time.Time
		if ask {
			e.askConfirm()
			if again == nil {
				again = time.NewTimer(every)
				defer again.Stop()
			} else {
				again.Reset(every)
			}
			askAgain = again.C
		}
		select {
		case <-ch:
		case <-askAgain:
			every = min(2*every, askMax)
		case <-timer:
			return fmt.Errorf("commit %s: %d replica(s) did not confirm it within %v: %w", scn, need, timeout, ErrNotReplicated)
		case <-ctx.Done():
			return fmt.Errorf("commit %s: %w: %w", scn, ErrNotReplicated, ctx.Err())
		}
	}
}

// quorum returns the newest SCN that need of the current slaves hold, at
// most head (the master's own newest commit, which is what it returns
// when need is 0), and whether this master is established: need slaves
// hold the marker commit it opened its generation with. From then on its
// timeline is the partition's for good (a failover can only choose a
// replica holding it), and what it confirms to a former master cannot be
// undone.
func (e *partRole) quorum(need int, head storage.SCN) (acked storage.SCN, established bool) {
	e.ackMu.Lock()
	defer e.ackMu.Unlock()
	q := e.quorumLocked(need)
	established = !q.Less(e.opened)
	if head.Less(q) {
		q = head
	}
	return q, established
}

// SetSlaves tells a master which live slaves its partition has (by node
// ID): under semi-sync replication a write is acknowledged once
// minInSync-1 of them durably hold it, and refused while fewer than that
// are live.
func (n *Node) SetSlaves(db string, id int, slaves []string) {
	e := n.roles.entry(db, id)
	e.ackMu.Lock()
	e.slaves = slices.Clone(slaves)
	e.changedLocked() // waiters look again
	e.ackMu.Unlock()
}

// liveSlaves returns how many live slaves the partition has.
func (e *partRole) liveSlaves() int {
	e.ackMu.Lock()
	defer e.ackMu.Unlock()
	return len(e.slaves)
}

type partitionKey struct {
	db string
	id int
}

// lookup returns a partition's entry, nil if it has none yet, and whether
// the node masters every partition.
func (r *roles) lookup(db string, id int) (e *partRole, allMaster bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.m[partitionKey{db, id}], r.allMaster
}

// entry returns a partition's entry, making it on first use.
func (r *roles) entry(db string, id int) *partRole {
	if e, _ := r.lookup(db, id); e != nil {
		return e
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	k := partitionKey{db, id}
	e, ok := r.m[k]
	if !ok {
		e = &partRole{role: Offline, asks: make(chan struct{}, 1)}
		if r.allMaster {
			e.role = Master
		}
		r.m[k] = e
	}
	return e
}

// mastersAll reports whether this node masters every partition.
func (r *roles) mastersAll() bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.allMaster
}

func (r *roles) keys() (ks []partitionKey, allMaster bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for k := range r.m {
		ks = append(ks, k)
	}
	return ks, r.allMaster
}

// SetRole makes this node's replica of a partition OFFLINE, SLAVE or
// MASTER. Becoming master takes the generation the controller assigned:
// it must be later than any the partition has seen, and the partition's
// next commit is (generation, 1); the mastership is bound to lease, the
// incarnation it was granted to (0 on a node without a membership). A
// master demoted to slave or offline stops accepting writes at once
// (fencing).
func (n *Node) SetRole(db string, id int, role Role, generation uint32, lease int64) error {
	p, err := n.partition(db, id)
	if err != nil {
		return err
	}
	e := n.roles.entry(db, id)
	e.mu.Lock()
	defer e.mu.Unlock()
	if role == Master {
		if seen := p.Generation(); generation > seen {
			if err := p.StartGeneration(generation); err != nil {
				return err
			}
		} else if generation < seen || e.role != Master {
			return fmt.Errorf("partition %s/%d: master of generation %d, but the partition has seen generation %d", db, id, generation, seen)
		}
		if e.role != Master || !e.bound || e.lease != lease {
			// A new mastership: acknowledgements counted in an earlier
			// one say nothing about this one's commits.
			e.ackMu.Lock()
			e.acks, e.confirmed, e.opened = nil, storage.SCN{}, storage.SCN{}
			if p.SCN().Gen == generation {
				e.opened = storage.SCN{Gen: generation, Seq: 1}
			}
			e.ackMu.Unlock()
		}
		e.lease, e.bound = lease, true
	}
	if role != Slave {
		e.master = MasterHint{}
	}
	if e.role == Slave && role != Slave {
		// It no longer follows a master: whatever it holds next (its
		// own commits as a master, which may never be acknowledged, or
		// nothing new) is no copy of a master's timeline until it
		// follows one again and catches up.
		e.forgetMaster()
	}
	if e.role != role {
		n.log.Info("partition role", "db", db, "partition", id, "from", e.role, "to", role, "generation", p.Generation(), "scn", p.SCN())
	}
	e.role = role
	return nil
}

// SetMasterHint records who this node, a slave of the partition, follows:
// a request that needs the master is refused with a NotMasterError that
// names it.
func (n *Node) SetMasterHint(db string, id int, hint MasterHint) {
	e := n.roles.entry(db, id)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.role == Slave {
		e.master = hint
	}
}

// notMaster is ErrNotMaster for partition db/id, naming the master when
// this node is its slave and knows it. The caller holds e.mu (shared).
func notMaster(db string, id int, e *partRole) error {
	if e != nil && e.role == Slave && e.master.URL != "" {
		h := e.master
		return &NotMasterError{Hint: h, Err: fmt.Errorf("partition %s/%d: %w (its master is %s, generation %d)", db, id, ErrNotMaster, h.ID, h.Generation)}
	}
	return fmt.Errorf("partition %s/%d: %w", db, id, ErrNotMaster)
}

// Role returns this node's role for a partition.
func (n *Node) Role(db string, id int) Role {
	e, all := n.roles.lookup(db, id)
	if e == nil {
		if all {
			return Master
		}
		return Offline
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.role
}

// Confirmed is the newest SCN of partition db/id that its current master
// has confirmed holding (Follow asks after every answer): once a former
// master's replica is confirmed up to what it held when it stepped down,
// its hand-over is complete and the writes it took survived it.
func (n *Node) Confirmed(db string, id int) storage.SCN {
	e := n.roles.entry(db, id)
	e.ackMu.Lock()
	defer e.ackMu.Unlock()
	return e.confirmed
}

// FenceAll makes every partition this node masters OFFLINE, at once: a
// node that lost its lease no longer knows it is master, and must not
// accept writes a new master's timeline will not contain.
func (n *Node) FenceAll() {
	n.roles.mu.Lock()
	n.roles.allMaster = false
	entries := make([]*partRole, 0, len(n.roles.m))
	for _, e := range n.roles.m {
		entries = append(entries, e)
	}
	n.roles.mu.Unlock()
	for _, e := range entries {
		e.mu.Lock()
		if e.role == Master {
			e.role = Offline
		}
		e.mu.Unlock()
	}
}

// RequireLease makes every write first ask valid whether this node's
// cluster membership lease is still certainly held; when it is not, the
// write fails as to a non-master (fencing a paused or cut-off master
// before it has even heard that its lease lapsed).
func (n *Node) RequireLease(lease func() (id int64, valid bool)) {
	n.roles.mu.Lock()
	n.roles.lease = lease
	n.roles.mu.Unlock()
}

// beginWrite holds a partition's role shared for a write, if this node
// masters it, and returns the lease it writes under; the caller releases
// the role (e.mu.RUnlock) when done.
func (n *Node) beginWrite(db string, id int) (*partRole, int64, error) {
	e := n.roles.entry(db, id)
	e.mu.RLock()
	lease, ok := n.roles.masterLeaseLocked(e)
	if !ok {
		err := notMaster(db, id, e)
		e.mu.RUnlock()
		return nil, 0, err
	}
	return e, lease, nil
}

// masterLeaseLocked returns the lease e's mastership is in force under:
// e is MASTER, the node's lease is certainly held, and it is the lease
// the mastership was granted to. The caller holds e.mu.
func (r *roles) masterLeaseLocked(e *partRole) (int64, bool) {
	if e.role != Master {
		return 0, false
	}
	lease, held := r.currentLease()
	if !held || e.bound && lease != e.lease {
		return 0, false
	}
	return lease, true
}

// masterLease is masterLeaseLocked for a partition: on a node that
// masters every partition, any held lease will do.
func (r *roles) masterLease(db string, id int) (int64, bool) {
	e, all := r.lookup(db, id)
	if e == nil {
		if !all {
			return 0, false
		}
		return r.currentLease()
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	return r.masterLeaseLocked(e)
}

// currentLease returns this node's membership lease and whether it is
// certainly still held (always, lease 0, without a membership).
func (r *roles) currentLease() (int64, bool) {
	r.mu.RLock()
	lease := r.lease
	r.mu.RUnlock()
	if lease == nil {
		return 0, true
	}
	return lease()
}

// stillHeld reports whether lease is this node's lease and certainly still
// held: no other replica can have been made master since it was.
func (r *roles) stillHeld(lease int64) bool {
	now, held := r.currentLease()
	return held && now == lease
}

// authoritative reports whether this node's replica of a partition is the
// partition's timeline: it masters it (drained, in force) and certainly
// still holds its lease. Only such a replica serves fresh reads, and only
// its log may tell a follower that the follower's timeline diverged.
func (n *Node) authoritative(db string, id int) bool {
	_, ok := n.roles.masterLease(db, id)
	return ok
}

// MarshalText renders the role's name.
func (r Role) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText parses a role's name.
func (r *Role) UnmarshalText(b []byte) error {
	switch string(b) {
	case "OFFLINE":
		*r = Offline
	case "SLAVE":
		*r = Slave
	case "MASTER":
		*r = Master
	default:
		return fmt.Errorf("unknown partition role %q", b)
	}
	return nil
}

// heardFromMaster records that a slave holds what its master had at
// asOf (never moving the time back).
func (e *partRole) heardFromMaster(asOf time.Time) {
	e.ackMu.Lock()
	if !e.rebuilding && asOf.After(e.heard) {
		e.heard = asOf
	}
	e.ackMu.Unlock()
}

// forgetMaster records that a replica no longer holds a copy of its
// master's timeline: it answers no max-stale read until it has caught up
// with a master again.
func (e *partRole) forgetMaster() {
	e.ackMu.Lock()
	e.heard = time.Time{}
	e.ackMu.Unlock()
}

// setRebuilding marks the replica as being rebuilt (reads refused) or
// done.
func (e *partRole) setRebuilding(on bool) {
	e.ackMu.Lock()
	e.rebuilding = on
	e.heard = time.Time{}
	e.ackMu.Unlock()
}

// readable decides whether this replica may answer a read: a master in
// force answers fresh reads (staleness 0); a slave answers only a read
// that tolerates maxStale and only if it heard from its master within
// that. Anything else is ErrNotMaster (no fresh copy here: the router
// retries elsewhere) or ErrTooStale.
//
// A fresh read returns the lease it is served under: the read is
// answered only if that lease is still held when it is done (inForce),
// since a master paused in the middle of a read may have been replaced
// meanwhile, and its answer be older than what its successor
// acknowledged.
func (n *Node) readable(db string, id int, maxStale time.Duration) (stale time.Duration, lease int64, err error) {
	if lease, ok := n.roles.masterLease(db, id); ok {
		return 0, lease, nil
	}
	e, _ := n.roles.lookup(db, id)
	stale, err = n.staleReadable(db, id, e, maxStale)
	return stale, staleRead, err
}

// staleRead is the lease readable returns for a slave's read: it is not
// served under the master's lease.
const staleRead = -1

// inForce fails a fresh read whose lease may have lapsed while it was
// served.
func (n *Node) inForce(db string, id int, lease int64) error {
	if lease == staleRead || n.roles.stillHeld(lease) {
		return nil
	}
	return fmt.Errorf("partition %s/%d: the membership lease this read was served under may have lapsed: %w", db, id, ErrNotMaster)
}

// staleReadable is readable for a replica that is not the master in
// force.
func (n *Node) staleReadable(db string, id int, e *partRole, maxStale time.Duration) (time.Duration, error) {
	if maxStale <= 0 {
		if e != nil {
			e.mu.RLock()
			defer e.mu.RUnlock()
		}
		return 0, notMaster(db, id, e)
	}
	if e == nil {
		return 0, fmt.Errorf("partition %s/%d: not hosted here: %w", db, id, ErrTooStale)
	}
	e.mu.RLock()
	role := e.role
	e.mu.RUnlock()
	e.ackMu.Lock()
	heard := e.heard
	e.ackMu.Unlock()
	if role != Slave || heard.IsZero() {
		return 0, fmt.Errorf("partition %s/%d: a %s replica that has not heard from a master: %w", db, id, role, ErrTooStale)
	}
	if stale := time.Since(heard); stale <= maxStale {
		return stale, nil
	}
	stale := time.Since(heard)
	return 0, fmt.Errorf("partition %s/%d: last heard from the master %v ago, max-stale %v: %w", db, id, stale.Round(time.Millisecond), maxStale, ErrTooStale)
}

// ShowCopy makes a copy this node holds of a partition it is no replica
// of (a copy left behind when the partition's replicas moved, or kept
// over a restart) show in its status as OFFLINE, so that the controller
// sees it and can have it dropped once the replicas hold all of it
// (topo.PartitionRoute.Drop). A partition the node holds nothing of, or
// already has a role for, is left as it is.
func (n *Node) ShowCopy(db string, id int) error {
	if e, _ := n.roles.lookup(db, id); e != nil {
		return nil
	}
	held, err := n.eng.Holds(db, id)
	if err != nil || !held {
		return err
	}
	n.roles.entry(db, id)
	return nil
}

// Drop deletes this node's copy of a partition, which must be OFFLINE
// here: the controller found that the partition's replicas hold all of
// it. The partition no longer shows in the node's status. Then it has the
// engine reclaim the space; a failed compaction is no failed drop (the
// deletion is durable, and later compactions reclaim the space). It
// reports whether there was a copy to delete.
func (n *Node) Drop(ctx context.Context, db string, id int) (bool, error) {
	if e, _ := n.roles.lookup(db, id); e == nil {
		// Dropped already (a later table that still names this node),
		// or never held.
		if held, err := n.eng.Holds(db, id); err != nil || !held {
			return false, err
		}
	}
	scn, compact, err := n.drop(db, id)
	if err != nil {
		return false, err
	}
	start := time.Now()
	if err := compact(ctx); err != nil && ctx.Err() == nil {
		n.log.Warn("compact a dropped partition copy's range", "db", db, "partition", id, "err", err)
	}
	n.log.Info("partition copy dropped: its replicas hold all of it", "db", db, "partition", id, "scn", scn, "compacted in", time.Since(start).Round(time.Millisecond))
	return true, nil
}

// drop deletes the copy under the role entry's lock, and the entry.
func (n *Node) drop(db string, id int) (scn storage.SCN, compact func(context.Context) error, err error) {
	e := n.roles.entry(db, id)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.role != Offline {
		return storage.SCN{}, nil, fmt.Errorf("partition %s/%d: not dropped: it is %s here", db, id, e.role)
	}
	e.ackMu.Lock()
	alarm := e.alarm
	e.ackMu.Unlock()
	if alarm != nil {
		// It refused to undo commits that were acknowledged: it may hold
		// the only copy of a write the master lost. It stays for the
		// operator.
		return storage.SCN{}, nil, fmt.Errorf("partition %s/%d: not dropped: it holds acknowledged commits its master's timeline lacks (%w)", db, id, alarm)
	}
	p, err := n.partition(db, id)
	if err != nil {
		return storage.SCN{}, nil, err
	}
	scn = p.SCN()
	if compact, err = n.eng.Drop(db, id); err != nil {
		return storage.SCN{}, nil, err
	}
	n.roles.mu.Lock()
	if n.roles.m[partitionKey{db, id}] == e {
		delete(n.roles.m, partitionKey{db, id})
	}
	n.roles.mu.Unlock()
	return scn, compact, nil
}

package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

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

// ErrNotReplicated is returned for a write the master committed but no
// slave confirmed in time under semi-sync replication: its outcome is
// uncertain (a failover now may or may not keep it), so it is not
// acknowledged (503: retry; a retried PUT is idempotent).
var ErrNotReplicated = errors.New("write committed on the master but not confirmed by a replica")

// roles holds the role of every partition this node hosts. With allMaster
// (single-node serve) every partition is master in generation 1.
type roles struct {
	mu        sync.RWMutex // guards m, allMaster and leaseValid
	allMaster bool
	m         map[partitionKey]*partRole
	// leaseValid, when set, is asked before every write: a node whose
	// lease may have lapsed (it was paused, or cut off from etcd) must
	// not write, whatever role it last knew.
	leaseValid func() bool
}

// partRole is one partition's role. Writes in flight hold mu shared, a
// change of role holds it exclusively, so a demotion waits for them and
// no write starts after it; other partitions are not held up.
type partRole struct {
	mu   sync.RWMutex
	role Role

	// Semi-sync state, under ackMu: how many live slaves the routing
	// table gives this master, the newest SCN a slave is known to hold,
	// and a channel closed when that advances.
	ackMu   sync.Mutex
	heard   time.Time // a slave's last answer from its master
	slaves  int
	acked   storage.SCN
	ackedCh chan struct{}
}

// ack records that a replica holds every commit up to scn.
func (e *partRole) ack(scn storage.SCN) {
	e.ackMu.Lock()
	defer e.ackMu.Unlock()
	if e.acked.Less(scn) {
		e.acked = scn
		if e.ackedCh != nil {
			close(e.ackedCh)
			e.ackedCh = nil
		}
	}
}

// awaitAck waits until a slave holds scn, if the partition has slaves.
func (e *partRole) awaitAck(ctx context.Context, scn storage.SCN, timeout time.Duration) error {
	var timer <-chan time.Time
	for {
		e.ackMu.Lock()
		if e.slaves == 0 || !e.acked.Less(scn) {
			e.ackMu.Unlock()
			return nil
		}
		if e.ackedCh == nil {
			e.ackedCh = make(chan struct{})
		}
		ch := e.ackedCh
		e.ackMu.Unlock()
		if timer == nil {
			timer = time.After(timeout)
		}
		select {
		case <-ch:
		case <-timer:
			return fmt.Errorf("commit %s: no slave confirmed it within %v: %w", scn, timeout, ErrNotReplicated)
		case <-ctx.Done():
			return fmt.Errorf("commit %s: %w: %w", scn, ErrNotReplicated, ctx.Err())
		}
	}
}

// SetSlaves tells a master how many live slaves its partition has: with
// semi-sync replication a write is acknowledged once one of them holds it;
// with none, at once.
func (n *Node) SetSlaves(db string, id int, slaves int) {
	e := n.roles.entry(db, id)
	e.ackMu.Lock()
	e.slaves = slaves
	if e.ackedCh != nil {
		close(e.ackedCh) // waiters look again
		e.ackedCh = nil
	}
	e.ackMu.Unlock()
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
		e = &partRole{role: Offline}
		if r.allMaster {
			e.role = Master
		}
		r.m[k] = e
	}
	return e
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
// next commit is (generation, 1). A master demoted to slave or offline
// stops accepting writes at once (fencing).
func (n *Node) SetRole(db string, id int, role Role, generation uint32) error {
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
	}
	e.role = role
	return nil
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
func (n *Node) RequireLease(valid func() bool) {
	n.roles.mu.Lock()
	n.roles.leaseValid = valid
	n.roles.mu.Unlock()
}

// beginWrite holds a partition's role shared for a write, if this node
// masters it; the caller releases it (e.mu.RUnlock) when done.
func (n *Node) beginWrite(db string, id int) (*partRole, error) {
	n.roles.mu.RLock()
	valid := n.roles.leaseValid
	n.roles.mu.RUnlock()
	e := n.roles.entry(db, id)
	e.mu.RLock()
	if e.role != Master || valid != nil && !valid() {
		e.mu.RUnlock()
		return nil, fmt.Errorf("partition %s/%d: %w", db, id, ErrNotMaster)
	}
	return e, nil
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

// heardFromMaster records that a slave's master just answered.
func (e *partRole) heardFromMaster() {
	e.ackMu.Lock()
	e.heard = time.Now()
	e.ackMu.Unlock()
}

// staleness is, for a slave, the time since it last heard from its
// master; for a master, zero. ok is false for a replica that is neither.
func (n *Node) staleness(db string, id int) (d time.Duration, ok bool) {
	e, all := n.roles.lookup(db, id)
	if e == nil {
		return 0, all
	}
	e.mu.RLock()
	role := e.role
	e.mu.RUnlock()
	switch role {
	case Master:
		return 0, true
	case Slave:
		e.ackMu.Lock()
		defer e.ackMu.Unlock()
		if e.heard.IsZero() {
			return 0, false
		}
		return time.Since(e.heard), true
	}
	return 0, false
}

package node

import (
	"errors"
	"fmt"
	"sync"
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

// roles holds the role of every partition this node hosts. With allMaster
// (single-node serve) every partition is master in generation 1.
type roles struct {
	mu        sync.RWMutex
	allMaster bool
	m         map[partitionKey]Role
}

type partitionKey struct {
	db string
	id int
}

func (r *roles) get(db string, id int) Role {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.lookup(db, id)
}

// lookup reads a role; the caller holds mu.
func (r *roles) lookup(db string, id int) Role {
	if role, ok := r.m[partitionKey{db, id}]; ok {
		return role
	}
	if r.allMaster {
		return Master
	}
	return Offline
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
	n.roles.mu.Lock()
	defer n.roles.mu.Unlock()
	if role == Master {
		if seen := p.Generation(); generation > seen {
			if err := p.StartGeneration(generation); err != nil {
				return err
			}
		} else if generation < seen || n.roles.lookup(db, id) != Master {
			return fmt.Errorf("partition %s/%d: master of generation %d, but the partition has seen generation %d", db, id, generation, seen)
		}
	}
	n.roles.m[partitionKey{db, id}] = role
	return nil
}

func (n *Node) roleLocked(db string, id int) Role { return n.roles.lookup(db, id) }

// Role returns this node's role for a partition.
func (n *Node) Role(db string, id int) Role { return n.roles.get(db, id) }

// FenceAll makes every partition this node masters OFFLINE, at once: a
// node that lost its lease no longer knows it is master, and must not
// accept writes a new master's timeline will not contain.
func (n *Node) FenceAll() {
	n.roles.mu.Lock()
	defer n.roles.mu.Unlock()
	for k, r := range n.roles.m {
		if r == Master {
			n.roles.m[k] = Offline
		}
	}
	n.roles.allMaster = false
}

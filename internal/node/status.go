package node

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/cortado-db/cortado/internal/storage"
)

// PartitionStatus is one partition replica as its node sees it.
type PartitionStatus struct {
	DB        string      `json:"db"`
	Partition int         `json:"partition"`
	Role      Role        `json:"role"`
	SCN       storage.SCN `json:"scn"`
	// Generation is the generation in force: the one this replica
	// writes in as master, or the newest it has applied as slave.
	Generation uint32 `json:"generation"`
	// LogStart is the SCN the retained commit log starts after, LogBytes
	// about what it takes.
	LogStart storage.SCN `json:"logStart"`
	LogBytes int64       `json:"logBytes"`
	// IndexBuilding is, per table, how many documents the indexes of its
	// latest schema version still lack here (an index being built).
	IndexBuilding map[string]uint64 `json:"indexBuilding,omitempty"`
	// InSync is the database's minInSync as this node's registry holds
	// it, read before SCN: a master counts the acknowledgements of every
	// write it commits after SCN by InSync or more (0 from a node of
	// protocol 7 or older).
	InSync int `json:"inSync,omitempty"`
}

// StatusRequest asks for a node's partitions, of one database or all.
type StatusRequest struct {
	DB string `json:"db,omitempty"`
}

// Status lists the partitions this node hosts (every partition of every
// database on a single node that masters all), in (db, partition) order.
func (n *Node) Status(_ context.Context, req StatusRequest) ([]PartitionStatus, error) {
	ids := n.hosted()
	if req.DB != "" {
		ids = slices.DeleteFunc(ids, func(k partitionKey) bool { return k.db != req.DB })
	}
	slices.SortFunc(ids, func(a, b partitionKey) int {
		if c := strings.Compare(a.db, b.db); c != 0 {
			return c
		}
		return a.id - b.id
	})
	out := make([]PartitionStatus, 0, len(ids))
	for _, k := range ids {
		p, err := n.partition(k.db, k.id)
		if err != nil {
			continue // a database dropped meanwhile
		}
		inSync := 0
		if d, err := n.reg.Database(k.db); err == nil {
			inSync = n.inSync(d) // before the SCN (Node.Write takes it after its commit)
		}
		out = append(out, PartitionStatus{DB: k.db, Partition: k.id, Role: n.Role(k.db, k.id), InSync: inSync, SCN: p.SCN(), Generation: p.Generation(), LogStart: p.LogStart(), LogBytes: p.LogBytes(),
			IndexBuilding: n.indexBuildLeft(k.db, p)})
	}
	return out, nil
}

// ChecksumRequest asks for a partition's checksum: with At zero, now (the
// reference, on the master); otherwise exactly at SCN At, waiting up to
// Wait for the replica to get there.
type ChecksumRequest struct {
	DB        string        `json:"db"`
	Partition int           `json:"partition"`
	At        storage.SCN   `json:"at"`
	Wait      time.Duration `json:"wait"`
}

// ChecksumResult is a partition's checksum and the SCN it was taken at,
// with the checksum of each table's key range.
type ChecksumResult struct {
	SCN    storage.SCN       `json:"scn"`
	Sum    uint64            `json:"sum"`
	Tables map[string]uint64 `json:"tables,omitempty"`
}

// Checksum checksums a partition's rows (see storage.Partition.Sums);
// with req.At set it fails with storage.ErrPassed when this replica is
// already past At.
func (n *Node) Checksum(ctx context.Context, req ChecksumRequest) (*ChecksumResult, error) {
	p, err := n.partition(req.DB, req.Partition)
	if err != nil {
		return nil, err
	}
	if e, _ := n.roles.lookup(req.DB, req.Partition); e != nil {
		e.ackMu.Lock()
		alarm := e.alarm
		e.ackMu.Unlock()
		if alarm != nil {
			return nil, alarm
		}
	}
	var s storage.Sums
	if req.At.IsZero() {
		s, err = p.Sums()
	} else {
		ctx, cancel := context.WithTimeout(ctx, min(req.Wait, 30*time.Second))
		defer cancel()
		s, err = p.ChecksumAt(req.At, ctx.Done())
	}
	if err != nil {
		return nil, err
	}
	return &ChecksumResult{SCN: s.SCN, Sum: s.Total, Tables: s.Tables}, nil
}

// SCN returns the last SCN this node holds of a partition.
func (n *Node) SCN(db string, id int) (storage.SCN, error) {
	p, err := n.partition(db, id)
	if err != nil {
		return storage.SCN{}, err
	}
	return p.SCN(), nil
}

// hosted lists the partitions this node hosts: those it has a role for,
// and every partition of every database on a node that masters all.
func (n *Node) hosted() []partitionKey {
	ids, all := n.roles.keys()
	if all {
		has := make(map[partitionKey]bool, len(ids))
		for _, k := range ids {
			has[k] = true
		}
		for _, d := range n.reg.Databases() {
			for p := range d.Partitions {
				if k := (partitionKey{d.Name, p}); !has[k] {
					ids = append(ids, k)
				}
			}
		}
	}
	return ids
}

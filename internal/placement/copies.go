package placement

import (
	"slices"

	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/storage"
)

// CopiesInput is what the controller knows of one partition when it
// decides which copies of it may be deleted: copies held by nodes that
// are no replica of it, left behind when its replicas moved (a node
// joined, or one left and came back).
type CopiesInput struct {
	// Published is the replica list of the published table (master
	// first), Told its list of nodes told to delete their copies.
	Published, Told []string
	// Replicas is the replica list of the table about to be published
	// (DecideMaster's), and SameGeneration whether its master keeps the
	// published generation.
	Replicas       []string
	SameGeneration bool
	// Want is how many replicas the database asks for.
	Want int
	// Live reports whether a node is registered (and not failed by
	// router reports); Answered whether it answered this round's status
	// request.
	Live, Answered func(id string) bool
	// Status is a node's own report of the partition, if it answered and
	// holds it.
	Status func(id string) (node.PartitionStatus, bool)
	// Holders are the nodes that reported the partition.
	Holders []string
}

// DecideCopies returns the replica list to publish and the nodes to tell
// to delete their copies (the route's Drop list, sorted).
//
// A copy goes when it holds nothing a failover could need (redundant).
// Once a node is told, until it answers without the partition, its
// report may be of the copy it has not yet deleted (its agent applies
// tables in order, and may lag): it stays told, and is kept out of the
// replica list meanwhile, so that no choice of master and no hand-over
// ever rests on that report. (A node that is gone applies only the newest
// table when it returns, and then reports what it holds.)
func DecideCopies(in CopiesInput) (replicas, drop []string) {
	var held []string
	for _, id := range in.Told {
		if slices.Contains(in.Published, id) || !in.Live(id) {
			continue
		}
		if _, holds := in.Status(id); holds || !in.Answered(id) {
			held = append(held, id)
		}
	}
	replicas = slices.Clone(in.Replicas)
	if len(replicas) > 0 {
		// Never the master: it is chosen among the published replicas.
		replicas = append(replicas[:1], slices.DeleteFunc(replicas[1:], func(id string) bool { return slices.Contains(held, id) })...)
	}
	replicas = append(replicas, leaving(in, replicas)...)
	drop = held
	if in.SameGeneration && slices.Equal(replicas, in.Published) {
		for _, id := range redundant(replicas, in.Want, in.Live, in.Status, in.Holders) {
			if !slices.Contains(drop, id) {
				drop = append(drop, id)
			}
		}
	}
	slices.Sort(drop)
	return replicas, drop
}

// leaving returns the published replicas that replicas leaves out but
// that stay in it, last, for now: while any slave of replicas has not
// caught up with its master (a node joining is rebuilt from a snapshot,
// then reads the log), a replica leaving the set stays a slave, so that
// writes keep as many live slaves to be acknowledged by as before and
// need not wait for the newcomer (with minInSync as large as replicas,
// they would wait for it) — make before break. Only a live replica that
// reports itself a slave of the partition stays; one told to delete its
// copy does not. Once every slave has caught up, the leaving ones go
// (their copies stay until redundant).
func leaving(in CopiesInput, replicas []string) []string {
	if len(replicas) == 0 || len(in.Published) == 0 {
		return nil
	}
	ms, ok := in.Status(replicas[0])
	behind := !ok || ms.SCN.IsZero()
	for _, id := range replicas[1:] {
		if s, ok := in.Status(id); !ok || s.Role != node.Slave || s.SCN.IsZero() || !caughtUp(s.SCN, ms.SCN) {
			behind = true
		}
	}
	if !behind {
		return nil
	}
	var out []string
	for _, id := range in.Published {
		if slices.Contains(replicas, id) || slices.Contains(in.Told, id) || !in.Live(id) {
			continue
		}
		if s, ok := in.Status(id); ok && s.Role == node.Slave && !s.SCN.IsZero() {
			out = append(out, id)
		}
	}
	return out
}

// redundant returns the holders whose copies may be deleted: those that
// are no replica and OFFLINE, when the partition has as many replicas as
// wanted, all live, its master mastering and its slaves following, and
// each holds at least the copy's SCN. A replica at or past an SCN holds
// every acknowledged commit up to it (a copy's commits it lacks were
// never acknowledged: the timeline moved past them), so a copy is deleted
// only when it adds nothing a failover could need, and the partition
// still has all the copies it is meant to have. A replica being rebuilt
// reports no SCN until it holds the snapshot: no copy goes meanwhile.
func redundant(replicas []string, want int, live func(string) bool, status func(string) (node.PartitionStatus, bool), holders []string) []string {
	if want < 1 || len(replicas) < want {
		return nil
	}
	var floor storage.SCN
	for i, id := range replicas {
		st, ok := status(id)
		role := node.Slave
		if i == 0 {
			role = node.Master
		}
		if !live(id) || !ok || st.Role != role || st.SCN.IsZero() {
			return nil
		}
		if i == 0 || st.SCN.Less(floor) {
			floor = st.SCN
		}
	}
	var out []string
	for _, id := range holders {
		if slices.Contains(replicas, id) {
			continue
		}
		if st, ok := status(id); ok && st.Role == node.Offline && !floor.Less(st.SCN) {
			out = append(out, id)
		}
	}
	return out
}

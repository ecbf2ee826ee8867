package placement

import (
	"slices"

	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/storage"
)

// HandBackLag is how many commits a replica may still lack of its
// master's for mastership to be handed to it: the new master drains the
// rest while the partition briefly takes no writes.
const HandBackLag = 256

// MasterInput is what the controller knows of one partition when it
// decides who masters it next.
type MasterInput struct {
	// Current is the published replica list (master first); Target the
	// ideal one.
	Current, Target []string
	// Live reports whether a node is registered (and not failed by
	// router reports).
	Live func(id string) bool
	// Status is a replica's own report of the partition (role, SCN),
	// if it answered.
	Status func(id string) (node.PartitionStatus, bool)
	// MinInSync is how many replicas hold every acknowledged commit.
	MinInSync int
	// Stuck says the current master has not been MASTER for longer than
	// a hand-over takes (its drain failed): choose again.
	Stuck bool
	// From is the master the current one was to take over from (a
	// planned hand-over), if any.
	From string
	// Rejoined says the current master is live but under another
	// incarnation than the one its mastership was granted to: it
	// restarted, or rejoined after its lease lapsed, and its mastership
	// ended with the old one (whatever it was doing, a take-over or
	// writes, stopped there).
	Rejoined bool
}

// MasterDecision is the partition's next replica list, whether its
// master changes by a planned hand-over (From, the live master it takes
// over from) and whether the master needs a new generation although the
// node stays the same (a failover that re-chose it, or a master that
// rejoined). Without Bump and with the same master, nothing changes: the
// mastership stays granted to the incarnation it was.
type MasterDecision struct {
	Replicas []string
	From     string
	Bump     bool
}

// DecideMaster chooses a partition's master so that no acknowledged
// commit can be lost:
//
//   - A live master keeps mastership until the replica it would go to has
//     caught up on its timeline (same generation, at most HandBackLag
//     commits behind, never ahead: a rejoining replica first truncates
//     what it wrote but never had acknowledged). The hand-over names the
//     old master (From), which the new one must drain completely.
//   - A master that restarted or rejoined under a new lease is treated
//     as gone (it may have died in the middle of a take-over) but may be
//     chosen again, in a new generation; during a planned hand-over from
//     a live master it drains that master again.
//   - A master that is gone (or stuck) is replaced by the replica furthest
//     along the timeline among those that answered — but only if enough
//     answered that every set of MinInSync replicas, the ones that held an
//     acknowledged commit, includes one of them. Otherwise the partition
//     waits, without a master, for replicas to come back.
func DecideMaster(in MasterInput) MasterDecision {
	cur, tgt := in.Current, in.Target
	if len(cur) == 0 || len(tgt) == 0 {
		return MasterDecision{Replicas: tgt}
	}
	m := cur[0]
	if in.Stuck && in.Live(m) {
		// The master did not take over in time — but it may yet, or just
		// have: whoever is chosen now drains it (From) and so waits until
		// it has stepped down, never writing beside it.
		if in.From != "" && in.From != m && in.Live(in.From) {
			// A hand-over that did not complete while the old master
			// lives: it may still be MASTER and writing, so no one else
			// may be chosen. Give it back, or wait until it answers.
			if _, ok := in.Status(in.From); ok {
				return MasterDecision{Replicas: first(in.From, tgt), From: m}
			}
			return MasterDecision{Replicas: cur}
		}
		d := failover(in)
		if d.Replicas[0] != m {
			d.From = m
		}
		return d
	}
	if in.Rejoined && in.Live(m) {
		if in.From != "" && in.From != m && in.Live(in.From) {
			// A hand-over from a live master may not have completed:
			// that master may hold acknowledged commits this one lacks
			// (or still be MASTER). The rejoined node takes over again,
			// draining it.
			return MasterDecision{Replicas: cur, From: in.From, Bump: true}
		}
		// Choose as after a failure: the rejoined node is re-chosen only
		// if it is furthest along among enough replicas.
		return failover(in)
	}
	if !in.Live(m) || in.Stuck {
		return failover(in)
	}
	if tgt[0] == m {
		return MasterDecision{Replicas: tgt}
	}
	ms, ok := in.Status(m)
	if s, answered := in.Status(tgt[0]); ok && answered && slices.Contains(cur, tgt[0]) && canTakeOver(s, ms) {
		return MasterDecision{Replicas: tgt, From: m}
	}
	if !slices.Contains(tgt, m) && ok {
		// The master leaves the replica set: hand to the caught-up
		// replica of the target furthest along, if any.
		best := ""
		var bestSCN storage.SCN
		for _, id := range tgt {
			s, answered := in.Status(id)
			if id == m || !slices.Contains(cur, id) || !answered || !canTakeOver(s, ms) {
				continue
			}
			if best == "" || bestSCN.Less(s.SCN) {
				best, bestSCN = id, s.SCN
			}
		}
		if best != "" {
			return MasterDecision{Replicas: first(best, tgt), From: m}
		}
	}
	return MasterDecision{Replicas: first(m, tgt)}
}

// failover chooses a new master for a partition whose master is gone.
func failover(in MasterInput) MasterDecision {
	cur := in.Current
	var answered []string
	for _, id := range cur {
		if in.Live(id) {
			if _, ok := in.Status(id); ok {
				answered = append(answered, id)
			}
		}
	}
	if len(answered) < len(cur)-in.MinInSync+1 || len(answered) == 0 {
		return MasterDecision{Replicas: cur} // wait for replicas to return
	}
	best := answered[0]
	for _, id := range answered[1:] {
		b, _ := in.Status(best)
		s, _ := in.Status(id)
		if b.SCN.Less(s.SCN) {
			best = id
		}
	}
	out := first(best, in.Target)
	return MasterDecision{Replicas: out, Bump: best == cur[0]}
}

// canTakeOver reports whether replica r can take a partition over from
// its live master ms by a planned hand-over: it is caught up, and the
// master's retained log still holds every commit it lacks, which it
// drains. (A replica behind the log's start must first be rebuilt from
// a snapshot: handed the partition, its drain fails, and the partition
// has no master until the controller chooses again.)
func canTakeOver(r, ms node.PartitionStatus) bool {
	return caughtUp(r.SCN, ms.SCN) && !r.SCN.Less(ms.LogStart)
}

// caughtUp reports whether a replica at r is on the timeline of a master
// at m and close enough behind it to take over.
func caughtUp(r, m storage.SCN) bool {
	return r.Gen == m.Gen && r.Seq <= m.Seq && m.Seq-r.Seq <= HandBackLag
}

// first returns ids with id moved (or added) to the front.
func first(id string, ids []string) []string {
	out := []string{id}
	for _, x := range ids {
		if x != id {
			out = append(out, x)
		}
	}
	return out
}

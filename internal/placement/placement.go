package placement

import (
	"cmp"
	"hash/fnv"
	"slices"
)

// Node is a live storage node.
type Node struct {
	ID   string
	Rack string // empty: a rack of its own
	// Draining says the node is about to stop (a clean shutdown, a
	// rolling restart): it keeps its replicas but masters nothing that
	// another live replica can master.
	Draining bool
}

// Assignment maps each partition to its replicas' node IDs; the first
// replica is the master.
type Assignment map[int][]string

// Input is everything placement depends on.
type Input struct {
	Nodes      []Node
	Partitions int
	Replicas   int
	// Current is the assignment in force (nil for a new database).
	Current Assignment
}

// IdealState computes the target assignment:
//
//   - every partition has min(Replicas, len(Nodes)) replicas on distinct
//     nodes, and on distinct racks while there are enough racks;
//   - replicas, masters and slaves are each spread evenly: for each role
//     the counts per node differ by at most one;
//   - it moves as little as it can from Current: a replica on a live node
//     stays unless its node holds more than its share, and a master stays
//     master unless its node masters more than its share;
//   - a draining node keeps its replicas but masters only partitions that
//     have no replica elsewhere, and the others share its masters.
//
// It is deterministic: equal inputs give equal outputs.
func IdealState(in Input) Assignment {
	nodes := slices.Clone(in.Nodes)
	slices.SortFunc(nodes, func(a, b Node) int { return cmp.Compare(a.ID, b.ID) })
	out := Assignment{}
	if len(nodes) == 0 || in.Partitions <= 0 {
		return out
	}
	r := min(max(in.Replicas, 1), len(nodes))
	p := placer{nodes: nodes, draining: map[string]bool{}, rackOf: map[string]string{}, load: map[string]int{}, hosts: map[int]map[string]bool{}, prefs: map[int][]Node{}}
	for _, n := range nodes {
		p.draining[n.ID] = n.Draining
		rack := n.Rack
		if rack == "" {
			rack = "node:" + n.ID
		}
		p.rackOf[n.ID] = rack
	}
	p.spreadRacks = distinct(p.rackOf) >= r

	// 1. Keep current replicas on live nodes, dropping duplicates and
	// rack conflicts.
	replicas := make([][]string, in.Partitions)
	for part := range in.Partitions {
		p.hosts[part] = map[string]bool{}
		for _, id := range in.Current[part] {
			if _, live := p.rackOf[id]; !live || p.hosts[part][id] || !p.rackFree(part, id) || len(replicas[part]) >= r {
				continue
			}
			replicas[part] = append(replicas[part], id)
			p.hosts[part][id] = true
			p.load[id]++
		}
	}

	// 2. Fill missing replicas (new partitions, dead nodes) on the
	// least-loaded nodes under their share, keeping the rack rule while
	// it can be kept.
	target := p.replicaShares(in.Partitions, r)
	for part := range in.Partitions {
		for len(replicas[part]) < r {
			id := p.pick(part, target)
			replicas[part] = append(replicas[part], id)
			p.hosts[part][id] = true
			p.load[id]++
		}
	}

	// 3. Move replicas from nodes over their share straight to nodes
	// under it (slaves first), one replica per move, so every replica
	// that leaves a node has somewhere to go.
	for _, n := range nodes {
		for pass := 0; pass < 2; pass++ {
			for part := in.Partitions - 1; part >= 0 && p.load[n.ID] > target[n.ID]; part-- {
				i := slices.Index(replicas[part], n.ID)
				if i < 0 || (pass == 0) != (i > 0) {
					continue
				}
				if dest := p.moveTarget(part, target, n.ID); dest != "" {
					replicas[part][i] = dest
					delete(p.hosts[part], n.ID)
					p.hosts[part][dest] = true
					p.load[n.ID]--
					p.load[dest]++
				}
			}
		}
	}

	// 4. Masters: keep, then balance by moving the master role within
	// each partition's replicas (no data moves).
	masters := p.balanceMasters(replicas, in.Partitions)
	for part := range in.Partitions {
		m := masters[part]
		rs := []string{m}
		for _, id := range replicas[part] {
			if id != m {
				rs = append(rs, id)
			}
		}
		out[part] = rs
	}
	return out
}

type placer struct {
	nodes       []Node
	draining    map[string]bool
	rackOf      map[string]string
	load        map[string]int
	hosts       map[int]map[string]bool
	prefs       map[int][]Node
	spreadRacks bool
}

// preference lists the nodes in part's rendezvous-hash order (highest
// random weight first). New replicas go to the first node in this order
// that is under its share, so replica sets mix all nodes — if they formed
// disjoint groups, the master role could not move between groups and
// masters could not be balanced — and stay put when nodes come and go.
func (p *placer) preference(part int) []Node {
	if order, ok := p.prefs[part]; ok {
		return order
	}
	order := slices.Clone(p.nodes)
	weight := map[string]uint64{}
	for _, n := range order {
		weight[n.ID] = mix(p.nodeHash(n.ID) ^ uint64(part)*0x9e3779b97f4a7c15)
	}
	slices.SortFunc(order, func(a, b Node) int { return cmp.Compare(weight[b.ID], weight[a.ID]) })
	p.prefs[part] = order
	return order
}

func (p *placer) nodeHash(id string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	return h.Sum64()
}

// mix is splitmix64's finalizer: every input bit affects every output bit.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

func distinct(m map[string]string) int {
	seen := map[string]bool{}
	for _, v := range m {
		seen[v] = true
	}
	return len(seen)
}

// rackFree reports whether node id may hold a replica of part without a
// second replica on its rack (ignoring the replica on node leaving, which
// is moving away).
func (p *placer) rackFree(part int, id string, leaving ...string) bool {
	if !p.spreadRacks {
		return true
	}
	for other := range p.hosts[part] {
		if other != id && !slices.Contains(leaving, other) && p.rackOf[other] == p.rackOf[id] {
			return false
		}
	}
	return true
}

// moveTarget finds the node to move from's replica of part to: the first
// in part's preference order that is under its share, not a replica of
// part, and rack-free. "" if none.
func (p *placer) moveTarget(part int, target map[string]int, from string) string {
	for _, n := range p.preference(part) {
		id := n.ID
		if !p.hosts[part][id] && p.load[id] < target[id] && p.rackFree(part, id, from) {
			return id
		}
	}
	return ""
}

// pick chooses the node for a new replica of part: the first in part's
// preference order that is under its share, not already a replica, and
// rack-free. If the rules leave no node it relaxes first the share (taking
// the least loaded), then the rack rule.
func (p *placer) pick(part int, target map[string]int) string {
	for pass := 0; pass < 3; pass++ {
		best := ""
		for _, n := range p.preference(part) {
			id := n.ID
			if p.hosts[part][id] || (pass < 1 && p.load[id] >= target[id]) || (pass < 2 && !p.rackFree(part, id)) {
				continue
			}
			// Under its share: the first in preference order wins.
			// Past the share (a relaxed pass): the least loaded.
			if pass == 0 {
				return id
			}
			if best == "" || p.load[id] < p.load[best] {
				best = id
			}
		}
		if best != "" {
			return best
		}
	}
	return ""
}

// replicaShares gives each node its target number of replicas. When there
// are exactly as many racks as replicas, every rack holds one replica of
// every partition, so each rack's nodes share the rack's partitions;
// otherwise all nodes share all replicas.
func (p *placer) replicaShares(partitions, r int) map[string]int {
	if !p.spreadRacks || distinct(p.rackOf) != r {
		return shares(p.nodes, partitions*r, p.load)
	}
	byRack := map[string][]Node{}
	for _, n := range p.nodes {
		byRack[p.rackOf[n.ID]] = append(byRack[p.rackOf[n.ID]], n)
	}
	t := map[string]int{}
	for _, members := range byRack {
		for id, v := range shares(members, partitions, p.load) {
			t[id] = v
		}
	}
	return t
}

// shares gives each node its target count of total items: ⌊total/n⌋, plus
// one for total mod n nodes, chosen by current count (highest first, then
// ID) so that nodes already holding more keep it.
func shares(nodes []Node, total int, current map[string]int) map[string]int {
	byLoad := slices.Clone(nodes)
	slices.SortStableFunc(byLoad, func(a, b Node) int { return cmp.Compare(current[b.ID], current[a.ID]) })
	t := map[string]int{}
	for i, n := range byLoad {
		t[n.ID] = total / len(nodes)
		if i < total%len(nodes) {
			t[n.ID]++
		}
	}
	return t
}

// balanceMasters picks one master per partition among its replicas. Each
// node's share of masters is ⌊P/n⌋ or one more; the larger shares go to
// nodes holding more replicas, which keeps the slave counts even too.
func (p *placer) balanceMasters(replicas [][]string, partitions int) []string {
	masters := make([]string, partitions)
	count := map[string]int{}
	// The share: rank nodes by replica load, then by current masters.
	current := map[string]int{}
	for part := range partitions {
		current[replicas[part][0]]++
	}
	// Draining nodes have no share; a partition only they hold keeps its
	// master there, past the share (it has nowhere else to go).
	ranked := slices.DeleteFunc(slices.Clone(p.nodes), func(n Node) bool { return n.Draining })
	if len(ranked) == 0 {
		ranked = slices.Clone(p.nodes)
	}
	slices.SortStableFunc(ranked, func(a, b Node) int {
		return cmp.Or(cmp.Compare(p.load[b.ID], p.load[a.ID]), cmp.Compare(current[b.ID], current[a.ID]))
	})
	share := map[string]int{}
	for i, n := range ranked {
		share[n.ID] = partitions / len(ranked)
		if i < partitions%len(ranked) {
			share[n.ID]++
		}
	}
	// Keep current masters within their node's share.
	for part := range partitions {
		if m := replicas[part][0]; count[m] < share[m] {
			masters[part] = m
			count[m]++
		}
	}
	// Give the rest to the replica with the most room.
	for part := range partitions {
		if masters[part] != "" {
			continue
		}
		best := ""
		for _, id := range replicas[part] {
			if best == "" || p.draining[best] && !p.draining[id] ||
				p.draining[best] == p.draining[id] && share[id]-count[id] > share[best]-count[best] {
				best = id
			}
		}
		masters[part] = best
		count[best]++
	}
	// Repair: move the master role from a node over its share to a
	// replica under its share, along a chain if needed.
	for changed := true; changed; {
		changed = false
		for part := range partitions {
			m := masters[part]
			if count[m] <= share[m] {
				continue
			}
			for _, id := range replicas[part] {
				if id != m && count[id] < share[id] && !p.draining[id] {
					masters[part] = id
					count[m]--
					count[id]++
					changed = true
					break
				}
			}
		}
		if !changed {
			changed = p.shiftChain(replicas, masters, count, share)
		}
	}
	return masters
}

// shiftChain finds a node over its master share and moves one master role
// along a path over-share → … → under-share through nodes at their share
// (breadth-first over "this node masters a partition that node replicates").
// It reports whether it moved anything.
func (p *placer) shiftChain(replicas [][]string, masters []string, count, share map[string]int) bool {
	for _, start := range p.nodes {
		if count[start.ID] <= share[start.ID] {
			continue
		}
		type step struct {
			node string
			part int
			prev int // index into visited
		}
		visited := []step{{node: start.ID, part: -1, prev: -1}}
		seen := map[string]bool{start.ID: true}
		for i := 0; i < len(visited); i++ {
			from := visited[i].node
			for part, m := range masters {
				if m != from {
					continue
				}
				for _, id := range replicas[part] {
					if seen[id] {
						continue
					}
					seen[id] = true
					visited = append(visited, step{node: id, part: part, prev: i})
					if count[id] < share[id] {
						// Apply the path backwards.
						for j := len(visited) - 1; visited[j].prev >= 0; j = visited[j].prev {
							masters[visited[j].part] = visited[j].node
						}
						count[start.ID]--
						count[id]++
						return true
					}
				}
			}
		}
	}
	return false
}

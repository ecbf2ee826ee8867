package placement

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/storage"
)

func scn(g uint32, s uint64) storage.SCN { return storage.SCN{Gen: g, Seq: s} }

// statuses are a partition's replicas a (master) and b, and copies x and
// y on nodes that are no replica of it.
func statuses() map[string]node.PartitionStatus {
	return map[string]node.PartitionStatus{
		"a": {Role: node.Master, SCN: scn(3, 50)},
		"b": {Role: node.Slave, SCN: scn(3, 40)},
		"x": {Role: node.Offline, SCN: scn(3, 40)},
		"y": {Role: node.Offline, SCN: scn(2, 900)},
	}
}

func decide(m map[string]node.PartitionStatus, want int, live, answered string, told, next []string) (replicas, drop []string) {
	return DecideCopies(CopiesInput{
		Published: []string{"a", "b"}, Told: told, Replicas: next, SameGeneration: true,
		Want:     want,
		Live:     func(id string) bool { return strings.Contains(live, id) },
		Answered: func(id string) bool { return strings.Contains(answered, id) },
		Status:   func(id string) (node.PartitionStatus, bool) { s, ok := m[id]; return s, ok },
		Holders:  []string{"y", "a", "x", "b"},
	})
}

// TestRedundantCopies: a copy on a node that is no replica goes only when
// every wanted replica is live, in its role and at or past the copy's
// SCN; never a replica's, never a copy that is not OFFLINE.
func TestRedundantCopies(t *testing.T) {
	type st = node.PartitionStatus
	cases := []struct {
		name   string
		edit   func(map[string]st)
		want   int
		live   string
		expect string
	}{
		{"both behind the replicas", nil, 2, "abxy", "[x y]"},
		{"a copy ahead of a slave", func(m map[string]st) { m["x"] = st{Role: node.Offline, SCN: scn(3, 41)} }, 2, "abxy", "[y]"},
		{"a copy of a later generation", func(m map[string]st) { m["x"] = st{Role: node.Offline, SCN: scn(4, 1)} }, 2, "abxy", "[y]"},
		{"a slave being rebuilt", func(m map[string]st) { m["b"] = st{Role: node.Slave} }, 2, "abxy", "[]"},
		{"a slave not following", func(m map[string]st) { m["b"] = st{Role: node.Offline, SCN: scn(3, 40)} }, 2, "abxy", "[]"},
		{"a master not mastering", func(m map[string]st) { m["a"] = st{Role: node.Slave, SCN: scn(3, 50)} }, 2, "abxy", "[]"},
		{"a replica gone", nil, 2, "axy", "[]"},
		{"a replica silent", func(m map[string]st) { delete(m, "b") }, 2, "abxy", "[]"},
		{"fewer replicas than wanted", nil, 3, "abxy", "[]"},
		{"a copy still a slave", func(m map[string]st) { m["x"] = st{Role: node.Slave, SCN: scn(3, 10)} }, 2, "abxy", "[y]"},
	}
	for _, c := range cases {
		m := statuses()
		if c.edit != nil {
			c.edit(m)
		}
		replicas, drop := decide(m, c.want, c.live, c.live, nil, []string{"a", "b"})
		if fmt.Sprint(drop) != c.expect || fmt.Sprint(replicas) != "[a b]" {
			t.Errorf("%s: replicas %v, dropped %v, want [a b] and %s", c.name, replicas, drop, c.expect)
		}
	}
}

// TestToldCopies: a node told to delete its copy stays told, and out of
// the replica list, until it answers without the partition (its report
// may be of the copy its agent has not deleted yet); a node gone is no
// longer told. While the replica list changes, only told nodes are.
func TestToldCopies(t *testing.T) {
	behind := func(m map[string]node.PartitionStatus) {
		m["b"] = node.PartitionStatus{Role: node.Slave, SCN: scn(3, 1)} // x is ahead of b now; y is not
	}
	cases := []struct {
		name     string
		edit     func(map[string]node.PartitionStatus)
		live     string
		told     []string
		next     []string
		replicas string
		drop     string
	}{
		{"told, still holding, re-placed", behind, "abxy", []string{"x"}, []string{"a", "b", "x"}, "[a b]", "[x y]"},
		{"told, silent", behind, "abxyz", []string{"x", "z"}, []string{"a", "b", "z"}, "[a b]", "[x y z]"},
		{"told, answered without it", func(m map[string]node.PartitionStatus) { behind(m); delete(m, "x") }, "abxy", []string{"x"}, []string{"a", "b", "x"}, "[a b x]", "[]"},
		{"told, gone", behind, "aby", []string{"x"}, []string{"a", "b", "x"}, "[a b x]", "[]"},
		// y is a copy, not caught up as a slave: b stays a slave (leaving).
		{"told, the replica list changes", nil, "abxy", []string{"x"}, []string{"a", "y"}, "[a y b]", "[x]"},
		{"told, the replica list the same", nil, "abxy", []string{"x"}, []string{"a", "b"}, "[a b]", "[x y]"},
	}
	for _, c := range cases {
		m := statuses()
		if c.edit != nil {
			c.edit(m)
		}
		replicas, drop := decide(m, 2, c.live, "abxy", c.told, c.next)
		if fmt.Sprint(replicas) != c.replicas || fmt.Sprint(drop) != c.drop {
			t.Errorf("%s: replicas %v, dropped %v, want %s and %s", c.name, replicas, drop, c.replicas, c.drop)
		}
	}
}

// TestLeavingReplicas: a slave leaving the replica set stays in it, last,
// until every slave of the new set has caught up with the master — make
// before break — unless it is gone, no slave, or told to delete its copy.
func TestLeavingReplicas(t *testing.T) {
	type st = node.PartitionStatus
	cases := []struct {
		name   string
		edit   func(map[string]st)
		live   string
		told   []string
		expect string
	}{
		{"the newcomer rebuilt from a snapshot", func(m map[string]st) { m["z"] = st{Role: node.Slave} }, "abz", nil, "[a z b]"},
		{"the newcomer silent", nil, "abz", nil, "[a z b]"},
		{"the newcomer not yet a slave", func(m map[string]st) { m["z"] = st{Role: node.Offline, SCN: scn(3, 50)} }, "abz", nil, "[a z b]"},
		{"the newcomer far behind", func(m map[string]st) {
			m["z"] = st{Role: node.Slave, SCN: scn(3, 1)}
			m["a"] = st{Role: node.Master, SCN: scn(3, 1+HandBackLag+1)}
		}, "abz", nil, "[a z b]"},
		{"the newcomer on an earlier generation", func(m map[string]st) { m["z"] = st{Role: node.Slave, SCN: scn(2, 900)} }, "abz", nil, "[a z b]"},
		{"the master silent", func(m map[string]st) { m["z"] = st{Role: node.Slave, SCN: scn(3, 50)}; delete(m, "a") }, "abz", nil, "[a z b]"},
		{"the newcomer caught up", func(m map[string]st) { m["z"] = st{Role: node.Slave, SCN: scn(3, 49)} }, "abz", nil, "[a z]"},
		{"the leaving one gone", func(m map[string]st) { m["z"] = st{Role: node.Slave} }, "az", nil, "[a z]"},
		{"the leaving one no slave", func(m map[string]st) { m["z"] = st{Role: node.Slave}; m["b"] = st{Role: node.Offline, SCN: scn(3, 40)} }, "abz", nil, "[a z]"},
		{"the leaving one told to delete its copy", func(m map[string]st) { m["z"] = st{Role: node.Slave} }, "abz", []string{"b"}, "[a z]"},
	}
	for _, c := range cases {
		m := statuses()
		if c.edit != nil {
			c.edit(m)
		}
		replicas, _ := DecideCopies(CopiesInput{
			Published: []string{"a", "b"}, Told: c.told, Replicas: []string{"a", "z"}, SameGeneration: true, Want: 2,
			Live:     func(id string) bool { return strings.Contains(c.live, id) },
			Answered: func(id string) bool { _, ok := m[id]; return ok },
			Status:   func(id string) (node.PartitionStatus, bool) { s, ok := m[id]; return s, ok },
			Holders:  []string{"a", "b"},
		})
		if fmt.Sprint(replicas) != c.expect {
			t.Errorf("%s: replicas %v, want %s", c.name, replicas, c.expect)
		}
	}
}

package cluster

import (
	"slices"
	"testing"

	"github.com/cortado-db/cortado/internal/storage"
)

// TestMasterChoice checks who masters a partition in the next routing
// table: the current master while it lives, an existing replica rather
// than a new one, and after a failover the replica furthest along the
// timeline.
func TestMasterChoice(t *testing.T) {
	scns := map[string]storage.SCN{"a": {Gen: 3, Seq: 9}, "b": {Gen: 3, Seq: 7}, "c": {Gen: 3, Seq: 12}, "d": {}}
	scn := func(id string) storage.SCN { return scns[id] }
	for _, tc := range []struct {
		name            string
		current, target []string
		live            []string
		want            []string
	}{
		{"unchanged", []string{"a", "b"}, []string{"a", "b"}, []string{"a", "b"}, []string{"a", "b"}},
		{"planned move to an existing replica", []string{"a", "b"}, []string{"b", "a"}, []string{"a", "b"}, []string{"b", "a"}},
		{"new node is not master before it caught up", []string{"a", "b"}, []string{"d", "a"}, []string{"a", "b", "d"}, []string{"a", "d"}},
		{"failover promotes the most advanced slave", []string{"x", "b", "c"}, []string{"b", "c", "a"}, []string{"a", "b", "c"}, []string{"c", "b", "a"}},
		{"failover ignores a new replica's empty timeline", []string{"x", "b"}, []string{"d", "b"}, []string{"b", "d"}, []string{"b", "d"}},
		{"master leaving hands to the most advanced", []string{"a", "b", "c"}, []string{"d", "b", "c"}, []string{"a", "b", "c", "d"}, []string{"c", "d", "b"}},
	} {
		live := map[string]string{}
		for _, id := range tc.live {
			live[id] = "http://" + id
		}
		if got := keepMasterUntilCaughtUp(tc.current, tc.target, live, scn); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v → %v = %v, want %v", tc.name, tc.current, tc.target, got, tc.want)
		}
	}
}

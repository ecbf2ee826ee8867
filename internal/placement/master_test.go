package placement

import (
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/storage"
)

// TestMasterChoice runs testdata/master_choice: who masters a partition in
// the next routing table (DecideMaster). Each case gives the published
// and ideal replica lists, the live nodes, minInSync, whether the master
// is stuck, and one line per replica that answered: "id ROLE gen:seq".
func TestMasterChoice(t *testing.T) {
	datadriven.RunTest(t, "testdata/master_choice", func(t *testing.T, d *datadriven.TestData) string {
		list := func(key string) []string {
			var v string
			d.ScanArgs(t, key, &v)
			return strings.Split(v, ",")
		}
		in := MasterInput{Current: list("current"), Target: list("target"), MinInSync: 2}
		live := map[string]bool{}
		for _, id := range list("live") {
			live[id] = true
		}
		if d.HasArg("min-in-sync") {
			d.ScanArgs(t, "min-in-sync", &in.MinInSync)
		}
		in.Stuck = d.HasArg("stuck")
		in.Rejoined = d.HasArg("rejoined")
		if d.HasArg("from") {
			d.ScanArgs(t, "from", &in.From)
		}
		statuses := map[string]node.PartitionStatus{}
		for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
			if line == "" {
				continue
			}
			// id ROLE scn [log-start=scn]: the master's retained log
			// holds the commits after log-start.
			f := strings.Fields(line)
			if len(f) < 3 {
				t.Fatalf("%s: want id ROLE scn [log-start=scn]", line)
			}
			id, role, scn := f[0], f[1], f[2]
			var st node.PartitionStatus
			if err := st.Role.UnmarshalText([]byte(role)); err != nil {
				t.Fatal(err)
			}
			s, err := storage.ParseSCN(scn)
			if err != nil {
				t.Fatal(err)
			}
			st.SCN = s
			if len(f) > 3 {
				ls, err := storage.ParseSCN(strings.TrimPrefix(f[3], "log-start="))
				if err != nil {
					t.Fatal(err)
				}
				st.LogStart = ls
			}
			statuses[id] = st
		}
		in.Live = func(id string) bool { return live[id] }
		in.Status = func(id string) (node.PartitionStatus, bool) {
			st, ok := statuses[id]
			return st, ok && live[id]
		}
		got := DecideMaster(in)
		out := "replicas=" + strings.Join(got.Replicas, ",")
		if got.From != "" {
			out += " from=" + got.From
		}
		if got.Bump {
			out += " new-generation"
		}
		return out + "\n"
	})
}

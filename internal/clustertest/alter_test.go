package clustertest

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/topo"
)

// alter sends PATCH /_schemata/d with body through the router and
// returns its status and answer.
func (c *testCluster) alter(body string) (int, string) {
	c.t.Helper()
	req, _ := http.NewRequest("PATCH", c.url+"/_schemata/d", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/merge-patch+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// awaitReplicas waits until every partition has n replicas in the
// routing table and no node that is not one of them holds a copy.
func (c *testCluster) awaitReplicas(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		tb := c.view.Table("d")
		var wrong []string
		for p, r := range tb.Partitions {
			if len(r.Replicas) != n {
				wrong = append(wrong, fmt.Sprintf("partition %d has replicas %v", p, r.Replicas))
			}
			for id, cn := range c.nodes {
				if slices.Contains(r.Replicas, id) {
					continue
				}
				if held, err := cn.eng.Holds("d", p); err != nil || held {
					wrong = append(wrong, fmt.Sprintf("%s holds a copy of partition %d (%v)", id, p, err))
				}
			}
		}
		if len(wrong) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after replicas became %d: %s", n, strings.Join(wrong, "; "))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAlterReplicasUnderLoad: a database's replicas change while a writer
// keeps writing (PATCH /_schemata/{db}): from 2 to 3 (every partition
// gains a replica, which catches up), to 2 again (each partition's third
// copy is deleted once the others hold all of it), and to 3 again; then
// the busiest master is killed and the partitions fail over. Every
// acknowledged write is read back, and every replica matches its
// master. The settings that cannot change are refused, and change
// nothing.
func TestAlterReplicasUnderLoad(t *testing.T) {
	const partitions = 8
	c := startCluster(t, 3, partitions, 2)
	for _, body := range []string{`{"partitions":16}`, `{"minInSync":1}`, `{"replication":"async"}`} {
		if status, answer := c.alter(body); status != http.StatusConflict || !strings.Contains(answer, "cannot change") {
			t.Fatalf("PATCH %s: %d %s, want 409 (cannot change)", body, status, answer)
		}
	}
	if status, answer := c.alter(`{"replicas":4}`); status != http.StatusBadRequest {
		t.Fatalf("replicas 4 on 3 nodes: %d %s, want 400", status, answer)
	}
	if d, _ := c.reg.Database("d"); d.Partitions != partitions || d.Replicas != 2 || d.InSync() != 2 || d.Replication != "semi-sync" {
		t.Fatalf("refused changes changed the definition: %+v", d)
	}
	acked := map[string]string{}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k, v := fmt.Sprintf("w%d", i), fmt.Sprint(i)
			if c.putPathUnless("T/"+k, `{"v":"`+v+`"}`, "") {
				acked[k] = v
			}
		}
	}()
	awaitTable(t, c, func(tb *topo.RoutingTable) bool { return tb != nil })
	for _, replicas := range []int{3, 2, 3} {
		if status, answer := c.alter(fmt.Sprintf(`{"replicas":%d}`, replicas)); status != http.StatusOK || !strings.Contains(answer, fmt.Sprintf(`"replicas":%d`, replicas)) {
			t.Fatalf("replicas %d: %d %s", replicas, status, answer)
		}
		c.awaitReplicas(t, replicas)
		awaitReplicasEqual(t, c.view, c.nodes, partitions)
	}
	victim := busiestMaster(c.view.Table("d"))
	c.nodes[victim].kill()
	delete(c.nodes, victim)
	awaitTable(t, c, func(tb *topo.RoutingTable) bool {
		for _, r := range tb.Partitions {
			if r.Replicas[0] == victim {
				return false
			}
		}
		return true
	})
	for i := range partitions * 4 { // every partition writable again
		c.put(fmt.Sprintf("after%d", i), "x")
	}
	close(stop)
	<-done
	t.Logf("%d writes acknowledged while replicas went 2, 3, 2, 3 and %s was killed", len(acked), victim)
	c.checkAcked(acked)
	awaitReplicasEqual(t, c.view, c.nodes, partitions)
}

package clustertest

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/schema"
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

// writer writes keys w0, w1, … of table T through the router until the
// stop it returns is called; stop returns the writes acknowledged.
func (c *testCluster) writer() (stop func() map[string]string) {
	acked := map[string]string{}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-quit:
				return
			default:
			}
			k, v := fmt.Sprintf("w%d", i), fmt.Sprint(i)
			if c.putPathUnless("T/"+k, `{"v":"`+v+`"}`, "") {
				acked[k] = v
			}
		}
	}()
	return func() map[string]string {
		close(quit)
		<-done
		return acked
	}
}

// failOverBusiest kills the node that masters the most partitions, waits
// until no partition names it master, writes to every partition (each
// takes writes again), and returns the node's ID.
func (c *testCluster) failOverBusiest(t *testing.T, partitions int) string {
	t.Helper()
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
	for i := range partitions * 4 { // spread over every partition
		c.put(fmt.Sprintf("after%d", i), "x")
	}
	return victim
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
		if status, answer := c.alter(body); status != http.StatusConflict || !strings.Contains(answer, "database setting refused") {
			t.Fatalf("PATCH %s: %d %s, want 409 (database setting refused)", body, status, answer)
		}
	}
	if status, answer := c.alter(`{"replicas":4}`); status != http.StatusBadRequest {
		t.Fatalf("replicas 4 on 3 nodes: %d %s, want 400", status, answer)
	}
	if d, _ := c.reg.Database("d"); d.Partitions != partitions || d.Replicas != 2 || d.InSync() != 2 || d.Replication != "semi-sync" {
		t.Fatalf("refused changes changed the definition: %+v", d)
	}
	// A definition as read, tables and all, sent back is a patch that
	// changes nothing.
	resp, err := http.Get(c.url + "/_schemata/d")
	if err != nil {
		t.Fatal(err)
	}
	read, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if status, answer := c.alter(string(read)); status != http.StatusOK || !strings.Contains(string(read), `"tables"`) || !strings.Contains(answer, `"replicas":2`) {
		t.Fatalf("the definition as read (%s), sent back: %d %s", read, status, answer)
	}
	stopWriter := c.writer()
	awaitTable(t, c, func(tb *topo.RoutingTable) bool { return tb != nil })
	for _, replicas := range []int{3, 2, 3} {
		if status, answer := c.alter(fmt.Sprintf(`{"replicas":%d}`, replicas)); status != http.StatusOK || !strings.Contains(answer, fmt.Sprintf(`"replicas":%d`, replicas)) {
			t.Fatalf("replicas %d: %d %s", replicas, status, answer)
		}
		c.awaitReplicas(t, replicas)
		awaitReplicasEqual(t, c.view, c.nodes, partitions)
	}
	victim := c.failOverBusiest(t, partitions)
	acked := stopWriter()
	t.Logf("%d writes acknowledged while replicas went 2, 3, 2, 3 and %s was killed", len(acked), victim)
	c.checkAcked(acked)
	awaitReplicasEqual(t, c.view, c.nodes, partitions)
}

// TestRaiseMinInSyncUnderLoad: a database made with one replica (so
// minInSync 1) is given three replicas and then minInSync 2 while a
// writer keeps writing. The raise counts in failovers once the
// controller has seen the writes of before it held by two replicas (it
// clears failoverInSync); then the busiest master is killed, and its
// partitions fail over (with minInSync 1 they would have waited for it
// to come back). Every acknowledged write is read back, and every
// replica matches its master. Lowering minInSync is refused.
func TestRaiseMinInSyncUnderLoad(t *testing.T) {
	const partitions = 8
	c := startCluster(t, 3, partitions, 1)
	stopWriter := c.writer()
	awaitTable(t, c, func(tb *topo.RoutingTable) bool { return tb != nil })
	if status, answer := c.alter(`{"replicas":3}`); status != http.StatusOK {
		t.Fatalf("replicas 3: %d %s", status, answer)
	}
	c.awaitReplicas(t, 3)
	awaitReplicasEqual(t, c.view, c.nodes, partitions)
	status, answer := c.alter(`{"minInSync":2}`)
	if status != http.StatusOK || !strings.Contains(answer, `"minInSync":2`) {
		t.Fatalf("minInSync 2: %d %s", status, answer)
	}
	if d, _ := c.reg.Database("d"); d.FailoverInSync != 0 && d.FailoverQuorum() != 1 {
		t.Fatalf("a raise not yet settled counts in failovers: %+v", d)
	}
	deadline := time.Now().Add(20 * time.Second)
	for d, _ := c.reg.Database("d"); d.FailoverInSync != 0; d, _ = c.reg.Database("d") {
		if time.Now().After(deadline) {
			t.Fatalf("20 s after minInSync was raised to 2, failovers still count by %d", d.FailoverQuorum())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if status, answer := c.alter(`{"minInSync":1}`); status != http.StatusConflict || !strings.Contains(answer, "not lowered") {
		t.Fatalf("minInSync lowered to 1: %d %s, want 409", status, answer)
	}
	victim := c.failOverBusiest(t, partitions)
	acked := stopWriter()
	t.Logf("%d writes acknowledged while replicas went 1 → 3, minInSync 1 → 2, and %s was killed", len(acked), victim)
	c.checkAcked(acked)
	awaitReplicasEqual(t, c.view, c.nodes, partitions)
}

// TestMasterCountsByTheTablesMinInSync: a master whose registry has not
// seen a raise of minInSync yet counts acknowledgements by the raised
// value once a routing table says so (node.SetInSyncFloor, which its
// agent sets from the table), and reports it in its status: a write
// that would need no slave by the registry's minInSync of 1 waits for
// one, and with none live is refused. A table's lower value changes
// nothing.
func TestMasterCountsByTheTablesMinInSync(t *testing.T) {
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: 1, Replicas: 3, MinInSync: 1})
	n := newStorageNodeWith(t, reg, node.Options{SemiSyncTimeout: 300 * time.Millisecond})
	if err := n.SetRole("d", 0, node.Master, 1, 0); err != nil {
		t.Fatal(err)
	}
	n.SetSlaves("d", 0, []string{"b", "c"})
	inSync := func() int {
		st, err := n.Status(t.Context(), node.StatusRequest{DB: "d"})
		if err != nil || len(st) != 1 {
			t.Fatalf("status: %+v, %v", st, err)
		}
		return st[0].InSync
	}
	write(t, n, "k1", "v") // minInSync 1: the master alone
	if k := inSync(); k != 1 {
		t.Fatalf("status reports minInSync %d, want 1", k)
	}
	n.SetInSyncFloor("d", 2)
	n.SetInSyncFloor("d", 1)
	if k := inSync(); k != 2 {
		t.Fatalf("after a table's minInSync of 2: status reports %d", k)
	}
	tree, _ := schema.DecodeJSON([]byte(`{"v":"w"}`))
	s, _ := schema.Parse(`{"type":"record","name":"T","fields":[{"name":"v","type":"string"}]}`)
	val, _ := schema.EncodeJSON(nil, s, tree)
	_, err := n.Write(t.Context(), node.WriteRequest{DB: "d", Partition: 0,
		Ops: []node.Op{{Kind: node.OpPut, Table: "T", Key: []keys.Part{keys.S("k2")}, Version: 1, Value: val}}})
	if !errors.Is(err, node.ErrNotEnoughReplicas) && !errors.Is(err, node.ErrNotReplicated) {
		t.Fatalf("a write with no slave live, by a table's minInSync of 2: %v, want it refused or not replicated", err)
	}
}

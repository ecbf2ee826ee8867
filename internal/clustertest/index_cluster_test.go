package clustertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cortado-db/cortado/client"
	"github.com/cortado-db/cortado/internal/schema"
)

// TestIndexOnReplicas writes, updates and deletes indexed documents (and
// now and then a whole collection) through the router of a three-node cluster, checks that every replica's
// index equals its master's (slaves index what they apply, themselves),
// kills the busiest master, and checks that queries through the router
// answer the model on the promoted masters, before and after more writes.
func TestIndexOnReplicas(t *testing.T) {
	const partitions = 4
	c := startCluster(t, 3, partitions, 3)
	qt := qTable{name: "Q", indexed: map[string]bool{"from": true, "createdOn": true, "isInbox": true, "labels": true, "score": true}}
	if _, _, err := c.reg.RegisterVersion(c.ctx, "d", "Q", []schema.KeyPart{{Name: "box"}, {Name: "id", Type: "long"}}, qt.schema()); err != nil {
		t.Fatal(err)
	}
	cl := client.New(c.url)
	defer cl.Close()
	rng := rand.New(rand.NewPCG(11, 12))
	boxes := []string{"b0", "b1", "b2", "b3", "b4", "b5"}
	model := map[string]map[int64]msg{}
	for _, b := range boxes {
		model[b] = map[int64]msg{}
	}
	// do retries a write answered 503 (between masters).
	do := func(write func() error) {
		for {
			err := write()
			var ce *client.Error
			if errors.As(err, &ce) && ce.Status == 503 {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	write := func(n int) {
		for range n {
			box, id := boxes[rng.IntN(len(boxes))], rng.Int64N(25)
			if rng.IntN(50) == 0 {
				// A whole box: its index entries go by range.
				do(func() error { _, err := cl.Delete(c.ctx, "d", "Q", client.Key{box}, nil); return err })
				model[box] = map[int64]msg{}
				continue
			}
			_, exists := model[box][id]
			if exists && rng.IntN(4) == 0 {
				do(func() error { _, err := cl.Delete(c.ctx, "d", "Q", client.Key{box, id}, nil); return err })
				delete(model[box], id)
				continue
			}
			m := randMsg(rng, id)
			do(func() error { _, err := cl.Put(c.ctx, "d", "Q", client.Key{box, id}, m, nil); return err })
			model[box][id] = m
		}
	}
	check := func(stage string) {
		t.Helper()
		for _, box := range append(boxes, "") { // "": every box, across the partitions
			for range 8 {
				q := genQ(rng, qt, 0)
				var want []int64
				if box == "" {
					want = expectedAll(model, boxes, q.match, "createdOn")
				} else {
					want = expected(model[box], q.match, "createdOn")
				}
				var got []int64
				deadline := time.Now().Add(20 * time.Second)
				for {
					var err error
					got, err = tryQueryAll(cl, "d", "Q", box, q.text, "createdOn")
					var ce *client.Error
					if errors.As(err, &ce) && ce.Status == 503 && time.Now().Before(deadline) {
						time.Sleep(20 * time.Millisecond)
						continue
					}
					if err != nil {
						t.Fatalf("%s: query %q: %v", stage, q.text, err)
					}
					break
				}
				if !slices.Equal(got, want) {
					t.Fatalf("%s: box %s query %q:\n got  %v\n want %v", stage, box, q.text, got, want)
				}
			}
		}
	}
	write(300)
	awaitReplicasEqual(t, c.view, c.nodes, partitions)
	indexed := compareIndexes(t, c, partitions)
	if indexed == 0 {
		t.Fatal("no index entries on any replica")
	}
	check("before the failover")

	victim := busiestMaster(c.view.Table("d"))
	c.nodes[victim].kill()
	delete(c.nodes, victim)
	check("during and after the failover")
	write(100)
	check("after writes to the new masters")
	awaitReplicasEqual(t, c.view, c.nodes, partitions)
	compareIndexes(t, c, partitions)
}

// compareIndexes checks that every live replica of each partition has
// its master's index; it returns how many entries the masters hold.
func compareIndexes(t *testing.T, c *testCluster, partitions int) int {
	t.Helper()
	total := 0
	for p := range partitions {
		route := c.view.Table("d").Partitions[p]
		var first string
		var sum uint32
		for _, id := range route.Replicas {
			n, live := c.nodes[id]
			if !live {
				continue
			}
			part, err := n.eng.Partition("d", p)
			if err != nil {
				t.Fatal(err)
			}
			s, entries, err := part.IndexChecksum()
			if err != nil {
				t.Fatal(err)
			}
			if first == "" {
				first, sum = id, s
				total += entries
				continue
			}
			if s != sum {
				t.Fatalf("partition %d: the index of %s differs from %s's (%08x vs %08x)", p, id, first, s, sum)
			}
		}
	}
	return total
}

// tryQueryAll is queryAll that returns errors.
func tryQueryAll(c *client.Client, db, table, box, q, sort string) ([]int64, error) {
	out := []int64{}
	next := ""
	prefix := client.Key{box}
	if box == "" {
		prefix = nil // every box
	}
	for {
		p, err := c.Query(context.Background(), db, table, prefix, client.Query{Where: q, Sort: sort, Limit: 5, Next: next}, nil)
		if err != nil {
			return nil, err
		}
		for _, d := range p.Documents {
			id, ok := d.Key[1].(int64)
			if !ok {
				return nil, fmt.Errorf("key %v", d.Key)
			}
			if box == "" {
				id += boxNumber(d.Key[0].(string)) * 1000
			}
			out = append(out, id)
		}
		if p.Next == "" {
			return out, nil
		}
		next = p.Next
	}
}

// TestQueryReadsItsWrites: writers each query for their document right
// after the write is acknowledged, on one `cortado serve`; the document
// must be there. Then the process is killed mid-write and restarted, and
// every query equals a brute-force filter of the documents the process
// holds (its index after the crash is the index of its documents).
func TestQueryReadsItsWrites(t *testing.T) {
	s := StartServe(t, ServeOptions{})
	ctx := context.Background()
	c := client.New(s.URL)
	if err := c.CreateDatabase(ctx, "r", client.Database{Partitions: 4}); err != nil {
		t.Fatal(err)
	}
	def := client.TableSchema{Key: []client.KeyPart{{Name: "box"}, {Name: "id", Type: "long"}},
		Schema: json.RawMessage(`{"type":"record","name":"W","fields":[{"name":"seq","type":"long","index":"attribute"},{"name":"text","type":"string","index":"text"}]}`)}
	if _, err := c.RegisterSchema(ctx, "r", "W", def); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	acked := 0
	enough := make(chan struct{})
	var once sync.Once
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			box := fmt.Sprintf("w%d", w%2) // two writers per document group
			for i := int64(0); ; i++ {
				id := int64(w)*1_000_000 + i
				word := fmt.Sprintf("tok%dx%d", w, i)
				if _, err := c.Put(ctx, "r", "W", client.Key{box, id}, map[string]any{"seq": id, "text": "hello " + word}, nil); err != nil {
					return // the server is gone
				}
				for _, q := range []string{fmt.Sprintf("seq:%d", id), word} {
					p, err := c.Query(ctx, "r", "W", client.Key{box}, client.Query{Where: q}, nil)
					if err != nil {
						return
					}
					if len(p.Documents) != 1 {
						t.Errorf("query %q right after its write was acknowledged: %d documents", q, len(p.Documents))
						return
					}
				}
				mu.Lock()
				acked++
				if acked >= 300 {
					once.Do(func() { close(enough) })
				}
				mu.Unlock()
			}
		}()
	}
	select {
	case <-enough:
	case <-time.After(2 * time.Minute):
		t.Fatal("writers too slow")
	}
	s.Kill()
	wg.Wait()
	c.Close()
	if t.Failed() {
		return
	}
	s.Restart()
	c = client.New(s.URL)
	defer c.Close()
	for _, box := range []string{"w0", "w1"} {
		// The documents, read in key order.
		var docs []struct {
			id  int64
			seq int64
		}
		next := ""
		for {
			p, err := c.Collection(ctx, "r", "W", client.Key{box}, 500, next, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range p.Documents {
				var v struct{ Seq int64 }
				if err := d.Decode(&v); err != nil {
					t.Fatal(err)
				}
				docs = append(docs, struct{ id, seq int64 }{d.Key[1].(int64), v.Seq})
			}
			if next = p.Next; next == "" {
				break
			}
		}
		all, err := tryQueryAll(c, "r", "W", box, "hello", "seq")
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != len(docs) {
			t.Fatalf("%s after the crash: %d documents, the text index finds %d", box, len(docs), len(all))
		}
		for i, d := range docs {
			if i%25 != 0 {
				continue
			}
			got, err := tryQueryAll(c, "r", "W", box, fmt.Sprintf("seq:[%d TO %d]", d.seq, d.seq+1), "")
			if err != nil {
				t.Fatal(err)
			}
			want := []int64{d.id}
			if i+1 < len(docs) && docs[i+1].seq == d.seq+1 {
				want = append(want, docs[i+1].id)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s after the crash: seq %d..%d finds %v, want %v", box, d.seq, d.seq+1, got, want)
			}
		}
		t.Logf("%s: %d documents, all found by the index after kill -9 and restart", box, len(docs))
	}
}

// TestIndexBuild adds an index to a table with documents (a new schema
// version annotates a field): queries on it answer 409 index-building,
// naming how many documents are left, while the master rewrites them in
// the new version; the build survives a kill -9 and restart, and ends
// with queries equal to a brute-force filter, every document in the new
// version, and nothing else changed.
func TestIndexBuild(t *testing.T) {
	s := StartServe(t, ServeOptions{Args: []string{"--nodes", "3", "--index-build-rate", "40"}})
	ctx := context.Background()
	c := client.New(s.URL)
	defer func() { c.Close() }()
	if err := c.CreateDatabase(ctx, "b", client.Database{Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	v1 := `{"type":"record","name":"B","fields":[{"name":"color","type":"string"},{"name":"n","type":"long","index":"attribute"}]}`
	if _, err := c.RegisterSchema(ctx, "b", "B", client.TableSchema{Key: []client.KeyPart{{Name: "box"}, {Name: "id", Type: "long"}}, Schema: json.RawMessage(v1)}); err != nil {
		t.Fatal(err)
	}
	colors := []string{"red", "green", "blue"}
	const docs = 240
	for i := range docs {
		box := fmt.Sprintf("b%d", i%4)
		if _, err := c.Put(ctx, "b", "B", client.Key{box, int64(i)}, map[string]any{"color": colors[i%3], "n": i}, nil); err != nil {
			t.Fatal(err)
		}
	}
	v2 := strings.Replace(v1, `"type":"string"}`, `"type":"string","index":"attribute"}`, 1)
	if _, err := c.RegisterSchema(ctx, "b", "B", client.TableSchema{Schema: json.RawMessage(v2)}); err != nil {
		t.Fatal(err)
	}
	_, err := c.Query(ctx, "b", "B", client.Key{"b0"}, client.Query{Where: "color:red"}, nil)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != 409 || !strings.Contains(ce.Detail, "still to be rewritten") {
		t.Fatalf("a query on the new index before it is built: %v", err)
	}
	// Without a partition key, the count is the partition's that
	// answered so, and the detail names it.
	_, err = c.Query(ctx, "b", "B", nil, client.Query{Where: "color:red"}, nil)
	if !errors.As(err, &ce) || ce.Status != 409 || !regexp.MustCompile(`^partition [01]: index building: .* [0-9]+ document\(s\) .* still to be rewritten`).MatchString(ce.Detail) {
		t.Fatalf("a query of every partition on the new index before it is built: %v", err)
	}
	// cluster status shows what is left, on the masters.
	if left := buildLeft(t, s.URL, "b", "B"); left == 0 || left > docs {
		t.Fatalf("cluster status during the build: %d documents left", left)
	}
	// The field that every version indexes answers meanwhile.
	if p, err := c.Query(ctx, "b", "B", client.Key{"b0"}, client.Query{Where: "n:[0 TO 7]"}, nil); err != nil || len(p.Documents) != 2 {
		t.Fatalf("the old index during the build: %v %v", p, err)
	}
	time.Sleep(1500 * time.Millisecond) // let the build start: the point is to cut it midway
	s.Kill()
	c.Close()
	s.Restart()
	c = client.New(s.URL)
	deadline := time.Now().Add(60 * time.Second)
	for box := 0; box < 4; {
		_, err := c.Query(ctx, "b", "B", client.Key{fmt.Sprintf("b%d", box)}, client.Query{Where: "color:red"}, nil)
		if err == nil {
			box++
			continue
		}
		// 409 while building; 503 while the restarted cluster's masters
		// take up their partitions.
		if !errors.As(err, &ce) || ce.Status != 409 && ce.Status != 503 || time.Now().After(deadline) {
			t.Fatalf("waiting for the build: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for b := range 4 {
		box := fmt.Sprintf("b%d", b)
		for ci, color := range colors {
			var want []int64
			for i := b; i < docs; i += 4 {
				if i%3 == ci {
					want = append(want, int64(i))
				}
			}
			got, err := tryQueryAll(c, "b", "B", box, "color:"+color, "")
			if err != nil {
				log, _ := os.ReadFile(filepath.Join(s.Dir, "serve.log"))
				t.Fatalf("%v\n%s", err, log[max(0, len(log)-3000):])
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s color:%s after the build: %v, want %v", box, color, got, want)
			}
		}
		p, err := c.Collection(ctx, "b", "B", client.Key{box}, 1000, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range p.Documents {
			var v struct {
				Color string
				N     int64
			}
			d.Decode(&v)
			if d.SchemaVersion != 0 && d.SchemaVersion != 2 || v.N != d.Key[1].(int64) || v.Color != colors[v.N%3] {
				t.Fatalf("%v after the build: version %d, %+v", d.Key, d.SchemaVersion, v)
			}
		}
	}
	if left := buildLeft(t, s.URL, "b", "B"); left != 0 {
		t.Fatalf("cluster status after the build: %d documents left", left)
	}
	await(t, 10*time.Second, "the build metric at 0", func() bool {
		return metricValue(t, s.URL, `cortado_index_build_remaining_documents{db="b",table="B"}`) == 0
	})
}

// buildLeft sums what cluster status says table's index build has left.
func buildLeft(t *testing.T, base, db, table string) uint64 {
	t.Helper()
	resp, err := http.Get(base + "/_cluster")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Databases []struct {
			Name       string
			Partitions []struct {
				Replicas []struct {
					IndexBuilding map[string]uint64
				}
			}
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	left := uint64(0)
	for _, d := range st.Databases {
		for _, p := range d.Partitions {
			if d.Name == db && len(p.Replicas) > 0 {
				left += p.Replicas[0].IndexBuilding[table]
			}
		}
	}
	return left
}

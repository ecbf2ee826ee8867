package clustertest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cortado-db/cortado/client"
	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/router"
	"github.com/cortado-db/cortado/internal/routing"
	"github.com/cortado-db/cortado/internal/schema"
)

// TestStaleReadsOfManyDocuments kills the master of a collection's
// partition and reads, before the failover ends, what reads of many
// documents read: a collection page, a multi-get (as a page and
// streamed), a query in the collection's group and one over every
// partition. With Cache-Control: max-stale each is answered whole, its
// dead master's partition by a slave, saying so (X-Cortado-Replica,
// Age; the stream's end line); without it each is 503, as it was for
// every read of many documents before.
func TestStaleReadsOfManyDocuments(t *testing.T) {
	const partitions = 4
	c := startCluster(t, 3, partitions, 3)
	key := []schema.KeyPart{{Name: "g"}, {Name: "n", Type: "long"}}
	if _, _, err := c.reg.RegisterVersion(c.ctx, "d", "M", key,
		`{"type":"record","name":"M","fields":[{"name":"v","type":"string","index":"attribute"}]}`); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		c.putPath(fmt.Sprintf("M/g/%d", i), `{"v":"x"}`)
	}
	var ks []string
	for i := range 12 {
		k := fmt.Sprintf("k%d", i)
		c.put(k, k)
		ks = append(ks, k)
	}
	d, _ := c.reg.Database("d")
	before := c.view.Table("d")
	victim := before.Partitions[d.PartitionOf(keys.Part{Str: "g"})].Replicas[0]
	onVictim := 0
	for _, k := range ks {
		if before.Partitions[d.PartitionOf(keys.Part{Str: k})].Replicas[0] == victim {
			onVictim++
		}
	}
	if onVictim == 0 || onVictim == len(ks) {
		t.Fatalf("the multi-get's keys should span the victim's partitions and others: %d of %d on %s", onVictim, len(ks), victim)
	}
	// A key of the victim's, with no document.
	absent := ""
	for i := 0; absent == ""; i++ {
		if k := fmt.Sprintf("absent%d", i); before.Partitions[d.PartitionOf(keys.Part{Str: k})].Replicas[0] == victim {
			absent = k
		}
	}
	multi := "T/(" + strings.Join(ks, ",") + ")"
	reads := []struct{ name, path string }{
		{"collection", "M/g"},
		{"multi-get", multi},
		{"query in the group", "M/g?query=v:x"},
		{"query of every partition", "M?query=v:x"},
	}
	c.nodes[victim].kill()
	killed := time.Now()
	stale := http.Header{"Cache-Control": {"max-stale=30"}}
	for _, r := range reads {
		resp := c.read(r.path, stale)
		if resp.StatusCode != 200 {
			t.Fatalf("%s with max-stale, its master killed: %d %s", r.name, resp.StatusCode, resp.body)
		}
		want := 5
		if r.path == multi {
			want = len(ks)
		}
		var page struct {
			Documents []json.RawMessage
			Replica   string
			Age       *int
		}
		if err := json.Unmarshal([]byte(resp.body), &page); err != nil || len(page.Documents) != want {
			t.Fatalf("%s with max-stale: %d documents, want %d (%v): %s", r.name, len(page.Documents), want, err, resp.body)
		}
		if resp.Header.Get("X-Cortado-Replica") != "slave" || resp.Header.Get("Age") == "" || page.Replica != "slave" || page.Age == nil || fmt.Sprint(*page.Age) != resp.Header.Get("Age") {
			t.Fatalf("%s answered by a slave without saying so: %v %s", r.name, resp.Header, resp.body)
		}
	}
	// A document a slave does not have: 404, saying how stale that may
	// be (the document may have been written within Age).
	if resp := c.read("T/"+absent, stale); resp.StatusCode != 404 || resp.Header.Get("X-Cortado-Replica") != "slave" || resp.Header.Get("Age") == "" {
		t.Fatalf("a missing document with max-stale, its master killed: %d %v %s; want 404 from a slave, with Age", resp.StatusCode, resp.Header, resp.body)
	}
	// An empty collection of the victim's says so as well: its Age is
	// the slave's, not nothing (the master has been silent a while).
	if resp := c.read("M/"+absent, stale); resp.StatusCode != 200 || resp.Header.Get("X-Cortado-Replica") != "slave" || resp.Header.Get("Age") == "0" || resp.Header.Get("Age") == "" ||
		!strings.Contains(resp.body, `"documents":[]`) {
		t.Fatalf("an empty collection with max-stale, its master killed: %d %v %s; want an empty page from a slave, with its Age", resp.StatusCode, resp.Header, resp.body)
	}
	// So does a multi-get a slave answers with no document, as a page
	// and streamed: the keys it reports missing may have been written
	// within its Age.
	if resp := c.read("T/("+absent+")", stale); resp.StatusCode != 200 || resp.Header.Get("X-Cortado-Replica") != "slave" || resp.Header.Get("Age") == "0" || resp.Header.Get("Age") == "" ||
		!strings.Contains(resp.body, `"documents":[]`) || !strings.Contains(resp.body, `"age":`+resp.Header.Get("Age")) {
		t.Fatalf("a multi-get of a missing key with max-stale, its master killed: %d %v %s; want an empty page from a slave, with its Age", resp.StatusCode, resp.Header, resp.body)
	}
	if resp := c.read("T/("+absent+")", http.Header{"Cache-Control": {"max-stale=30"}, "Accept": {"application/x-ndjson"}}); resp.StatusCode != 200 ||
		!strings.Contains(resp.body, `"missingKeys":1,"replica":"slave","age":`) || strings.Contains(resp.body, `"age":0`) {
		t.Fatalf("a streamed multi-get of a missing key with max-stale, its master killed: %d %s; want its end line with the slave's Age", resp.StatusCode, resp.body)
	}
	// The Go client says so too.
	cl := client.New(c.url)
	if doc, err := cl.Get(c.ctx, "d", "T", client.Key{absent}, &client.ReadOptions{MaxStale: 30 * time.Second}); !errors.Is(err, client.ErrNotFound) || doc == nil || doc.FromReplica != "slave" {
		t.Fatalf("the client's Get of a missing document with MaxStale: %v %+v; want ErrNotFound from a slave", err, doc)
	}
	page, err := cl.Collection(c.ctx, "d", "M", client.Key{"g"}, 0, "", &client.ReadOptions{MaxStale: 30 * time.Second})
	if err != nil || len(page.Documents) != 5 || page.Replica != "slave" {
		t.Fatalf("the client's collection with MaxStale: %v %+v", err, page)
	}
	streamed := c.read(multi, http.Header{"Cache-Control": {"max-stale=30"}, "Accept": {"application/x-ndjson"}})
	lines := 0
	var end map[string]any
	sc := bufio.NewScanner(strings.NewReader(streamed.body))
	for sc.Scan() {
		lines++
		if err := json.Unmarshal(sc.Bytes(), &end); err != nil {
			t.Fatalf("streamed multi-get line %q: %v", sc.Text(), err)
		}
	}
	if streamed.StatusCode != 200 || lines != len(ks)+1 || end["end"] != true || end["documents"] != float64(len(ks)) || end["replica"] != "slave" {
		t.Fatalf("streamed multi-get with max-stale: %d, %d lines, end %v", streamed.StatusCode, lines, end)
	}
	for _, r := range reads {
		if resp := c.read(r.path, nil); resp.StatusCode != 503 {
			t.Fatalf("%s without max-stale, its master killed: %d %s", r.name, resp.StatusCode, resp.body)
		}
	}
	if waited := time.Since(killed); waited > time.Second {
		// The lease (2 s) may have lapsed and the failover ended: the
		// reads above may not all have met a partition without master.
		t.Fatalf("the reads took %v: the failover may have ended before them", waited)
	}
}

// TestStaleMultiGetGoesOnAtASlave: a streamed multi-get whose partition
// answers in several parts (documents over the answer's byte bound), its
// master failing after the first part, goes on at a slave from the first
// key not answered: every key once, none twice.
func TestStaleMultiGetGoesOnAtASlave(t *testing.T) {
	c := startCluster(t, 3, 1, 3)
	big := strings.Repeat("x", 600<<10)
	ks := []string{"a", "b", "c"}
	for _, k := range ks {
		c.put(k, big)
	}
	b := &failingAfter{RoutingView: c.view, answers: 1}
	rt := httptest.NewServer(router.New(c.reg, schema.NewPlans(64), b, router.Options{}, slog.New(slog.DiscardHandler)))
	t.Cleanup(rt.Close)
	req, _ := http.NewRequest("GET", rt.URL+"/d/T/(a,b,c)", nil)
	req.Header.Set("Accept", "application/x-ndjson")
	req.Header.Set("Cache-Control", "max-stale=30")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	seen := map[string]int{}
	var end map[string]any
	dec := json.NewDecoder(resp.Body)
	for dec.More() {
		var line map[string]any
		if err := dec.Decode(&line); err != nil {
			t.Fatal(err)
		}
		if k, ok := line["key"].([]any); ok {
			seen[fmt.Sprint(k[0])]++
		} else {
			end = line
		}
	}
	if b.calls.Load() < 2 || len(seen) != 3 || seen["a"] != 1 || seen["b"] != 1 || seen["c"] != 1 || end["documents"] != float64(3) || end["replica"] != "slave" {
		t.Fatalf("%d calls to the master; lines by key %v; end %v", b.calls.Load(), seen, end)
	}
}

// failingAfter is a routing view whose masters answer the first answers
// multi-gets of theirs and then fail as unavailable, as a master that
// dies midway.
type failingAfter struct {
	*routing.RoutingView
	answers int64
	calls   atomic.Int64
}

func (f *failingAfter) Node(db string, part int) (node.Service, error) {
	n, err := f.RoutingView.Node(db, part)
	if err != nil {
		return nil, err
	}
	return failingMaster{n, f}, nil
}

type failingMaster struct {
	node.Service
	f *failingAfter
}

func (m failingMaster) MultiGet(ctx context.Context, req node.MultiGetRequest) (*node.MultiGetResult, error) {
	if m.f.calls.Add(1) > m.f.answers {
		return nil, fmt.Errorf("a master that died midway: %w", node.ErrUnavailable)
	}
	return m.Service.MultiGet(ctx, req)
}

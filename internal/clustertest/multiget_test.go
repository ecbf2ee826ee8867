package clustertest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/cortado-db/cortado/client"
)

// streamLine is a line of a streamed multi-get: a document, a key
// without one, the end, or an error.
type streamLine struct {
	Key               []any
	Missing           bool
	Document          map[string]any
	End               bool
	Documents         int
	MissingKeys       int
	MissingPartitions []int
	Error             map[string]any
}

func parseLines(t *testing.T, body []byte) []streamLine {
	t.Helper()
	var out []streamLine
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		var l streamLine
		d := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		d.UseNumber()
		if err := d.Decode(&l); err != nil {
			t.Fatalf("line %q: %v", sc.Bytes(), err)
		}
		out = append(out, l)
	}
	return out
}

// TestStreamedMultiGet: with Accept: application/x-ndjson a multi-get
// answers one line per key as its partition answers, documents too
// large for one page included, and ends with a line counting them;
// other reads refuse the type, and a bad request is a problem as usual.
func TestStreamedMultiGet(t *testing.T) {
	s := StartServe(t, ServeOptions{})
	h := httpCase{t, s.URL}
	h.want(h.do("PUT", "/_schemata/s", nil, `{"partitions":2}`), 201)
	h.want(h.do("PUT", "/_schemata/s/Big", nil, `{"key":[{"name":"id","type":"long"}],
	  "schema":{"type":"record","name":"Big","fields":[{"name":"v","type":"string"},{"name":"n","type":"int","default":0}]}}`), 201)
	// 40 documents of 300 KB in two partitions: 12 MB, more than a
	// page's 2 MiB and, in each partition, several answers of 1 MiB.
	const n, size = 40, 300_000
	var ids []string
	for i := 1; i <= n; i++ {
		v := fmt.Sprintf("%d-%s", i, strings.Repeat("x", size))
		h.want(h.do("PUT", fmt.Sprintf("/s/Big/%d", i), nil, fmt.Sprintf(`{"v":"%s","n":%d}`, v, i)), 201)
		ids = append(ids, fmt.Sprint(i))
	}
	path := "/s/Big/(" + strings.Join(append(ids, "999"), ",") + ")"
	p := h.problem(h.do("GET", path, nil, ""), 413, "urn:cortado:problem:response-too-large")
	if !strings.Contains(fmt.Sprint(p["detail"]), "application/x-ndjson") {
		t.Fatalf("a multi-get too large for a page does not point to the stream: %v", p)
	}

	ndjson := map[string]string{"Accept": "application/x-ndjson"}
	r := h.want(h.do("GET", path, ndjson, ""), 200)
	if ct := r.header.Get("Content-Type"); ct != "application/x-ndjson" || r.header.Get("Vary") != "Accept" {
		t.Fatalf("content type %q, vary %q", ct, r.header.Get("Vary"))
	}
	lines := parseLines(t, r.body)
	seen := map[string]bool{}
	for i, l := range lines[:len(lines)-1] {
		if len(l.Key) != 1 || l.End || l.Error != nil {
			t.Fatalf("line %d: %+v", i, l)
		}
		id := fmt.Sprint(l.Key[0])
		if seen[id] {
			t.Fatalf("key %s twice", id)
		}
		seen[id] = true
		switch {
		case id == "999":
			if !l.Missing || l.Document != nil {
				t.Fatalf("the absent key's line: %+v", l)
			}
		case l.Missing || !strings.HasPrefix(fmt.Sprint(l.Document["v"]), id+"-") || len(fmt.Sprint(l.Document["v"])) != len(id)+1+size:
			t.Fatalf("key %s: missing %v, document of %d bytes", id, l.Missing, len(fmt.Sprint(l.Document["v"])))
		}
	}
	end := lines[len(lines)-1]
	if len(seen) != n+1 || !end.End || end.Documents != n || end.MissingKeys != 1 || end.MissingPartitions != nil {
		t.Fatalf("%d keys answered (want %d), end %+v", len(seen), n+1, end)
	}

	// A projection; HEAD; the type refused elsewhere; a bad key.
	r = h.want(h.do("GET", "/s/Big/(3,1)?fields=n", ndjson, ""), 200)
	if lines := parseLines(t, r.body); len(lines) != 3 || len(lines[0].Document) != 1 || lines[0].Document["n"] == nil || !lines[2].End {
		t.Fatalf("projected stream: %s", r.body)
	}
	if r := h.want(h.do("HEAD", path, ndjson, ""), 200); len(r.body) != 0 || r.header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("HEAD: %v %q", r.header, r.body)
	}
	h.problem(h.do("GET", "/s/Big/1", ndjson, ""), 406, "urn:cortado:problem:not-acceptable")
	h.problem(h.do("GET", "/s/Big/(1,x)", ndjson, ""), 400, "urn:cortado:problem:invalid-key")
	resp, err := http.Get(s.URL + "/s/Big/(1,2)")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Vary") != "Accept" {
		t.Fatalf("a small page: %d, vary %q", resp.StatusCode, resp.Header.Get("Vary"))
	}
}

// TestLargeDocumentPages: a collection or a query over documents too
// large together for one page answers pages of fewer documents than its
// limit, with a next token, instead of refusing the read (a node holds
// at most half a page's bound for it); following the tokens reads every
// document once, in order — across partitions too, where one
// partition's shortened answer bounds the merged page.
func TestLargeDocumentPages(t *testing.T) {
	s := StartServe(t, ServeOptions{})
	h := httpCase{t, s.URL}
	h.want(h.do("PUT", "/_schemata/s", nil, `{"partitions":2}`), 201)
	h.want(h.do("PUT", "/_schemata/s/Box", nil, `{"key":[{"name":"box","type":"string"},{"name":"id","type":"long"}],
	  "schema":{"type":"record","name":"Box","fields":[{"name":"v","type":"string"},{"name":"tag","type":"string","index":"attribute"}]}}`), 201)
	const size = 300_000
	var all []string
	for b := range 4 {
		for i := range 8 {
			h.want(h.do("PUT", fmt.Sprintf("/s/Box/b%d/%d", b, i), nil, fmt.Sprintf(`{"v":"%s","tag":"x"}`, strings.Repeat("v", size))), 201)
			all = append(all, fmt.Sprintf("b%d/%d", b, i))
		}
	}
	cl := client.New(s.URL)
	defer cl.Close()
	ctx := context.Background()
	read := func(name string, page func(next string) (*client.Page, error)) []string {
		var got []string
		next, pages := "", 0
		for {
			p, err := page(next)
			if err != nil {
				t.Fatalf("%s, page %d: %v", name, pages, err)
			}
			pages++
			for _, d := range p.Documents {
				got = append(got, fmt.Sprintf("%v/%v", d.Key[0], d.Key[1]))
			}
			if next = p.Next; next == "" {
				break
			}
		}
		if pages < 2 {
			t.Fatalf("%s: %d documents of %d KB in one page", name, len(got), size/1000)
		}
		return got
	}
	got := read("collection", func(next string) (*client.Page, error) {
		return cl.Collection(ctx, "s", "Box", client.Key{"b2"}, 100, next, nil)
	})
	if fmt.Sprint(got) != fmt.Sprint(all[16:24]) {
		t.Fatalf("collection b2 read %v", got)
	}
	got = read("query over both partitions", func(next string) (*client.Page, error) {
		return cl.Query(ctx, "s", "Box", nil, client.Query{Where: "tag:x", Limit: 100, Next: next}, nil)
	})
	if fmt.Sprint(got) != fmt.Sprint(all) {
		t.Fatalf("query read %d documents: %v", len(got), got)
	}
}

// TestMultiGetOrder: a multi-get's page lists the documents in the order
// of its keys, across partitions, a key asked twice twice, and the keys
// not found under "missing"; its stream gives one line per key asked.
func TestMultiGetOrder(t *testing.T) {
	s := StartServe(t, ServeOptions{})
	h := httpCase{t, s.URL}
	h.want(h.do("PUT", "/_schemata/o", nil, `{"partitions":4}`), 201)
	h.want(h.do("PUT", "/_schemata/o/T", nil, `{"key":[{"name":"id","type":"long"}],
	  "schema":{"type":"record","name":"T","fields":[{"name":"n","type":"long"}]}}`), 201)
	for i := 1; i <= 8; i++ {
		h.want(h.do("PUT", fmt.Sprintf("/o/T/%d", i), nil, fmt.Sprintf(`{"n":%d}`, i)), 201)
	}
	asked := []int{5, 999, 2, 5, 8, 1, 998, 3, 2, 7}
	var ids []string
	for _, id := range asked {
		ids = append(ids, fmt.Sprint(id))
	}
	path := "/o/T/(" + strings.Join(ids, ",") + ")"
	var page struct {
		Documents []struct {
			Key      []int
			Document struct{ N int }
		}
		Missing [][]int
	}
	if err := json.Unmarshal(h.want(h.do("GET", path, nil, ""), 200).body, &page); err != nil {
		t.Fatal(err)
	}
	var got, missing []int
	for _, it := range page.Documents {
		if it.Key[0] != it.Document.N {
			t.Fatalf("key %v holds document %d", it.Key, it.Document.N)
		}
		got = append(got, it.Key[0])
	}
	for _, k := range page.Missing {
		missing = append(missing, k[0])
	}
	if fmt.Sprint(got) != "[5 2 5 8 1 3 2 7]" || fmt.Sprint(missing) != "[999 998]" {
		t.Fatalf("the page lists %v and misses %v; asked %v", got, missing, asked)
	}
	lines := parseLines(t, h.want(h.do("GET", path, map[string]string{"Accept": "application/x-ndjson"}, ""), 200).body)
	count := map[string]int{}
	for _, l := range lines[:len(lines)-1] {
		id := fmt.Sprint(l.Key[0])
		if l.Missing != (id == "999" || id == "998") || !l.Missing && fmt.Sprint(l.Document["n"]) != id {
			t.Fatalf("line %+v", l)
		}
		count[id]++
	}
	if end := lines[len(lines)-1]; len(lines) != len(asked)+1 || count["5"] != 2 || count["2"] != 2 || end.Documents != 8 || end.MissingKeys != 2 {
		t.Fatalf("%d lines for %d keys, counts %v, end %+v", len(lines), len(asked), count, end)
	}
}

package clustertest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestLargeCollectionDelete: deleting a collection whose documents and
// pre-images would make a commit over storage.MaxCommitBytes is refused
// (409 limit-exceeded, nothing deleted), so the partition's slaves, which
// could never have received such a commit over the wire, still follow
// it: later writes to it are acknowledged. Deleting the collection in
// parts works. Before the bound, the delete of 80,000 documents of 1 KB
// was committed on the master and answered 503 not-replicated, and every
// later write to its partition did the same.
func TestLargeCollectionDelete(t *testing.T) {
	c := startProcCluster(t, 3, 2)
	c.do("PUT", "/_schemata/d/B", `{"key":[{"name":"g"},{"name":"n","type":"long"}],"schema":{"type":"record","name":"B","fields":[{"name":"v","type":"string"}]}}`, 201)
	const docs = 70 // of 1 MiB: over the bound of 40 MiB together, and over a wire message (64 MiB)
	body := `{"v":"` + strings.Repeat("x", 1<<20) + `"}`
	for i := range docs {
		c.do("PUT", fmt.Sprintf("/d/B/g/%d", i), body, 201)
	}
	status, problem := request(t, "DELETE", c.router.URL+"/d/B/g", "")
	if status != 409 || problem["type"] != "urn:cortado:problem:limit-exceeded" {
		t.Fatalf("deleting a collection of %d MiB: %d %v", docs, status, problem)
	}
	// Nothing was deleted, and the partition takes writes, acknowledged
	// by its slaves.
	c.do("GET", "/d/B/g/0", "", 200)
	c.do("PUT", "/d/B/g/1000", `{"v":"after"}`, 201)
	// In parts: a transaction of deletes, then the collection.
	var ops []string
	for i := range docs / 2 {
		ops = append(ops, fmt.Sprintf(`{"op":"delete","table":"B","key":["g",%d]}`, i))
	}
	c.do("POST", "/d/_txn/g", `{"ops":[`+strings.Join(ops, ",")+`]}`, 200)
	status, answer := request(t, "DELETE", c.router.URL+"/d/B/g", "")
	if status != 200 || answer["deleted"] != float64(docs-docs/2+1) {
		t.Fatalf("deleting the rest: %d %v", status, answer)
	}
	c.do("PUT", "/d/B/g/1001", `{"v":"after"}`, 201)
	status, check := request(t, "POST", c.router.URL+"/_cluster/check?db=d", "")
	parts, _ := check["partitions"].([]any)
	if status != 200 || len(parts) != 2 {
		t.Fatalf("consistency check: %d %v", status, check)
	}
	for _, p := range parts {
		replicas, _ := p.(map[string]any)["replicas"].([]any)
		if len(replicas) != 2 {
			t.Fatalf("consistency check of %v: not two slaves", p)
		}
		for _, r := range replicas {
			if r.(map[string]any)["result"] != "equal" {
				t.Fatalf("consistency check of %v", p)
			}
		}
	}
}

// request sends a request and decodes its JSON answer.
func request(t *testing.T, method, url, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	json.Unmarshal(b, &m)
	return resp.StatusCode, m
}

package clustertest

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/cortado-db/cortado/client"
	"github.com/cortado-db/cortado/internal/problem"
)

// TestDatabasesListed: GET /_schemata lists the databases in name order,
// a page at a time (limit, after, and next when more follow), with their
// definitions as created (minInSync and replication included, which the
// Go client now sends); Client.Database describes one with its tables;
// a bad limit, an unknown or repeated parameter and a write are refused
// as problems.
func TestDatabasesListed(t *testing.T) {
	ts, c := demoOverHTTP(t)
	ctx := context.Background()
	for _, name := range []string{"b", "a", "c"} {
		def := client.Database{Partitions: 2}
		if name == "b" {
			def = client.Database{Partitions: 3, Replicas: 1, Replication: "async", MinInSync: 1}
		}
		if err := c.CreateDatabase(ctx, name, def); err != nil {
			t.Fatal(err)
		}
	}
	names := func(l *client.DatabaseList) string {
		var out []string
		for _, d := range l.Databases {
			out = append(out, d.Name)
		}
		return strings.Join(out, ",")
	}
	l, err := c.Databases(ctx, "", 2)
	if err != nil || names(l) != "a,b" || l.Next != "b" {
		t.Fatalf("the first page of 2: %+v, %v; want a,b and next b", l, err)
	}
	if b := l.Databases[1]; b.Partitions != 3 || b.Replication != "async" || b.MinInSync != 1 {
		t.Fatalf("database b as listed: %+v", b)
	}
	if l, err = c.Databases(ctx, l.Next, 2); err != nil || names(l) != "c,demo" || l.Next != "" {
		t.Fatalf("the page after b: %+v, %v; want c,demo and no next", l, err)
	}
	if l, err = c.Databases(ctx, "", 0); err != nil || names(l) != "a,b,c,demo" || l.Next != "" {
		t.Fatalf("every database: %+v, %v", l, err)
	}
	// The Go client changes a database's settings with a merge patch.
	if err := c.AlterDatabase(ctx, "b", client.Database{Retention: &client.Retention{MaxBytes: 4096}}); err != nil {
		t.Fatal(err)
	}
	if err := c.AlterDatabase(ctx, "b", client.Database{Replication: "semi-sync"}); !errors.Is(err, client.ErrConflict) {
		t.Fatalf("changing a database's replication: %v, want a conflict", err)
	}
	if b, err := c.Database(ctx, "b"); err != nil || b.Retention == nil || b.Retention.MaxBytes != 4096 || b.Replication != "async" || b.Partitions != 3 {
		t.Fatalf("database b after its retention changed: %+v, %v", b, err)
	}
	d, err := c.Database(ctx, "demo")
	if err != nil || d.Name != "demo" || len(d.Tables) != 3 || d.Tables[0].Name != "MailboxStats" || d.Tables[0].Latest != 1 {
		t.Fatalf("database demo: %+v, %v", d, err)
	}
	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{"GET", "/_schemata?limit=0", 400},
		{"GET", "/_schemata?limit=10001", 400},
		{"GET", "/_schemata?limit=x", 400},
		{"GET", "/_schemata?next=a", 400},
		{"GET", "/_schemata?after=a&after=b", 400},
		{"PUT", "/_schemata", 405},
		{"DELETE", "/_schemata", 405},
	} {
		req, _ := http.NewRequest(tc.method, ts.URL+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var p problem.Problem
		if resp.StatusCode != tc.status || resp.Header.Get("Content-Type") != problem.ContentType || json.Unmarshal(b, &p) != nil || p.Type != problem.TypeMalformed && p.Type != problem.TypeMethodNotAllowed {
			t.Fatalf("%s %s: %d %s, want %d as a problem", tc.method, tc.path, resp.StatusCode, b, tc.status)
		}
	}
}

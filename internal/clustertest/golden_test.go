package clustertest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/cortado-db/cortado/internal/coord"
	"github.com/cortado-db/cortado/internal/server"
)

// openServer starts every role in this process on free loopback ports,
// trying new ports if another test took them first.
func openServer(t testing.TB) *server.Server {
	t.Helper()
	for attempt := 1; ; attempt++ {
		cu, _ := coord.FreeLoopbackURL()
		pu, _ := coord.FreeLoopbackURL()
		s, err := server.Open(context.Background(), server.Options{DataDir: t.TempDir(), EtcdClientURL: cu, EtcdPeerURL: pu,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil && coord.IsAddrInUse(err) && attempt < 5 {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
}

var lastModified = regexp.MustCompile(`"lastModified":"[^"]*"`)

// TestGoldenResponses replays testdata/responses against a server in this
// process and compares status, the headers that carry meaning, and body
// byte for byte: the read path's output must not drift.
func TestGoldenResponses(t *testing.T) {
	s := openServer(t)
	if err := s.DemoDatabase(context.Background()); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	datadriven.RunTest(t, "testdata/responses", func(t *testing.T, d *datadriven.TestData) string {
		method, path, _ := strings.Cut(d.Cmd+" "+strings.Join(argStrings(d), " "), " ")
		req, err := http.NewRequest(strings.ToUpper(method), ts.URL+path, strings.NewReader(d.Input))
		if err != nil {
			t.Fatal(err)
		}
		if d.Input != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var b strings.Builder
		fmt.Fprintf(&b, "%d\n", resp.StatusCode)
		for _, h := range []string{"Content-Type", "ETag", "X-Cortado-SCN", "X-Cortado-Schema-Version", "Location"} {
			if v := resp.Header.Get(h); v != "" {
				if strings.HasPrefix(v, "W/") {
					v = `W/"…"` // a page's ETag covers its timestamps
				}
				fmt.Fprintf(&b, "%s: %s\n", h, v)
			}
		}
		if len(body) > 0 {
			b.WriteString(lastModified.ReplaceAllString(string(body), `"lastModified":"…"`) + "\n")
		}
		return b.String()
	})
}

func argStrings(d *datadriven.TestData) []string {
	var out []string
	for _, a := range d.CmdArgs {
		out = append(out, a.String())
	}
	return out
}

// TestDemoDatabaseLeavesUsersSchemas: once the demo database exists it is
// the user's. Creating it again (a restart with --demo) must neither fail
// on a table whose schema the user evolved nor register the demo's first
// version on top of the user's latest.
func TestDemoDatabaseLeavesUsersSchemas(t *testing.T) {
	s := openServer(t)
	ctx := context.Background()
	if err := s.DemoDatabase(ctx); err != nil {
		t.Fatal(err)
	}
	// Version 2 adds a field (FULL-compatible) and promotes one: the demo's
	// version 1 text, registered again, would be a compatible version 3
	// without the field, or a refused one.
	v2 := `{"schema":{"type":"record","name":"MailboxStats","namespace":"demo","fields":[
		{"name":"total","type":"long","default":0},{"name":"unread","type":"double","default":0},
		{"name":"flag","type":["null","string"],"default":null}]}}`
	if _, _, err := s.Router.RegisterSchema(ctx, "demo", "MailboxStats", []byte(v2)); err != nil {
		t.Fatal(err)
	}
	if err := s.DemoDatabase(ctx); err != nil {
		t.Fatalf("the demo database again, after the user evolved a table: %v", err)
	}
	info, err := s.Router.TableInfo("demo", "MailboxStats")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(info), `"latest":2,`) {
		t.Fatalf("MailboxStats after the demo database again: %s, want latest version 2 (the user's)", info)
	}
}

// TestServeKeepsItsLayout: a data directory is served only with the
// storage nodes it holds (or more). Started with fewer, serve opened empty
// engines beside the data: a document acknowledged before answered 404.
func TestServeKeepsItsLayout(t *testing.T) {
	open := func(dir string, nodes int) (*server.Server, error) {
		cu, _ := coord.FreeLoopbackURL()
		pu, _ := coord.FreeLoopbackURL()
		return server.Open(context.Background(), server.Options{DataDir: dir, Nodes: nodes, EtcdClientURL: cu, EtcdPeerURL: pu,
			Logger: slog.New(slog.DiscardHandler)})
	}
	for _, tc := range []struct {
		first int
		then  []int // refused
	}{{3, []int{1, 2}}, {1, []int{2, 3}}} {
		dir := t.TempDir()
		s, err := open(dir, tc.first)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		for _, n := range tc.then {
			s, err := open(dir, n)
			if err == nil {
				s.Close()
				t.Fatalf("a directory of %d node(s) opened with %d", tc.first, n)
			}
			if !strings.Contains(err.Error(), "holds the storage of") {
				t.Fatalf("a directory of %d node(s) opened with %d: %v", tc.first, n, err)
			}
		}
		s, err = open(dir, tc.first)
		if err != nil {
			t.Fatalf("the directory of %d node(s) again: %v", tc.first, err)
		}
		s.Close()
	}
}

package clustertest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cortado-db/cortado/internal/coord"
	"github.com/cortado-db/cortado/internal/coord/coordtest"
	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/router"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
)

type oneNode struct{ n node.Service }

func (b oneNode) Node(string, int) (node.Service, error) { return b.n, nil }

// TestPartitionRolesFenceWrites runs a storage node that is not master of
// anything until told: writes to a partition it does not master are 503
// with Retry-After and change nothing; a promotion starts a new
// generation; a demotion stops writes at once; a stale promotion is
// refused.
func TestPartitionRolesFenceWrites(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	etcd := coordtest.Embedded(t)
	cli, err := coord.Connect(ctx, []string{etcd.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	log := slog.New(slog.DiscardHandler)
	reg, err := registry.Open(ctx, cli, registry.Options{Prefix: "/roles", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	eng, err := storage.Open(filepath.Join(dir, "storage"), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	plans := schema.NewPlans(64)
	n := node.New(eng, reg, plans, log, node.Options{})
	ts := httptest.NewServer(router.New(reg, plans, oneNode{n}, router.Options{}, log))
	defer ts.Close()

	if _, _, err := reg.CreateDatabase(ctx, schema.Database{Name: "d", Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := reg.RegisterVersion(ctx, "d", "T", []schema.KeyPart{{Name: "k"}}, `{"type":"record","name":"T","fields":[{"name":"v","type":"int"}]}`); err != nil {
		t.Fatal(err)
	}
	write := func(v string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("PUT", ts.URL+"/d/T/k", strings.NewReader(`{"v":`+v+`}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	want503 := func(what string) {
		t.Helper()
		if r := write("9"); r.StatusCode != 503 || r.Header.Get("Retry-After") == "" {
			t.Fatalf("%s: write answered %d (Retry-After %q)", what, r.StatusCode, r.Header.Get("Retry-After"))
		}
	}

	want503("offline")
	if err := n.SetRole("d", 0, node.Slave, 0, 0); err != nil {
		t.Fatal(err)
	}
	want503("slave")

	if err := n.SetRole("d", 0, node.Master, 2, 0); err != nil {
		t.Fatal(err)
	}
	if r := write("1"); r.StatusCode != 201 || r.Header.Get("X-Cortado-SCN") != "2:2" { // 2:1 opened the generation
		t.Fatalf("master of generation 2: %d, SCN %s", r.StatusCode, r.Header.Get("X-Cortado-SCN"))
	}
	if err := n.SetRole("d", 0, node.Slave, 0, 0); err != nil {
		t.Fatal(err)
	}
	want503("demoted")
	if err := n.SetRole("d", 0, node.Master, 1, 0); err == nil {
		t.Fatal("promotion with a stale generation accepted")
	}
	_, err = n.Write(ctx, node.WriteRequest{DB: "d", Partition: 0, Ops: []node.Op{{Kind: node.OpDelete, Table: "T", Key: []keys.Part{keys.S("k")}}}})
	if !errors.Is(err, node.ErrNotMaster) {
		t.Fatalf("write after a refused promotion: %v", err)
	}
	st, err := n.Status(ctx, node.StatusRequest{DB: "d"})
	if err != nil || len(st) != 1 || st[0].SCN != (storage.SCN{Gen: 2, Seq: 2}) {
		t.Fatalf("the only write is 2:2 (after the marker 2:1): %+v %v", st, err)
	}
	// A replica that is not master in force answers no fresh read.
	if _, err := n.Get(ctx, node.GetRequest{DB: "d", Table: "T", Partition: 0, Key: []keys.Part{keys.S("k")}, Read: node.ReadSpec{Version: 1}}); !errors.Is(err, node.ErrNotMaster) {
		t.Fatalf("a slave answered a fresh read: %v", err)
	}
}

// TestDropOnlyOfflineCopies: a storage node deletes a copy only while it
// is OFFLINE there; then the copy is gone from its engine and its status,
// and a second drop (a later table naming the node again) does nothing.
// A copy the node holds without a role (kept over a restart) shows in its
// status once the agent asks (ShowCopy); a partition it holds nothing of
// does not.
func TestDropOnlyOfflineCopies(t *testing.T) {
	ctx := context.Background()
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: 2})
	n := newStorageNode(t, reg)
	if err := n.SetRole("d", 0, node.Master, 1, 0); err != nil {
		t.Fatal(err)
	}
	k := "k" // a key of partition 0, which write writes to
	for i := 0; partitionOf(t, reg, k) != 0; i++ {
		k = fmt.Sprintf("k%d", i)
	}
	write(t, n, k, "v")
	shown := func() (ids []int) {
		st, err := n.Status(ctx, node.StatusRequest{DB: "d"})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range st {
			ids = append(ids, s.Partition)
		}
		return ids
	}
	for _, role := range []node.Role{node.Master, node.Slave} {
		if err := n.SetRole("d", 0, role, 1, 0); err != nil {
			t.Fatal(err)
		}
		if dropped, err := n.Drop(ctx, "d", 0); err == nil || dropped {
			t.Fatalf("a %s replica was dropped", role)
		}
		if held, _ := n.eng.Holds("d", 0); !held {
			t.Fatalf("a refused drop of a %s replica deleted it", role)
		}
	}
	if err := n.SetRole("d", 0, node.Offline, 0, 0); err != nil {
		t.Fatal(err)
	}
	if got := shown(); len(got) != 1 || got[0] != 0 {
		t.Fatalf("status before the drop lists %v", got)
	}
	if dropped, err := n.Drop(ctx, "d", 0); err != nil || !dropped {
		t.Fatalf("the drop of an offline copy: %v %v", dropped, err)
	}
	if held, err := n.eng.Holds("d", 0); err != nil || held {
		t.Fatalf("after the drop the engine holds the copy: %v %v", held, err)
	}
	if got := shown(); len(got) != 0 {
		t.Fatalf("status after the drop lists %v", got)
	}
	if dropped, err := n.Drop(ctx, "d", 0); err != nil || dropped || len(shown()) != 0 {
		t.Fatalf("a second drop: %v %v, status %v", dropped, err, shown())
	}

	// A copy held without a role: what a restart leaves of a copy.
	n2 := newStorageNode(t, reg)
	if err := n2.SetRole("d", 1, node.Master, 1, 0); err != nil {
		t.Fatal(err)
	}
	kept := n2.eng
	m := node.New(kept, reg, schema.NewPlans(16), slog.New(slog.DiscardHandler), node.Options{})
	for p := range 2 {
		if err := m.ShowCopy("d", p); err != nil {
			t.Fatal(err)
		}
	}
	st, err := m.Status(ctx, node.StatusRequest{DB: "d"})
	if err != nil || len(st) != 1 || st[0].Partition != 1 || st[0].Role != node.Offline || st[0].SCN.IsZero() {
		t.Fatalf("a copy held without a role shows as %+v (%v)", st, err)
	}
}

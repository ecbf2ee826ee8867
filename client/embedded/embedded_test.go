package embedded

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cortado-db/cortado/client"
)

// TestReopenWhenPortsTaken: a directory opened before opens again, with
// its data, when another process has since taken the loopback ports its
// etcd listened on (ephemeral ports are reused). It failed with "address
// already in use" until the ports were free again.
func TestReopenWhenPortsTaken(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	c, err := Open(ctx, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CreateDatabase(ctx, "d", client.Database{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RegisterSchema(ctx, "d", "T", client.TableSchema{Key: []client.KeyPart{{Name: "k"}},
		Schema: []byte(`{"type":"record","name":"T","fields":[{"name":"v","type":"long"}]}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "d", "T", client.Key{"a"}, map[string]int{"v": 7}, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "etcd-urls"))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range strings.Fields(string(b)) {
		l, err := net.Listen("tcp", strings.TrimPrefix(u, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
	}
	c, err = Open(ctx, dir, nil)
	if err != nil {
		t.Fatalf("reopen with its ports taken: %v", err)
	}
	defer c.Close()
	var got struct{ V int }
	if d, err := c.Get(ctx, "d", "T", client.Key{"a"}, nil); err != nil || d.Decode(&got) != nil || got.V != 7 {
		t.Fatalf("the document after reopening on new ports: %v %+v", err, got)
	}
	if _, err := c.Put(ctx, "d", "T", client.Key{"b"}, map[string]int{"v": 8}, nil); err != nil {
		t.Fatalf("a write after reopening on new ports: %v", err)
	}
}

// TestOpenTwiceFails: a directory already open is refused at once, naming
// it. With the ports of a directory found taken it is opened on new ones
// (above), and a second open of a directory in use then waited on etcd's
// lock on its data for good.
func TestOpenTwiceFails(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	c, err := Open(ctx, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() {
		c2, err := Open(ctx, dir, nil)
		if err == nil {
			c2.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "in use") {
			t.Fatalf("a second open of a directory in use: %v, want it refused as in use", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a second open of a directory in use has not returned in 20 s")
	}
}

// TestDatabasesInProcess: an embedded client lists and describes the
// databases as an HTTP one does (the router's answers, in-process).
func TestDatabasesInProcess(t *testing.T) {
	ctx := context.Background()
	c, err := Open(ctx, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, name := range []string{"e", "d"} {
		if err := c.CreateDatabase(ctx, name, client.Database{Partitions: 1, Replication: "async"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.RegisterSchema(ctx, "d", "T", client.TableSchema{Key: []client.KeyPart{{Name: "k"}},
		Schema: []byte(`{"type":"record","name":"T","fields":[{"name":"v","type":"long"}]}`)}); err != nil {
		t.Fatal(err)
	}
	l, err := c.Databases(ctx, "", 1)
	if err != nil || len(l.Databases) != 1 || l.Databases[0].Name != "d" || l.Databases[0].Replication != "async" || l.Next != "d" {
		t.Fatalf("the first database: %+v, %v", l, err)
	}
	if l, err = c.Databases(ctx, l.Next, 1); err != nil || len(l.Databases) != 1 || l.Databases[0].Name != "e" || l.Next != "" {
		t.Fatalf("the databases after d: %+v, %v", l, err)
	}
	if l, err = c.Databases(ctx, "", 0); err != nil || len(l.Databases) != 2 || l.Next != "" {
		t.Fatalf("the databases, a page of the default size: %+v, %v; want both", l, err)
	}
	if d, err := c.Database(ctx, "d"); err != nil || len(d.Tables) != 1 || d.Tables[0].Name != "T" {
		t.Fatalf("database d: %+v, %v", d, err)
	}
	// A database's retention changes; its partitions cannot.
	if err := c.AlterDatabase(ctx, "d", client.Database{Retention: &client.Retention{MaxAge: "72h"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.AlterDatabase(ctx, "d", client.Database{Partitions: 2}); !errors.Is(err, client.ErrConflict) {
		t.Fatalf("changing a database's partitions: %v, want a conflict", err)
	}
	if d, err := c.Database(ctx, "d"); err != nil || d.Retention == nil || d.Retention.MaxAge != "72h0m0s" || d.Partitions != 1 || d.Replication != "async" {
		t.Fatalf("database d after its retention changed: %+v, %v", d, err)
	}
}

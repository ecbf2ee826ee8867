package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/coord/coordtest"
	"github.com/cortado-db/cortado/internal/schema"
)

func open(t *testing.T, cli *clientv3.Client) *Registry {
	t.Helper()
	r, err := Open(context.Background(), cli, Options{Prefix: "/test", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

func schemaText(fields int) string {
	s := `{"type":"record","name":"R","fields":[{"name":"f0","type":"int"}`
	for i := 1; i < fields; i++ {
		s += fmt.Sprintf(`,{"name":"f%d","type":"int","default":%d}`, i, i)
	}
	return s + "]}"
}

// Two registries (two routers) race to register versions of one table: the
// numbers they get are distinct and gap-free, and both end up seeing every
// version through the watch.
func TestConcurrentRegistrarsAgree(t *testing.T) {
	cli := coordtest.Start(t)
	a, b := open(t, cli), open(t, cli)
	ctx := context.Background()
	if _, _, err := a.CreateDatabase(ctx, schema.Database{Name: "db"}); err != nil {
		t.Fatal(err)
	}
	key := []schema.KeyPart{{Name: "id", Type: "string"}}
	if _, _, err := a.RegisterVersion(ctx, "db", "T", key, schemaText(1)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[int]string{}
	for i := 2; i <= 9; i++ {
		r := a
		if i%2 == 0 {
			r = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Every text is compatible with every other (added
			// fields have defaults), so each must get its own number.
			v, _, err := r.RegisterVersion(ctx, "db", "T", nil, schemaText(i))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			got[v] = schemaText(i)
			mu.Unlock()
		}()
	}
	wg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for _, r := range []*Registry{a, b} {
		for {
			tbl, err := r.Table("db", "T")
			if err == nil && len(tbl.Versions) == 9 {
				for v, text := range got {
					if tbl.Version(v).Text != text {
						t.Fatalf("version %d: %s, registered %s", v, tbl.Version(v).Text, text)
					}
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("registry did not converge: %v", tbl)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if len(got) != 8 {
		t.Fatalf("versions handed out: %v", got)
	}
}

func TestDatabaseAndKeyRules(t *testing.T) {
	cli := coordtest.Start(t)
	r := open(t, cli)
	ctx := context.Background()
	if _, created, err := r.CreateDatabase(ctx, schema.Database{Name: "db", Partitions: 8}); err != nil || !created {
		t.Fatal(created, err)
	}
	if _, created, err := r.CreateDatabase(ctx, schema.Database{Name: "db", Partitions: 8}); err != nil || created {
		t.Fatal("same definition again:", created, err)
	}
	if _, _, err := r.CreateDatabase(ctx, schema.Database{Name: "db", Partitions: 9}); !errors.Is(err, ErrDatabaseExists) {
		t.Fatal("other definition:", err)
	}
	var inv *InvalidError
	if _, _, err := r.CreateDatabase(ctx, schema.Database{Name: "db2", Partitions: -1}); !errors.As(err, &inv) {
		t.Fatal("bad partitions:", err)
	}
	key := []schema.KeyPart{{Name: "a"}, {Name: "b", Type: "long", AutoIncrement: true}}
	if _, _, err := r.RegisterVersion(ctx, "db", "T", key, schemaText(1)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.RegisterVersion(ctx, "db", "T", key[:1], schemaText(2)); !errors.Is(err, ErrKeyChanged) {
		t.Fatal("key change:", err)
	}
	if _, _, err := r.RegisterVersion(ctx, "db", "U", []schema.KeyPart{{Name: "a", AutoIncrement: true}}, schemaText(1)); !errors.As(err, &inv) {
		t.Fatal("auto-increment single string key:", err)
	}
	if _, _, err := r.RegisterVersion(ctx, "nodb", "T", key, schemaText(1)); !errors.Is(err, ErrNoDatabase) {
		t.Fatal("missing database:", err)
	}
	// A new registry loads what is stored.
	r2 := open(t, cli)
	if tbl, err := r2.Table("db", "T"); err != nil || len(tbl.Versions) != 1 || !schema.SameKey(tbl.Key, key) {
		t.Fatalf("reload: %+v %v", tbl, err)
	}
}

// TestLimits: the registry refuses a database past its partitions, a
// table past a database's tables, a version past a table's versions and
// past the schema text of all tables, with ErrLimit; what it holds stays as it was, and a repeated creation
// or registration of what it holds is still answered.
func TestLimits(t *testing.T) {
	cli := coordtest.Start(t)
	r := open(t, cli)
	r.limits = Limits{Partitions: 20, Tables: 2, Versions: 3, SchemaTextBytes: 1 << 20}
	ctx := context.Background()
	for _, d := range []schema.Database{{Name: "a", Partitions: 8}, {Name: "b", Partitions: 12}} {
		if _, created, err := r.CreateDatabase(ctx, d); err != nil || !created {
			t.Fatal(d.Name, created, err)
		}
	}
	if _, _, err := r.CreateDatabase(ctx, schema.Database{Name: "c", Partitions: 1}); !errors.Is(err, ErrLimit) {
		t.Fatal("a database past the partitions:", err)
	}
	if _, err := r.Database("c"); !errors.Is(err, ErrNoDatabase) {
		t.Fatal("the refused database exists:", err)
	}
	if _, created, err := r.CreateDatabase(ctx, schema.Database{Name: "b", Partitions: 12}); err != nil || created {
		t.Fatal("the same definition again, at the limit:", created, err)
	}
	key := []schema.KeyPart{{Name: "k"}}
	for _, table := range []string{"T", "U"} {
		if _, _, err := r.RegisterVersion(ctx, "a", table, key, schemaText(1)); err != nil {
			t.Fatal(table, err)
		}
	}
	if _, _, err := r.RegisterVersion(ctx, "a", "V", key, schemaText(1)); !errors.Is(err, ErrLimit) {
		t.Fatal("a table past the tables:", err)
	}
	if _, _, err := r.RegisterVersion(ctx, "b", "V", key, schemaText(1)); err != nil {
		t.Fatal("another database's first table:", err)
	}
	for fields := 2; fields <= 3; fields++ {
		if _, _, err := r.RegisterVersion(ctx, "a", "T", key, schemaText(fields)); err != nil {
			t.Fatal(fields, err)
		}
	}
	if _, _, err := r.RegisterVersion(ctx, "a", "T", key, schemaText(4)); !errors.Is(err, ErrLimit) {
		t.Fatal("a version past the versions:", err)
	}
	if v, created, err := r.RegisterVersion(ctx, "a", "T", key, schemaText(3)); err != nil || created || v != 3 {
		t.Fatal("the latest version again, at the limit:", v, created, err)
	}
	if tbl, _ := r.Table("a", "T"); len(tbl.Versions) != 3 {
		t.Fatalf("%d versions after the refusal, want 3", len(tbl.Versions))
	}

	// The text of all versions together: what is held now, plus one
	// more version of table U, and not a byte more.
	held := r.schemaTextBytes()
	r.limits.SchemaTextBytes = held + len(schemaText(2))
	if _, _, err := r.RegisterVersion(ctx, "a", "U", key, schemaText(2)); err != nil {
		t.Fatal("a version within the text bound:", err)
	}
	if _, _, err := r.RegisterVersion(ctx, "a", "U", key, schemaText(3)); !errors.Is(err, ErrLimit) {
		t.Fatal("a version past the text bound:", err)
	}
	// A registry that loads the same store counts the same text.
	if r2 := open(t, cli); r2.schemaTextBytes() != r.schemaTextBytes() {
		t.Fatalf("a new registry counts %d bytes of schema text, the first %d", r2.schemaTextBytes(), r.schemaTextBytes())
	}
}

// Two registries (two routers) alter one database at once, each adding
// one to its retention's byte limit: no alteration is lost (each is a
// compare-and-swap on the definition's revision, tried again when the
// other came first), both mirrors end with the last, and a mirror never
// goes back to an older definition when the watch passes it on after a
// newer one was applied. Settings that cannot change are refused and
// change nothing.
func TestConcurrentAlterationsAgree(t *testing.T) {
	cli := coordtest.Start(t)
	a, b := open(t, cli), open(t, cli)
	ctx := context.Background()
	if _, _, err := a.CreateDatabase(ctx, schema.Database{Name: "db", Replicas: 3, Retention: schema.Retention{MaxBytes: 1 << 20}}); err != nil {
		t.Fatal(err)
	}
	const each = 10
	var wg sync.WaitGroup
	for _, r := range []*Registry{a, b} {
		wg.Go(func() {
			for range each {
				if _, err := r.AlterDatabase(ctx, "db", func(d *schema.Database) error {
					d.Retention.MaxBytes++
					return nil
				}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	want := int64(1<<20 + 2*each)
	deadline := time.Now().Add(5 * time.Second)
	for _, r := range []*Registry{a, b} {
		for {
			d, err := r.Database("db")
			if err != nil {
				t.Fatal(err)
			}
			if d.Retention.MaxBytes == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("a mirror holds maxBytes %d, want %d", d.Retention.MaxBytes, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// The watch passing on an older definition keeps the newer one.
	resp, err := cli.Get(ctx, a.dbKey("db"))
	if err != nil {
		t.Fatal(err)
	}
	older := []byte(`{"name":"db","partitioning":"hash","partitions":64,"replicas":3,"replication":"semi-sync","minInSync":2,"retention":{"maxBytes":1048576}}`)
	if err := a.apply(a.dbKey("db"), older, resp.Kvs[0].ModRevision-1); err != nil {
		t.Fatal(err)
	}
	if d, _ := a.Database("db"); d.Retention.MaxBytes != want {
		t.Fatalf("an older definition applied after a newer one: maxBytes %d, want %d", d.Retention.MaxBytes, want)
	}
	for name, change := range map[string]func(*schema.Database){
		"partitions":  func(d *schema.Database) { d.Partitions = 8 },
		"replication": func(d *schema.Database) { d.Replication = "async" },
		"minInSync":   func(d *schema.Database) { d.MinInSync = 1 }, // lowered
	} {
		if _, err := a.AlterDatabase(ctx, "db", func(d *schema.Database) error { change(d); d.Replicas = 4; return nil }); !errors.Is(err, ErrFixed) {
			t.Fatalf("changing %s (and replicas): %v, want ErrFixed", name, err)
		}
	}
	if d, _ := a.Database("db"); d.Replicas != 3 || d.Partitions != 64 || d.Replication != "semi-sync" || d.InSync() != 2 {
		t.Fatalf("refused alterations changed the definition: %+v", d)
	}
	if _, err := a.AlterDatabase(ctx, "nodb", func(*schema.Database) error { return nil }); !errors.Is(err, ErrNoDatabase) {
		t.Fatalf("altering a database that does not exist: %v", err)
	}
	// A raise of minInSync keeps the value of before for failovers
	// until it is settled; another raise meanwhile keeps the least.
	raise := func(k int) *schema.Database {
		t.Helper()
		d, err := a.AlterDatabase(ctx, "db", func(d *schema.Database) error { d.Replicas, d.MinInSync = 5, k; return nil })
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := raise(3); d.InSync() != 3 || d.FailoverInSync != 2 || d.FailoverQuorum() != 2 {
		t.Fatalf("minInSync raised from 2 to 3: %+v, want failovers to count by 2", d)
	}
	if d := raise(4); d.InSync() != 4 || d.FailoverQuorum() != 2 {
		t.Fatalf("minInSync raised again to 4 before the first raise settled: %+v, want failovers to count by 2", d)
	}
	if err := a.SettleInSync(ctx, "db", 3); err != nil { // a settle of a value no longer asked leaves it
		t.Fatal(err)
	}
	if d, _ := a.Database("db"); d.FailoverQuorum() != 2 {
		t.Fatalf("a settle of 3 after a raise to 4: %+v", d)
	}
	if err := a.SettleInSync(ctx, "db", 4); err != nil {
		t.Fatal(err)
	}
	if d, _ := a.Database("db"); d.FailoverInSync != 0 || d.FailoverQuorum() != 4 {
		t.Fatalf("after the raise to 4 settled: %+v", d)
	}
}

package clustertest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cortado-db/cortado/client"
)

// TestRegistryLimitFlags: the registry's bounds come from serve's flags,
// and what they refuse is a 409 limit-exceeded that changes nothing: a
// second table past --max-tables 1, and a version whose text would pass
// --max-schema-text-bytes.
func TestRegistryLimitFlags(t *testing.T) {
	s := StartServe(t, ServeOptions{Args: []string{"--max-tables", "1", "--max-schema-text-bytes", "4096", "--max-partitions", "8"}})
	cl := client.New(s.URL)
	defer cl.Close()
	ctx := t.Context()
	if err := cl.CreateDatabase(ctx, "d", client.Database{Partitions: 8}); err != nil {
		t.Fatal(err)
	}
	if err := cl.CreateDatabase(ctx, "e", client.Database{Partitions: 1}); !errors.Is(err, client.ErrLimitExceeded) {
		t.Fatalf("a database past --max-partitions: %v", err)
	}
	table := func(fields int) client.TableSchema {
		var fs []string
		for i := range fields {
			fs = append(fs, fmt.Sprintf(`{"name":"field%04d","type":"long","default":0}`, i))
		}
		return client.TableSchema{Key: []client.KeyPart{{Name: "id", Type: "long"}},
			Schema: json.RawMessage(`{"type":"record","name":"R","fields":[` + strings.Join(fs, ",") + `]}`)}
	}
	if _, err := cl.RegisterSchema(ctx, "d", "T", table(1)); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.RegisterSchema(ctx, "d", "U", table(1)); !errors.Is(err, client.ErrLimitExceeded) {
		t.Fatalf("a table past --max-tables: %v", err)
	}
	// About 45 bytes a field: 21 fields and 20 are within 4,096 bytes,
	// a third version of 100 is not.
	if _, err := cl.RegisterSchema(ctx, "d", "T", table(20)); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.RegisterSchema(ctx, "d", "T", table(100)); !errors.Is(err, client.ErrLimitExceeded) {
		t.Fatalf("a version past --max-schema-text-bytes: %v", err)
	}
	info, err := cl.Table(ctx, "d", "T")
	if err != nil {
		t.Fatal(err)
	}
	if info.Latest != 2 {
		t.Fatalf("latest version %d after the refusals, want 2", info.Latest)
	}
	if _, err := cl.Table(ctx, "d", "U"); err == nil {
		t.Fatal("the refused table exists")
	}
}

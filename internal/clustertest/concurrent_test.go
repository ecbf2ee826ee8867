package clustertest

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/cortado-db/cortado/client"
	"github.com/cortado-db/cortado/client/embedded"
)

// TestConcurrentIncrements runs many concurrent PATCH increments on one
// document and many inserts into one collection through the embedded
// client: every increment counts exactly once and auto-increment keys are
// unique (read-modify-write is atomic per partition).
func TestConcurrentIncrements(t *testing.T) {
	ctx := context.Background()
	c, err := embedded.Open(ctx, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.CreateDatabase(ctx, "d", client.Database{Partitions: 4}); err != nil {
		t.Fatal(err)
	}
	for name, def := range map[string]string{
		"C": `{"key":[{"name":"id"}],"schema":{"type":"record","name":"C","fields":[{"name":"n","type":"long","default":0}]}}`,
		"M": `{"key":[{"name":"box"},{"name":"id","type":"long","autoIncrement":true}],"schema":{"type":"record","name":"M","fields":[{"name":"w","type":"int"}]}}`,
	} {
		var ts client.TableSchema
		json.Unmarshal([]byte(def), &ts)
		if _, err := c.RegisterSchema(ctx, "d", name, ts); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Put(ctx, "d", "C", client.Key{"x"}, map[string]any{}, nil); err != nil {
		t.Fatal(err)
	}
	const workers, each = 8, 25
	var wg sync.WaitGroup
	var mu sync.Mutex
	ids := map[int64]bool{}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if _, err := c.Patch(ctx, "d", "C", client.Key{"x"}, client.Patch{Increment: map[string]any{"n": 1}}, nil); err != nil {
					t.Error(err)
					return
				}
				r, err := c.Insert(ctx, "d", "M", client.Key{"box"}, map[string]any{"w": w})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ids[r.Key[1].(int64)] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	d, err := c.Get(ctx, "d", "C", client.Key{"x"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var v struct{ N int }
	d.Decode(&v)
	if v.N != workers*each {
		t.Fatalf("counter = %d, want %d", v.N, workers*each)
	}
	if len(ids) != workers*each {
		t.Fatalf("%d distinct auto-increment keys for %d inserts", len(ids), workers*each)
	}
	for i := int64(1); i <= workers*each; i++ {
		if !ids[i] {
			t.Fatalf("auto-increment key %d missing: keys are not 1..%d", i, workers*each)
		}
	}
}

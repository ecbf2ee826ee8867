package clustertest

import (
	"context"
	"encoding/json"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cortado-db/cortado/client"
	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
)

type acked struct {
	etag string
	scn  storage.SCN
}

// TestCrashRecovery kills `cortado serve` with SIGKILL in the middle of a
// concurrent write loop, restarts it on the same data directory, and checks
// that every acknowledged write is there, that SCNs continue after the
// last acknowledged one, and that each partition's commit log is one
// gap-free sequence containing every acknowledged write.
func TestCrashRecovery(t *testing.T) {
	const partitions = 8
	s := StartServe(t, ServeOptions{})
	ctx := context.Background()
	c := client.New(s.URL)
	if err := c.CreateDatabase(ctx, "crash", client.Database{Partitions: partitions}); err != nil {
		t.Fatal(err)
	}
	def := client.TableSchema{Key: []client.KeyPart{{Name: "id", Type: "long"}},
		Schema: json.RawMessage(`{"type":"record","name":"T","fields":[{"name":"writer","type":"int"},{"name":"seq","type":"long"}]}`)}
	if _, err := c.RegisterSchema(ctx, "crash", "T", def); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	ack := map[int64]acked{}
	enough := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int64(0); ; i++ {
				id := int64(w)*1_000_000 + i
				res, err := c.Put(ctx, "crash", "T", client.Key{id}, map[string]any{"writer": w, "seq": i}, nil)
				if err != nil {
					return // the server is gone
				}
				scn, err := storage.ParseSCN(res.SCN)
				if err != nil {
					t.Errorf("bad SCN %q", res.SCN)
					return
				}
				mu.Lock()
				ack[id] = acked{res.ETag, scn}
				if len(ack) >= 400 {
					once.Do(func() { close(enough) })
				}
				mu.Unlock()
			}
		}()
	}
	select {
	case <-enough:
	case <-time.After(2 * time.Minute):
		t.Fatal("writers too slow")
	}
	s.Kill() // writers are mid-request
	wg.Wait()
	c.Close()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d writes acknowledged before SIGKILL", len(ack))

	db := &schema.Database{Partitions: partitions}
	maxSeq := make([]uint64, partitions)
	type position struct {
		partition int
		scn       storage.SCN
	}
	seen := map[position]int64{}
	for id, a := range ack {
		p := db.PartitionOf(keys.I(id))
		if prev, dup := seen[position{p, a.scn}]; dup {
			t.Fatalf("keys %d and %d acknowledged with the same SCN %s in partition %d", prev, id, a.scn, p)
		}
		seen[position{p, a.scn}] = id
		maxSeq[p] = max(maxSeq[p], a.scn.Seq)
	}

	s.Restart()
	c = client.New(s.URL)
	defer c.Close()
	for id, a := range ack {
		d, err := c.Get(ctx, "crash", "T", client.Key{id}, nil)
		if err != nil {
			t.Fatalf("acknowledged write %d lost: %v", id, err)
		}
		if d.ETag != a.etag || d.SCN != a.scn.String() {
			t.Fatalf("key %d: read etag %s scn %s, acknowledged %s %s", id, d.ETag, d.SCN, a.etag, a.scn)
		}
	}
	// New commits continue each partition's timeline.
	for id := int64(9_000_000); id < 9_000_000+4*partitions; id++ {
		res, err := c.Put(ctx, "crash", "T", client.Key{id}, map[string]any{"writer": 9, "seq": id}, nil)
		if err != nil {
			t.Fatal(err)
		}
		scn, _ := storage.ParseSCN(res.SCN)
		if p := db.PartitionOf(keys.I(id)); scn.Seq <= maxSeq[p] || scn.Gen != 1 {
			t.Fatalf("partition %d: new write got SCN %s, last acknowledged was 1:%d", p, scn, maxSeq[p])
		}
	}
	s.Stop()

	// White-box: each partition's log is 1, 2, …, N with no gap, and
	// holds every acknowledged write at its SCN.
	eng, err := storage.Open(filepath.Join(s.Dir, "storage"), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	logged := map[string]storage.SCN{}
	for p := range partitions {
		part, err := eng.Partition("crash", p)
		if err != nil {
			t.Fatal(err)
		}
		next := uint64(1)
		err = part.ReadLog(storage.SCN{}, func(cm storage.Commit) bool {
			if cm.SCN != (storage.SCN{Gen: 1, Seq: next}) {
				t.Errorf("partition %d: log has %s where 1:%d belongs", p, cm.SCN, next)
				return false
			}
			for _, e := range cm.Events {
				logged[string(e.Key)] = cm.SCN
			}
			next++
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
		if part.SCN().Seq != next-1 {
			t.Errorf("partition %d: SCN %s but log ends at %d", p, part.SCN(), next-1)
		}
	}
	for id, a := range ack {
		if got, ok := logged[string(keys.Encode([]keys.Part{keys.I(id)}))]; !ok || got != a.scn {
			t.Fatalf("key %d acknowledged at %s, commit log has %v (present %v)", id, a.scn, got, ok)
		}
	}
}

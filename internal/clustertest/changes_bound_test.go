package clustertest

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/changes"
	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/schema"
)

// holdingSources serves a stream's partitions from a real node and
// counts the partitions holding a log answer: from the answer until the
// partition's reader asks for the next.
type holdingSources struct {
	n *node.Node

	mu       sync.Mutex
	holding  map[int]bool
	peak     int
	maxBytes map[int]bool // the MaxBytes the requests carried
	asked    atomic.Int64
}

func (s *holdingSources) Log(_ string, part int) (node.LogSource, error) {
	return holdingLog{s, part}, nil
}

func (s *holdingSources) Snapshot(string, int) (node.Snapshotter, error) { return s.n, nil }

type holdingLog struct {
	s    *holdingSources
	part int
}

func (l holdingLog) Log(ctx context.Context, req node.LogRequest) (*node.LogResult, error) {
	s := l.s
	s.asked.Add(1)
	s.mu.Lock()
	delete(s.holding, l.part) // done with the previous answer
	s.maxBytes[req.MaxBytes] = true
	s.mu.Unlock()
	res, err := s.n.Log(ctx, req)
	if err == nil && len(res.Commits) > 0 {
		s.mu.Lock()
		s.holding[l.part] = true
		s.peak = max(s.peak, len(s.holding))
		s.mu.Unlock()
	}
	return res, err
}

// TestStreamBacklogBound: a change stream whose consumer does not read,
// over a backlog in every partition, has at most four partitions holding
// a log answer, each asked for the stream's bound shared out; once the
// consumer reads, every event arrives.
func TestStreamBacklogBound(t *testing.T) {
	const partitions, streamBytes = 16, 64 << 10
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: partitions})
	n := newStorageNodeWith(t, reg, node.Options{AllMaster: true})
	// 10 KB documents, at least three in each partition: each
	// partition's first answer (16 KiB asked) comes full.
	doc := strings.Repeat("x", 10_000)
	value := append(binary.AppendVarint(nil, int64(len(doc))), doc...) // Avro string
	per := map[int]int{}
	written := 0
	for i := 0; len(per) < partitions || minCount(per) < 3; i++ {
		k := fmt.Sprintf("k%d", i)
		p := partitionOf(t, reg, k)
		if _, err := n.Write(context.Background(), node.WriteRequest{DB: "d", Partition: p, Ops: []node.Op{{Kind: node.OpPut, Table: "T", Key: []keys.Part{keys.S(k)}, Version: 1, Value: value}}}); err != nil {
			t.Fatal(err)
		}
		per[p]++
		written++
	}
	src := &holdingSources{n: n.Node, holding: map[int]bool{}, maxBytes: map[int]bool{}}
	feed := &changes.Feed{Reg: reg, Plans: schema.NewPlans(64), Sources: src, Logger: slog.New(slog.DiscardHandler), StreamBytes: streamBytes}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := feed.Open(ctx, changes.Request{DB: "d", Since: changes.SinceBeginning})
	if err != nil {
		t.Fatal(err)
	}
	reading := make(chan struct{}) // closed when the consumer starts reading
	var events atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		stream.Run(ctx, func(e changes.Event) error {
			<-reading
			if e.Kind == "change" {
				events.Add(1)
			}
			return nil
		}, func() error { return nil })
	}()
	// Not reading: the readers fill the stream's bound and wait.
	await(t, 10*time.Second, "the stream's readers to ask", func() bool { return src.asked.Load() >= 4 })
	src.mu.Lock()
	peak := src.peak
	src.mu.Unlock()
	if peak > 4 {
		t.Fatalf("%d partitions held a log answer at once while the consumer did not read, want 4 at most", peak)
	}
	close(reading)
	await(t, 30*time.Second, "every event", func() bool { return events.Load() >= int64(written) })
	cancel()
	<-done
	src.mu.Lock()
	defer src.mu.Unlock()
	if src.peak > 4 {
		t.Fatalf("%d partitions held a log answer at once, want 4 at most", src.peak)
	}
	if !src.maxBytes[16<<10] || src.maxBytes[0] {
		t.Fatalf("log requests asked for %v bytes, want the stream's 64 KiB shared out (16 KiB, the floor)", src.maxBytes)
	}
}

func minCount(m map[int]int) int {
	least := -1
	for _, n := range m {
		if least < 0 || n < least {
			least = n
		}
	}
	return least
}

package clustertest

import (
	"context"
	"encoding/binary"
	"encoding/json"
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
// counts the log answers in a reader's hands: from the answer until the
// reader is done with it (it takes the next, or lets the stream go).
type holdingSources struct {
	n *node.Node

	mu       sync.Mutex
	holding  int
	peak     int
	maxBytes map[int]bool // the MaxBytes the requests carried
	asked    atomic.Int64
}

func (s *holdingSources) Log(_ string, part int) (node.LogSource, error) {
	return holdingLog{s, part}, nil
}

func (s *holdingSources) Snapshot(string, int) (node.Snapshotter, error) { return s.n, nil }

func (s *holdingSources) hold(n int) {
	s.mu.Lock()
	s.holding += n
	s.peak = max(s.peak, s.holding)
	s.mu.Unlock()
}

func (s *holdingSources) held() (now, peak int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holding, s.peak
}

type holdingLog struct {
	s    *holdingSources
	part int
}

func (l holdingLog) Log(ctx context.Context, req node.LogRequest) (*node.LogResult, error) {
	return l.s.n.Log(ctx, req)
}

// StreamLog streams as a node's stream does, by successive polls,
// counting each answer with commits while the reader has it.
func (l holdingLog) StreamLog(ctx context.Context, req node.LogRequest, fn func(*node.LogResult) error) error {
	s := l.s
	for ctx.Err() == nil {
		s.asked.Add(1)
		s.mu.Lock()
		s.maxBytes[req.MaxBytes] = true
		s.mu.Unlock()
		res, err := s.n.Log(ctx, req)
		if err != nil {
			return err
		}
		holds := len(res.Commits) > 0
		if holds {
			s.hold(1)
		}
		err = fn(res)
		if holds {
			s.hold(-1)
		}
		if err != nil || res.Diverged || res.Trimmed {
			return err
		}
		if n := len(res.Commits); n > 0 {
			req.After = res.Commits[n-1].SCN
		}
		req.Wait = 200 * time.Millisecond
	}
	return ctx.Err()
}

// TestStreamBacklogBound: a change stream whose consumer does not read,
// over a backlog in every partition, holds no log answer (its readers
// let an answer go when the stream has no room, and ask again when it
// has), so it holds none of the feed's backlog slots: another stream
// reads the whole backlog meanwhile. Once the first consumer reads, it gets every
// event once, in transactions whose boundaries and numbering are whole
// though its readers gave up answers inside them.
func TestStreamBacklogBound(t *testing.T) {
	const partitions, streamBytes, perCommit = 16, 64 << 10, 3
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: partitions})
	n := newStorageNodeWith(t, reg, node.Options{AllMaster: true})
	// 10 KB documents, three commits of three in each partition: each
	// partition's first answer (16 KiB asked) comes full, and the
	// stream's 64 KiB holds six events, so readers stop inside commits.
	doc := strings.Repeat("x", 10_000)
	value := append(binary.AppendVarint(nil, int64(len(doc))), doc...) // Avro string
	pending := map[int][]node.Op{}
	commits := map[int]int{}
	written := 0
	for i := 0; minCount(commits) < 3 || len(commits) < partitions; i++ {
		k := fmt.Sprintf("k%d", i)
		p := partitionOf(t, reg, k)
		if commits[p] == 3 {
			continue
		}
		pending[p] = append(pending[p], node.Op{Kind: node.OpPut, Table: "T", Key: []keys.Part{keys.S(k)}, Version: 1, Value: value})
		if len(pending[p]) < perCommit {
			continue
		}
		if _, err := n.Write(context.Background(), node.WriteRequest{DB: "d", Partition: p, Ops: pending[p]}); err != nil {
			t.Fatal(err)
		}
		pending[p] = nil
		commits[p]++
		written += perCommit
	}
	src := &holdingSources{n: n.Node, maxBytes: map[int]bool{}}
	feed := &changes.Feed{Reg: reg, Plans: schema.NewPlans(64), Sources: src, Logger: slog.New(slog.DiscardHandler),
		StreamBytes: streamBytes, BacklogReaders: 2}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	run := func(req changes.Request, emit func(changes.Event) error) chan struct{} {
		stream, err := feed.Open(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			stream.Run(ctx, emit, func() error { return nil })
		}()
		return done
	}

	// The first stream's consumer reads one event, then stops.
	reading := make(chan struct{}) // closed when it reads on
	var mu sync.Mutex
	var got []map[string]any
	stalled := run(changes.Request{DB: "d", Since: changes.SinceBeginning, Transactions: true}, func(e changes.Event) error {
		var m map[string]any
		if err := json.Unmarshal(e.JSON, &m); err != nil {
			return err
		}
		mu.Lock()
		got = append(got, m)
		first := len(got) == 1
		mu.Unlock()
		if !first {
			<-reading
		}
		return nil
	})
	await(t, 10*time.Second, "the stalled stream's readers to ask", func() bool { return src.asked.Load() >= partitions })
	await(t, 10*time.Second, "the stalled stream's readers to let their answers go", func() bool {
		now, _ := src.held()
		return now == 0
	})
	// Counted (cortado_change_stream_answers_let_go_total): every
	// partition's reader but the one whose event is in the queue.
	if n := feed.AnswersLetGo(); n < partitions-1 {
		t.Fatalf("%d answers counted as let go, want %d at least", n, partitions-1)
	}

	// Another stream reads the whole backlog meanwhile.
	var events atomic.Int64
	other := run(changes.Request{DB: "d", Since: changes.SinceBeginning}, func(e changes.Event) error {
		if e.Kind == "change" {
			events.Add(1)
		}
		return nil
	})
	await(t, 30*time.Second, "the other stream's every event", func() bool { return events.Load() >= int64(written) })
	// A first answer is read under one of the feed's two slots, the ones
	// after it under one of its stream's four catch-up slots.
	if _, peak := src.held(); peak > 2*4 {
		t.Fatalf("%d log answers in readers' hands at once, want the two streams' four catch-up slots at most", peak)
	}

	close(reading)
	await(t, 30*time.Second, "the stalled stream's every event", func() bool {
		mu.Lock()
		defer mu.Unlock()
		c := 0
		for _, m := range got {
			if m["type"] == "change" {
				c++
			}
		}
		return c >= written
	})
	cancel()
	<-stalled
	<-other
	if !src.maxBytes[16<<10] || src.maxBytes[0] {
		t.Fatalf("log requests asked for %v bytes, want the stream's 64 KiB shared out (16 KiB, the floor)", src.maxBytes)
	}
	// Per partition: BEGIN, three changes numbered 1 to 3, END counting
	// three; every key once.
	mu.Lock()
	defer mu.Unlock()
	keysSeen := map[string]bool{}
	type txState struct {
		open  bool
		count int
	}
	state := map[string]*txState{} // by transaction id
	for _, m := range got {
		switch m["type"] {
		case "transaction":
			id := m["id"].(string)
			st := state[id]
			switch m["status"] {
			case "BEGIN":
				if st != nil {
					t.Fatalf("transaction %s began twice", id)
				}
				state[id] = &txState{open: true}
			case "END":
				if st == nil || !st.open || st.count != perCommit || m["event_count"].(float64) != perCommit {
					t.Fatalf("transaction %s ended as %+v, with event_count %v; want %d events after its BEGIN", id, st, m["event_count"], perCommit)
				}
				st.open = false
			}
		case "change":
			tx := m["transaction"].(map[string]any)
			id := tx["id"].(string)
			st := state[id]
			if st == nil || !st.open {
				t.Fatalf("a change of transaction %s outside its BEGIN and END", id)
			}
			st.count++
			if tx["total_order"].(float64) != float64(st.count) {
				t.Fatalf("transaction %s: event %d numbered %v", id, st.count, tx["total_order"])
			}
			key := fmt.Sprint(m["source"].(map[string]any)["key"])
			if keysSeen[key] {
				t.Fatalf("key %s delivered twice", key)
			}
			keysSeen[key] = true
		}
	}
	if len(keysSeen) != written {
		t.Fatalf("%d keys delivered, want %d", len(keysSeen), written)
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

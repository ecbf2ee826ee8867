package node

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/storage"
)

// askedMaster answers relay watches' questions with its head.
type askedMaster struct {
	mu   sync.Mutex
	head storage.SCN
	asks int
}

func (m *askedMaster) Ack(_ context.Context, req AckRequest) (*AckResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if req.Replica != "" {
		panic("a relay watch's question acknowledged something")
	}
	m.asks++
	return &AckResult{Head: m.head}, nil
}

func (m *askedMaster) state() (storage.SCN, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.head, m.asks
}

// A relay's reader leaves it (behind) only when the stream has been
// silent for relayDoubt and the master holds a newer commit; it asks at
// most once a relayDoubt, never while answers come.
func TestWatchRelay(t *testing.T) {
	ctx := context.Background()
	have := storage.SCN{Gen: 1, Seq: 5}
	at := func() storage.SCN { return have }

	// Answers keep coming: the master is never asked.
	talking := &askedMaster{head: storage.SCN{Gen: 1, Seq: 9}}
	q := NewQuietness()
	watched, stop := WatchRelay(ctx, talking, "d", 0, at, q)
	for range 25 {
		time.Sleep(100 * time.Millisecond) // a relay answering every 100 ms
		q.Handling()
		q.Heard()
	}
	if err := context.Cause(watched); err != nil {
		t.Errorf("left a relay that answers: %v", err)
	}
	stop()
	if _, asks := talking.state(); asks != 0 {
		t.Fatalf("asked the master %d times while the relay answered", asks)
	}

	// Silent, the master no further: asked, and the reader stays.
	m := &askedMaster{head: have}
	watched, stop = WatchRelay(ctx, m, "d", 0, at, NewQuietness())
	defer stop()
	deadline := time.Now().Add(10 * time.Second)
	for _, asks := m.state(); asks == 0; _, asks = m.state() {
		if time.Now().After(deadline) {
			t.Fatal("a silent relay's reader never asked the master")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := context.Cause(watched); err != nil {
		t.Fatalf("left the relay while the master held nothing newer: %v", err)
	}
	// The master moves on: the next question finds it ahead.
	m.mu.Lock()
	m.head = storage.SCN{Gen: 1, Seq: 6}
	m.mu.Unlock()
	start := time.Now()
	select {
	case <-watched.Done():
		if err := context.Cause(watched); !errors.Is(err, ErrRelayBehind) {
			t.Fatalf("the watched stream ended with %v, want ErrRelayBehind", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("stayed on a silent relay while the master moved on")
	}
	_, asks := m.state()
	if elapsed := time.Since(start); asks != 2 {
		t.Fatalf("asked %d times (the second %v after the master moved on), want 2: at most once a %v", asks, elapsed, relayDoubt)
	}
}

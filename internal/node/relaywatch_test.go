package node

import (
	"context"
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
	stop := WatchRelay(ctx, talking, "d", 0, at, q, func() { t.Error("left a relay that answers") })
	for range 25 {
		time.Sleep(100 * time.Millisecond) // a relay answering every 100 ms
		q.Handling()
		q.Heard()
	}
	stop()
	if _, asks := talking.state(); asks != 0 {
		t.Fatalf("asked the master %d times while the relay answered", asks)
	}

	// Silent, the master no further: asked, and the reader stays.
	m := &askedMaster{head: have}
	behind := make(chan struct{}, 1)
	stop = WatchRelay(ctx, m, "d", 0, at, NewQuietness(), func() { behind <- struct{}{} })
	defer stop()
	deadline := time.Now().Add(10 * time.Second)
	for _, asks := m.state(); asks == 0; _, asks = m.state() {
		if time.Now().After(deadline) {
			t.Fatal("a silent relay's reader never asked the master")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-behind:
		t.Fatal("left the relay while the master held nothing newer")
	default:
	}
	// The master moves on: the next question finds it ahead.
	m.mu.Lock()
	m.head = storage.SCN{Gen: 1, Seq: 6}
	m.mu.Unlock()
	start := time.Now()
	select {
	case <-behind:
	case <-time.After(10 * time.Second):
		t.Fatal("stayed on a silent relay while the master moved on")
	}
	_, asks := m.state()
	if elapsed := time.Since(start); asks != 2 {
		t.Fatalf("asked %d times (the second %v after the master moved on), want 2: at most once a %v", asks, elapsed, relayDoubt)
	}
}

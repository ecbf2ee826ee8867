package changes

import (
	"context"
	"testing"
	"time"
)

// TestBudget: takes beyond the bound wait for a release, one larger than
// the bound passes alone, and a wait ends with its context.
func TestBudget(t *testing.T) {
	b := newBudget(100)
	ctx := context.Background()
	if !b.take(ctx, 60) || !b.take(ctx, 40) {
		t.Fatal("takes within the bound waited")
	}
	took := make(chan bool)
	go func() { took <- b.take(ctx, 10) }()
	select {
	case <-took:
		t.Fatal("a take beyond the bound did not wait")
	case <-time.After(50 * time.Millisecond):
	}
	b.release(60)
	if !<-took {
		t.Fatal("the waiting take failed after a release")
	}
	b.release(40)
	b.release(10)
	if !b.take(ctx, 1000) {
		t.Fatal("an event larger than the bound did not pass alone")
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if b.take(short, 1) {
		t.Fatal("a take past the bound succeeded while a larger one is held")
	}
}

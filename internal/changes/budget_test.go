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

// TestBudgetRoom: room reserved counts against the bound until an event
// takes it or it is given back; a swap takes an event in place of room
// only if it fits, and leaves the room reserved if not.
func TestBudgetRoom(t *testing.T) {
	ctx := context.Background()
	b := newBudget(100)
	if !b.take(ctx, 60) { // room reserved by one reader
		t.Fatal("a reservation within the bound waited")
	}
	if b.tryTake(50) {
		t.Fatal("an event took room another reader reserved")
	}
	// The reader's first event took 30 of its room: 30 left.
	if b.swap(30, 80) {
		t.Fatal("a swap took 80 with 30 held by an event and 30 reserved")
	}
	if b.used != 60 {
		t.Fatalf("a failed swap left %d bytes held, want the 60 before it", b.used)
	}
	if !b.swap(30, 70) {
		t.Fatal("a swap of 30 reserved for an event of 70 failed with 30 held besides")
	}
	if b.tryTake(1) {
		t.Fatal("an event was taken past the bound")
	}
	b.release(70)
	b.release(30)
	if b.used != 0 {
		t.Fatalf("after every release %d bytes are held", b.used)
	}
}

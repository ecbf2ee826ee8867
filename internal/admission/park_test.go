package admission

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
)

// A call that parks gives its slot to the next one and ends without
// giving it back twice; past MaxParked a call keeps its slot.
func TestParkGivesTheSlotBack(t *testing.T) {
	l := New(Options{MaxInFlight: 1, MaxQueue: 1, QueueTimeout: time.Millisecond, MaxParked: 1})
	ic := UnaryInterceptor(l, nil)
	write := &grpc.UnaryServerInfo{FullMethod: "/cortado.wire.Node/Write"}
	parked, resume := make(chan bool), make(chan struct{})
	done := make(chan error)
	waiting := func(ctx context.Context, _ any) (any, error) {
		parked <- Park(ctx)
		<-resume
		return "ok", nil
	}
	go func() { _, err := ic(context.Background(), nil, write, waiting); done <- err }()
	if !<-parked {
		t.Fatal("the first call did not park")
	}
	if s := l.Stats(); s.InFlight != 0 || s.Parked != 1 {
		t.Fatalf("after parking: %+v, want 0 in flight, 1 parked", s)
	}
	// Its slot serves another call, which cannot park (MaxParked 1) and
	// so holds the slot: a third is refused.
	go func() { _, err := ic(context.Background(), nil, write, waiting); done <- err }()
	if <-parked {
		t.Fatal("a call parked beyond MaxParked")
	}
	if _, err := l.Acquire(context.Background(), Interactive); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("a call with the slot held by one that could not park: %v", err)
	}
	close(resume)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if s := l.Stats(); s.InFlight != 0 || s.Parked != 0 {
		t.Fatalf("after both ended: %+v, want nothing in flight or parked", s)
	}
	// Parking twice, or outside a held call, does nothing.
	if Park(context.Background()) {
		t.Fatal("parked a context holding no slot")
	}
	r, err := l.Acquire(context.Background(), Interactive)
	if err != nil {
		t.Fatal(err)
	}
	ctx, end := l.Hold(context.Background(), r)
	if !Park(ctx) || Park(ctx) {
		t.Fatal("a held slot parks once")
	}
	end()
	if s := l.Stats(); s.InFlight != 0 || s.Parked != 0 {
		t.Fatalf("after a held call ended: %+v", s)
	}
}

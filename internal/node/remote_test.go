package node

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A call on a connection closed meanwhile (the router dropped a node that
// left the cluster while a request was routed to it) is "unavailable, not
// delivered": the router answers 503 and a client may retry, never 500.
func TestCallOnClosedRemoteIsNotDelivered(t *testing.T) {
	r := NewRemote("http://127.0.0.1:1")
	r.Close()
	_, err := r.Write(context.Background(), WriteRequest{DB: "d", Ops: []Op{{Kind: "delete", Table: "T"}}})
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrNotDelivered) {
		t.Fatalf("write on a closed connection: %v, want unavailable and not delivered", err)
	}
}

// TestLogRequestWire: a log request crosses the wire unchanged, and a
// byte bound from the wire is kept within MaxLogBytes.
func TestLogRequestWire(t *testing.T) {
	r := LogRequest{DB: "d", Partition: 3, Max: 16, MaxBytes: 65536, Wait: time.Second, Ack: true, Replica: "n1", BufferOnly: true}
	r.After.Gen, r.After.Seq = 2, 7
	if got := logFrom(logTo(r)); got != r {
		t.Fatalf("%+v crossed the wire as %+v", r, got)
	}
	for _, hostile := range []int64{-1, 1 << 40} {
		w := logTo(r)
		w.MaxBytes = hostile
		if got := logFrom(w).MaxBytes; got < 0 || got > MaxLogBytes {
			t.Fatalf("max_bytes %d from the wire became %d", hostile, got)
		}
	}
}

package node

import (
	"context"
	"errors"
	"testing"
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

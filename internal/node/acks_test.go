package node

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cortado-db/cortado/internal/storage"
)

// TestAcksFromStrangersAreBounded: acknowledgements that name replicas
// the routing table does not give the master as slaves (the Ack call is
// an input from outside) are kept for at most maxStrangerAcks names of
// at most maxStrangerID bytes, however many come; the slaves' are always
// kept and make the quorum; a stranger kept counts once it is a slave.
func TestAcksFromStrangersAreBounded(t *testing.T) {
	scn := func(seq uint64) storage.SCN { return storage.SCN{Gen: 1, Seq: seq} }
	e := &partRole{slaves: []string{"s1", "s2"}}
	e.ack("joining", scn(3))
	for i := range 10_000 {
		e.ack(fmt.Sprintf("stranger-%d", i), scn(uint64(i%7+1)))
	}
	e.ack(strings.Repeat("x", 1<<20), scn(9))
	if len(e.acks) != maxStrangerAcks {
		t.Fatalf("%d acknowledgements kept after 10,001 strangers', want %d", len(e.acks), maxStrangerAcks)
	}
	for id := range e.acks {
		if len(id) > maxStrangerID {
			t.Fatalf("kept a stranger's name of %d bytes", len(id))
		}
	}
	// The slaves', whatever the strangers did.
	e.ack("s1", scn(5))
	e.ack("s2", scn(4))
	if q := e.quorumLocked(2); q != scn(4) {
		t.Fatalf("quorum of two slaves at 1:5 and 1:4: %s", q)
	}
	if got := e.ack("s1", scn(6)); got != scn(5) {
		t.Fatalf("a slave's earlier acknowledgement: %s, want 1:5", got)
	}
	// A stranger kept from before it was named counts once it is.
	e.slaves = append(e.slaves, "joining")
	if q := e.quorumLocked(3); q != scn(3) {
		t.Fatalf("quorum of three with the joining replica's 1:3: %s", q)
	}
	// A name not kept is taken once the table names it a slave.
	e.slaves = append(e.slaves, "stranger-9999")
	e.ack("stranger-9999", scn(8))
	if got := e.acks["stranger-9999"]; got != scn(8) {
		t.Fatalf("a new slave's acknowledgement: %s, want 1:8", got)
	}
}

package clustertest

import (
	"fmt"
	"testing"

	"github.com/cortado-db/cortado/client"
)

// TestChangeLog: a consumer's bookkeeping undoes what a rollback names,
// lets a snapshot replace its partition's state, and notes a change
// repeated or out of commit order — what the change-stream checks
// (here and in internal/jepsen) rely on to tell a lost or phantom change
// from the consumer's own.
func TestChangeLog(t *testing.T) {
	l := NewChangeLog("beginning")
	ev := func(typ, op string, p int, scn, key string, v int, snapshot string) *client.ChangeEvent {
		e := &client.ChangeEvent{Type: typ, Op: op, Source: client.ChangeSource{Partition: p, SCN: scn, Table: "U", Key: client.Key{key}, Snapshot: snapshot},
			Transaction: &client.ChangeTransaction{TotalOrder: 1}, Token: "after " + scn}
		if typ == "change" {
			e.After = []byte(fmt.Sprintf(`{"v":%d}`, v))
		}
		return e
	}
	state := func() map[string]string {
		out := map[string]string{}
		for k, doc := range l.State() {
			out[k] = string(doc)
		}
		return out
	}
	l.Apply(ev("change", "c", 0, "1:1", "a", 1, ""))
	l.Apply(ev("change", "u", 0, "1:2", "a", 2, ""))
	l.Apply(ev("change", "c", 0, "1:3", "b", 3, ""))
	l.Apply(ev("change", "c", 1, "1:1", "x", 9, ""))
	if got := state(); got["U/a"] != `{"v":2}` || got["U/b"] != `{"v":3}` || got["U/x"] != `{"v":9}` || len(l.Problems) != 0 || l.Token != "after 1:1" {
		t.Fatalf("after changes: %v, problems %v, token %q", got, l.Problems, l.Token)
	}
	// A failover discarded 1:3 of partition 0: b was never there.
	l.Apply(ev("rollback", "", 0, "1:2", "", 0, ""))
	if got := state(); got["U/a"] != `{"v":2}` || len(got) != 2 || len(l.Rollbacks) != 1 {
		t.Fatalf("after the rollback to 1:2: %v (rollbacks %v), want a=2 and x=9 only", got, l.Rollbacks)
	}
	l.Apply(ev("change", "u", 0, "2:1", "a", 4, ""))
	// Repeated, then older than what came before: both are problems.
	l.Apply(ev("change", "u", 0, "2:1", "a", 4, ""))
	l.Apply(ev("change", "u", 0, "1:2", "a", 2, ""))
	if len(l.Problems) != 2 {
		t.Fatalf("problems %v, want the repeated and the out-of-order change", l.Problems)
	}
	// A snapshot of partition 1 replaces what the consumer held of it.
	l.Apply(ev("change", "r", 1, "3:7", "y", 5, "true"))
	l.Apply(ev("change", "r", 1, "3:7", "z", 6, "last"))
	if got := state(); got["U/y"] != `{"v":5}` || got["U/z"] != `{"v":6}` || len(got) != 3 || l.Snapshots != 1 {
		t.Fatalf("after the snapshot: %v (%d snapshots), want a, y and z (x gone)", got, l.Snapshots)
	}
	// A snapshot cut off midway replaces nothing: the stream resumed
	// from the position before it, with changes after that position.
	l.Apply(ev("change", "r", 1, "4:9", "w", 7, "true"))
	if got := state(); got["U/y"] != `{"v":5}` || got["U/w"] != "" {
		t.Fatalf("during a snapshot: %v, want the state before it", got)
	}
	l.Apply(ev("change", "u", 1, "3:8", "y", 8, ""))
	if got := state(); got["U/y"] != `{"v":8}` || got["U/z"] != `{"v":6}` || got["U/w"] != "" || len(got) != 3 {
		t.Fatalf("after a snapshot cut off and the changes after its position: %v, want a, y=8, z", got)
	}
	// One cut off, then one of a later SCN: only the later one's rows.
	l.Apply(ev("change", "r", 1, "5:1", "gone", 1, "true"))
	l.Apply(ev("change", "r", 1, "5:3", "y", 9, "last"))
	if got := state(); got["U/y"] != `{"v":9}` || got["U/gone"] != "" || len(got) != 2 || l.Snapshots != 4 {
		t.Fatalf("after a snapshot sent again at a later SCN: %v (%d snapshots), want a and y=9", got, l.Snapshots)
	}
}

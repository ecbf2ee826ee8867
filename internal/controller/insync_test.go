package controller

import (
	"context"
	"log/slog"
	"testing"

	"github.com/cortado-db/cortado/internal/coord/coordtest"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
	"github.com/cortado-db/cortado/internal/topo"
)

// TestRaiseSettlesOnceEarlierWritesAreHeld: a raise of minInSync from 1
// to 2 counts in failovers only once every partition's master has
// reported counting by 2 at some SCN and, in a later round, two replicas
// hold that SCN. Not while a master reports the old value, nor in the
// round that marks the SCN, nor while only the master holds it, nor
// after the master's generation changed (that master starts over).
func TestRaiseSettlesOnceEarlierWritesAreHeld(t *testing.T) {
	cli := coordtest.Start(t)
	ctx := context.Background()
	reg, err := registry.Open(ctx, cli, registry.Options{Prefix: "/t", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	if _, _, err := reg.CreateDatabase(ctx, schema.Database{Name: "d", Partitions: 2, Replicas: 3, MinInSync: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.AlterDatabase(ctx, "d", func(d *schema.Database) error { d.MinInSync = 2; return nil }); err != nil {
		t.Fatal(err)
	}
	c := &Controller{Registry: reg, Log: slog.New(slog.DiscardHandler)}
	table := &topo.RoutingTable{DB: "d", Partitions: []topo.PartitionRoute{
		{Replicas: []string{"a", "b", "c"}, Generation: 3},
		{Replicas: []string{"b", "c", "a"}, Generation: 5},
	}}
	st := func(role node.Role, gen uint32, inSync int, seq uint64) node.PartitionStatus {
		return node.PartitionStatus{Role: role, Generation: gen, InSync: inSync, SCN: storage.SCN{Gen: gen, Seq: seq}}
	}
	round := func(statuses map[string]map[int]node.PartitionStatus) int {
		t.Helper()
		d, err := reg.Database("d")
		if err != nil {
			t.Fatal(err)
		}
		if d.FailoverInSync == 0 {
			return d.FailoverQuorum()
		}
		c.settleRaise(ctx, d, table, statuses)
		d, _ = reg.Database("d")
		return d.FailoverQuorum()
	}
	// Partition 0's master still counts by 1.
	old := map[string]map[int]node.PartitionStatus{
		"a": {0: st(node.Master, 3, 1, 10), 1: st(node.Slave, 5, 2, 20)},
		"b": {0: st(node.Slave, 3, 2, 10), 1: st(node.Master, 5, 2, 20)},
		"c": {0: st(node.Slave, 3, 2, 10), 1: st(node.Slave, 5, 2, 20)},
	}
	for range 3 {
		if k := round(old); k != 1 {
			t.Fatalf("settled while a master counts by the old value: failovers count by %d", k)
		}
	}
	// Both masters count by 2 from SCNs 11 and 21; the slaves of
	// partition 0 hold only 10 so far.
	marked := map[string]map[int]node.PartitionStatus{
		"a": {0: st(node.Master, 3, 2, 11), 1: st(node.Slave, 5, 2, 21)},
		"b": {0: st(node.Slave, 3, 2, 10), 1: st(node.Master, 5, 2, 21)},
		"c": {0: st(node.Slave, 3, 2, 10), 1: st(node.Slave, 5, 2, 21)},
	}
	for range 3 {
		if k := round(marked); k != 1 {
			t.Fatalf("settled while only the master holds the SCN its raise was marked at: failovers count by %d", k)
		}
	}
	// Partition 0 gets a new master generation: its mark starts over,
	// at the new master's SCN.
	table.Partitions[0].Generation = 4
	moved := map[string]map[int]node.PartitionStatus{
		"a": {0: st(node.Master, 4, 2, 30), 1: st(node.Slave, 5, 2, 21)},
		"b": {0: st(node.Slave, 4, 2, 12), 1: st(node.Master, 5, 2, 21)},
		"c": {0: st(node.Slave, 4, 2, 12), 1: st(node.Slave, 5, 2, 21)},
	}
	if k := round(moved); k != 1 {
		t.Fatalf("settled in the round a new generation was marked: failovers count by %d", k)
	}
	// The slaves hold 12, past the old mark, but not the new one (30).
	if k := round(moved); k != 1 {
		t.Fatalf("settled on a mark of the generation before: failovers count by %d", k)
	}
	moved["b"][0] = st(node.Slave, 4, 2, 30)
	if k := round(moved); k != 2 {
		t.Fatalf("every partition's marked SCN held by two replicas: failovers count by %d, want 2", k)
	}
}

package topo

import (
	"context"
	"slices"
	"testing"

	"github.com/cortado-db/cortado/internal/coord/coordtest"
)

// TestProcesses: relays, routers and controllers are listed by role and
// ID with what they registered; a record that is not JSON (written by
// hand) is listed by its key; a record goes when its registration ends.
func TestProcesses(t *testing.T) {
	cli := coordtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	relay := Process{ID: "r1", URL: "http://relay", Build: "aaaaaaaaaaaa", Protocol: 4}
	if _, err := RegisterRelay(ctx, cli, "/t", relay, 60); err != nil {
		t.Fatal(err)
	}
	router := Process{Role: RoleRouter, ID: "host-12", Build: "bbbbbbbbbbbb", Protocol: 3}
	if _, err := PutLeased(ctx, cli, RoutersPrefix("/t")+router.ID, router.ID, 60, router.KV("/t")); err != nil {
		t.Fatal(err)
	}
	cctx, stopController := context.WithCancel(ctx)
	controller := Process{Role: RoleController, ID: "c1", Build: "aaaaaaaaaaaa", Protocol: 4}
	creg, err := RegisterProcess(cctx, cli, "/t", controller, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, ProcessesPrefix("/t")+"router/by-hand", "not json"); err != nil {
		t.Fatal(err)
	}
	// Another cluster's prefix is not listed.
	if _, err := RegisterProcess(ctx, cli, "/other", Process{Role: RoleController, ID: "c9"}, 60); err != nil {
		t.Fatal(err)
	}

	got, err := Processes(ctx, cli, "/t")
	if err != nil {
		t.Fatal(err)
	}
	relay.Role = RoleRelay
	want := []Process{controller, relay, {Role: RoleRouter, ID: "by-hand"}, router}
	if !slices.Equal(got, want) {
		t.Fatalf("processes:\n got %+v\nwant %+v", got, want)
	}

	stopController()
	<-creg.Done()
	got, err = Processes(ctx, cli, "/t")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want[1:]) {
		t.Fatalf("after the controller stopped:\n got %+v\nwant %+v", got, want[1:])
	}
}

package storage

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/keys"
)

// TestEngineFailsUnderTheFreeSpaceFloor: a disk with less free space than
// Options.MinFreeBytes counts as full — the engine fails and refuses
// writes — though its probe writes still succeed (as on an ext4 that
// delayed allocation has handed a few blocks back to).
func TestEngineFailsUnderTheFreeSpaceFloor(t *testing.T) {
	put := func(tx *Tx) error {
		_, err := tx.Put("T", []keys.Part{keys.S("k")}, 1, []byte("v"))
		return err
	}
	dir := t.TempDir()
	free, ok := freeBytes(dir)
	if !ok {
		t.Skip("free space is not known on this system")
	}
	e, err := Open(dir, Options{ProbeInterval: 10 * time.Millisecond, MinFreeBytes: free + 1<<40})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	select {
	case <-e.FailedC():
	case <-time.After(10 * time.Second):
		t.Fatalf("with %d bytes free and a floor of %d, the engine has not failed after 10 s", free, free+1<<40)
	}
	if err := e.Failed(); !errors.Is(err, ErrFailed) || !strings.Contains(err.Error(), "under the floor") {
		t.Fatalf("the engine failed with %v, want ErrFailed naming the floor", err)
	}
	// A write fails: opening the partition (which commits its history)
	// or, had it been open, the write itself.
	p, err := e.Partition("db", 0)
	if err == nil {
		_, err = p.Update(put)
	}
	if !errors.Is(err, ErrFailed) {
		t.Fatalf("a write to a full engine: %v, want ErrFailed", err)
	}

	// With the default floor the same disk is not full.
	if free < DefaultMinFreeBytes {
		t.Skipf("the test's disk has only %d bytes free", free)
	}
	e2, err := Open(t.TempDir(), Options{ProbeInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	p2, err := e2.Partition("db", 0)
	if err != nil {
		t.Fatal(err)
	}
	// Probes run every 10 ms meanwhile; the commit's own fsync takes
	// longer than several of them on this machine.
	for i := 0; i < 20; i++ {
		if _, err := p2.Update(put); err != nil {
			t.Fatalf("write %d with the default floor: %v", i, err)
		}
	}
	if err := e2.Failed(); err != nil {
		t.Fatalf("with %d bytes free the engine failed under the default floor: %v", free, err)
	}
}

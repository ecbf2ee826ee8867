package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

func quietPebble() *pebble.Options {
	return &pebble.Options{FormatMajorVersion: pebble.FormatNewest,
		Logger: pebbleLogger{slog.New(slog.DiscardHandler), &failure{done: make(chan struct{})}}}
}

// storedValue reads an engine-wide record straight from Pebble; ok is
// false when there is none.
func storedValue(t *testing.T, dir string, key []byte) (v []byte, ok bool) {
	t.Helper()
	db, err := pebble.Open(dir, quietPebble())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	v, ok, err = engineRecord(db, key)
	if err != nil {
		t.Fatal(err)
	}
	return v, ok
}

// storedFormat is the engine's record of its format: -1 when there is
// none.
func storedFormat(t *testing.T, dir string) int {
	t.Helper()
	v, ok := storedValue(t, dir, formatKey)
	if !ok {
		return -1
	}
	return int(binary.BigEndian.Uint32(v))
}

// setFormat writes (or with v < 0 deletes) the record straight into
// Pebble, as a later release, or one from before the record, leaves it.
func setFormat(t *testing.T, dir string, v int) {
	t.Helper()
	db, err := pebble.Open(dir, quietPebble())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if v < 0 {
		err = db.Delete(formatKey, pebble.Sync)
	} else {
		err = db.Set(formatKey, binary.BigEndian.AppendUint32(nil, uint32(v)), pebble.Sync)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestStorageFormat: a new data directory records this binary's format; one
// without the record (written before it) gets it; one of a later format is
// refused with an error that says so, and the refusal changes nothing: the
// same directory, its record put back, opens with every commit there.
func TestStorageFormat(t *testing.T) {
	dir := t.TempDir()
	e := open(t, dir)
	p, err := e.Partition("db", 1)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		put(t, p, fmt.Sprint("k", i), "v")
	}
	want := logDump(t, p)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if got := storedFormat(t, dir); got != int(FormatVersion) {
		t.Fatalf("a new data directory records format %d, want %d", got, FormatVersion)
	}

	setFormat(t, dir, -1)
	e = open(t, dir)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if got := storedFormat(t, dir); got != int(FormatVersion) {
		t.Fatalf("a data directory without the record records format %d after an open, want %d", got, FormatVersion)
	}

	setFormat(t, dir, int(FormatVersion)+1)
	_, err = Open(dir, Options{})
	if !errors.Is(err, ErrNewerFormat) {
		t.Fatalf("opening a later format: %v, want ErrNewerFormat", err)
	}
	if msg := err.Error(); !strings.Contains(msg, dir) || !strings.Contains(msg, fmt.Sprintf("format %d", FormatVersion+1)) {
		t.Fatalf("the refusal does not name the directory and its format: %s", msg)
	}
	if got := storedFormat(t, dir); got != int(FormatVersion)+1 {
		t.Fatalf("the refused open rewrote the record to %d", got)
	}

	setFormat(t, dir, int(FormatVersion))
	e = open(t, dir)
	defer e.Close()
	p, err = e.Partition("db", 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := logDump(t, p); got != want {
		t.Fatalf("after the refusal the log reads\n%s\nwant\n%s", got, want)
	}
}

// storedCluster is the engine's record of its cluster: "" when there is
// none.
func storedCluster(t *testing.T, dir string) string {
	t.Helper()
	v, _ := storedValue(t, dir, clusterKey)
	return string(v)
}

// TestStorageCluster: a data directory records the cluster it first
// serves (one from before the record too); a process of another cluster
// is refused, with both named, and the refusal changes nothing; with
// AdoptCluster it records the new cluster; without a ClusterID nothing is
// checked.
func TestStorageCluster(t *testing.T) {
	dir := t.TempDir()
	openAs := func(id string, adopt bool) (*Engine, error) {
		return Open(dir, Options{ClusterID: id, AdoptCluster: adopt, Logger: slog.New(slog.DiscardHandler)})
	}
	e, err := openAs("", false)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := e.Partition("db", 1)
	put(t, p, "k", "v")
	want := logDump(t, p)
	e.Close()
	if got := storedCluster(t, dir); got != "" {
		t.Fatalf("opened without a cluster, the directory records %q", got)
	}
	for range 2 {
		if e, err = openAs("aaaa", false); err != nil {
			t.Fatal(err)
		}
		e.Close()
		if got := storedCluster(t, dir); got != "aaaa" {
			t.Fatalf("the directory records %q, want aaaa", got)
		}
	}
	_, err = openAs("bbbb", false)
	if !errors.Is(err, ErrOtherCluster) || !strings.Contains(err.Error(), "aaaa") || !strings.Contains(err.Error(), "bbbb") || !strings.Contains(err.Error(), dir) {
		t.Fatalf("another cluster's open: %v, want ErrOtherCluster naming both and the directory", err)
	}
	if got := storedCluster(t, dir); got != "aaaa" {
		t.Fatalf("the refused open recorded %q", got)
	}
	if e, err = openAs("bbbb", true); err != nil {
		t.Fatalf("adopting: %v", err)
	}
	e.Close()
	if e, err = openAs("bbbb", false); err != nil {
		t.Fatalf("after adopting: %v", err)
	}
	defer e.Close()
	p, err = e.Partition("db", 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := logDump(t, p); got != want {
		t.Fatalf("after the refusal and adoption the log reads\n%s\nwant\n%s", got, want)
	}
}

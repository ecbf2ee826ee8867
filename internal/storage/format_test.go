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

// storedFormat reads the engine's record of its format straight from
// Pebble: -1 when there is none.
func storedFormat(t *testing.T, dir string) int {
	t.Helper()
	db, err := pebble.Open(dir, quietPebble())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	v, closer, err := db.Get(formatKey)
	if errors.Is(err, pebble.ErrNotFound) {
		return -1
	}
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
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

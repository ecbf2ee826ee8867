package storage

import (
	"fmt"
	"hash/crc32"
	"slices"
	"strings"
	"testing"
)

// readBoth reads p's log after from through ReadLog (the tail when it
// holds what follows from) and from Pebble alone: SCN, length and
// checksum of each encoded entry.
func readBoth(t *testing.T, p *Partition, from SCN) (got, stored []string) {
	t.Helper()
	collect := func(out *[]string) func(Commit) bool {
		return func(c Commit) bool {
			e := encodeCommit(&c)
			*out = append(*out, fmt.Sprintf("%s %d %08x", c.SCN, len(e), crc32.ChecksumIEEE(e)))
			return true
		}
	}
	if err := p.ReadLog(from, collect(&got)); err != nil {
		t.Fatal(err)
	}
	if err := p.readStoredLog(from, p.SCN(), collect(&stored)); err != nil {
		t.Fatal(err)
	}
	return got, stored
}

// sameLog checks that ReadLog gives what the stored log holds, from the
// start, from every SCN in it or in the tail, and from SCNs in neither.
func sameLog(t *testing.T, what string, p *Partition) {
	t.Helper()
	_, all := readBoth(t, p, SCN{})
	froms := []SCN{{}, {1, 0}, {9, 0}, p.SCN(), {p.SCN().Gen, p.SCN().Seq + 5}}
	p.mu.Lock()
	froms = append(froms, p.tail.base)
	for _, e := range p.tail.entries {
		froms = append(froms, e.scn)
	}
	p.mu.Unlock()
	for _, l := range all {
		var s SCN
		fmt.Sscanf(strings.Fields(l)[0], "%d:%d", &s.Gen, &s.Seq)
		froms = append(froms, s, SCN{s.Gen, s.Seq + 1000})
	}
	for _, from := range froms {
		if got, stored := readBoth(t, p, from); !slices.Equal(got, stored) {
			t.Fatalf("%s: log after %s:\n%d entries read\n%d stored", what, from, len(got), len(stored))
		}
	}
}

// tailHolds reports whether ReadLog after the partition's SCN less back
// commits is answered from the tail.
func tailHolds(p *Partition, back uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tail.last() != p.scn || p.scn.Seq < back {
		return false
	}
	_, ok := p.tail.after(SCN{p.scn.Gen, p.scn.Seq - back}, p.durable)
	return ok
}

// TestLogTailIsTheStoredLog checks that the log's tail in memory answers
// exactly as the stored log through commits beyond its bounds, a new
// generation, batches applied on a slave, a truncation and a trim.
func TestLogTailIsTheStoredLog(t *testing.T) {
	m, s := pair(t, 0)
	for i := range maxTailEntries + 40 {
		put(t, m, fmt.Sprint("k", i%50), fmt.Sprint("v", i))
	}
	if !tailHolds(m, maxTailEntries-1) || tailHolds(m, maxTailEntries+1) {
		t.Fatalf("tail of %d entries after %s: holds the last %d: %v, %d: %v", len(m.tail.entries), m.SCN(),
			maxTailEntries-1, tailHolds(m, maxTailEntries-1), maxTailEntries+1, tailHolds(m, maxTailEntries+1))
	}
	sameLog(t, "master", m)
	// Large entries: the byte bound.
	big := strings.Repeat("x", maxTailBytes/4)
	for i := range 6 {
		put(t, m, fmt.Sprint("big", i), big)
	}
	if m.tail.bytes > maxTailBytes || len(m.tail.entries) >= 6 || !tailHolds(m, 1) {
		t.Fatalf("tail of %d entries, %d bytes", len(m.tail.entries), m.tail.bytes)
	}
	sameLog(t, "master with large entries", m)

	replicate(t, m, s) // one batch
	sameLog(t, "slave", s)
	if !tailHolds(s, 1) {
		t.Fatal("a slave's applied batch is not in its tail")
	}
	for range 3 {
		put(t, m, "a", "1")
		replicate(t, m, s)
	}
	sameLog(t, "slave after single commits", s)

	// The slave takes over; the old master's last commits never
	// reached it and are truncated.
	common := m.SCN()
	put(t, m, "lost", "1")
	put(t, m, "lost", "2")
	if err := s.StartGeneration(2); err != nil {
		t.Fatal(err)
	}
	put(t, s, "b", "new")
	sameLog(t, "new master", s)
	if _, err := m.TruncateAfter(common); err != nil {
		t.Fatal(err)
	}
	sameLog(t, "truncated", m)
	replicate(t, s, m)
	sameLog(t, "old master following", m)
	if !tailHolds(m, 1) {
		t.Fatal("the old master's tail is not read after it follows again")
	}

	// A trim removes entries the tail held.
	s.Acknowledged(s.SCN())
	if _, err := s.Trim(SCN{2, 1}); err != nil {
		t.Fatal(err)
	}
	sameLog(t, "trimmed", s)
}

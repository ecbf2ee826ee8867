package storage

import "sort"

// Bounds on a partition's log tail: the newest entries of its commit log,
// kept in memory as stored. Replicas and relays follow a master a few
// commits behind; one further back reads the log from Pebble.
const (
	maxTailEntries = 64
	maxTailBytes   = 256 << 10
)

// logTail holds every entry of a partition's commit log after base, in
// SCN order, encoded as in the log. A replica or relay that follows the
// partition closely reads them here instead of through a fresh Pebble
// iterator per long poll (with three replicas, that iterator's seek was 9
// % of a write's CPU). The partition's mu guards it.
type logTail struct {
	base    SCN
	entries []tailEntry
	bytes   int
}

type tailEntry struct {
	scn   SCN
	entry []byte
}

// last is the newest SCN the tail ends at.
func (t *logTail) last() SCN {
	if len(t.entries) == 0 {
		return t.base
	}
	return t.entries[len(t.entries)-1].scn
}

// reset empties the tail: it holds every entry after base, none.
func (t *logTail) reset(base SCN) {
	t.base, t.entries, t.bytes = base, nil, 0
}

// add appends the entry of the commit at scn, written right after prev;
// a tail that did not end at prev starts over at it. The oldest entries
// go beyond the bounds.
func (t *logTail) add(prev, scn SCN, entry []byte) {
	if t.last() != prev {
		t.reset(prev)
	}
	t.entries = append(t.entries, tailEntry{scn, entry})
	t.bytes += len(entry)
	for len(t.entries) > maxTailEntries || (t.bytes > maxTailBytes && len(t.entries) > 1) {
		t.base = t.entries[0].scn
		t.bytes -= len(t.entries[0].entry)
		t.entries[0] = tailEntry{}
		t.entries = t.entries[1:]
	}
}

// trim drops the entries up to upTo, trimmed from the log: the tail then
// holds every entry after upTo at most.
func (t *logTail) trim(upTo SCN) {
	if !t.base.Less(upTo) {
		return
	}
	for len(t.entries) > 0 && !upTo.Less(t.entries[0].scn) {
		t.bytes -= len(t.entries[0].entry)
		t.entries[0] = tailEntry{}
		t.entries = t.entries[1:]
	}
	t.base = upTo
}

// after returns a copy of the entries after from, up to upTo, and whether
// the tail holds every entry of the log after from.
func (t *logTail) after(from, upTo SCN) ([]tailEntry, bool) {
	if from.Less(t.base) {
		return nil, false
	}
	i := sort.Search(len(t.entries), func(i int) bool { return from.Less(t.entries[i].scn) })
	j := sort.Search(len(t.entries), func(j int) bool { return upTo.Less(t.entries[j].scn) })
	if j <= i {
		return nil, true
	}
	return append([]tailEntry(nil), t.entries[i:j]...), true
}

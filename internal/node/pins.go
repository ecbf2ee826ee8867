package node

import (
	"sync"
	"time"

	"github.com/cortado-db/cortado/internal/storage"
)

// DefaultSnapshotPinGrace is how long a snapshot's SCN stays pinned in
// its master's log after the snapshot ends (Options.SnapshotPinGrace).
const DefaultSnapshotPinGrace = time.Minute

// maxPinsPerPartition bounds the pins one partition keeps: those of the
// snapshots streaming (at most MaxSnapshots) and of those ended within
// the grace. Past it the ended pins that expire first go.
const maxPinsPerPartition = 4 * MaxSnapshots

// snapshotPins keeps a master's log from being trimmed past the SCN of a
// snapshot it streams, while it streams and for a grace after it ends.
// The asker of a snapshot (a replica being rebuilt, a relay, a change
// stream) reads the log on from that SCN once it has the snapshot: a log
// trimmed past it meanwhile would send the asker back for another
// snapshot, which a retention shorter than the snapshot's stream would
// trim past again, round and round. Slaves pin the log the same way by
// their acknowledged positions (slavePin).
type snapshotPins struct {
	mu   sync.Mutex
	pins map[partitionKey][]*snapshotPin
}

// snapshotPin is one snapshot's pin.
type snapshotPin struct {
	scn storage.SCN
	// until is when the pin expires; zero while the snapshot streams.
	until time.Time
}

// add pins the partition's log from scn on until release.
func (s *snapshotPins) add(k partitionKey, scn storage.SCN, now time.Time) *snapshotPin {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pins == nil {
		s.pins = map[partitionKey][]*snapshotPin{}
	}
	pins := s.live(k, now)
	for len(pins) >= maxPinsPerPartition {
		// Streaming pins are at most MaxSnapshots, so an ended one is
		// there to drop: the one expiring first.
		first := -1
		for i, p := range pins {
			if !p.until.IsZero() && (first < 0 || p.until.Before(pins[first].until)) {
				first = i
			}
		}
		if first < 0 {
			break
		}
		pins = append(pins[:first], pins[first+1:]...)
	}
	pin := &snapshotPin{scn: scn}
	s.pins[k] = append(pins, pin)
	return pin
}

// release lets the pin expire at until.
func (s *snapshotPins) release(pin *snapshotPin, until time.Time) {
	s.mu.Lock()
	pin.until = until
	s.mu.Unlock()
}

// oldest returns the oldest position pinned in the partition's log at
// now, and false when nothing is pinned.
func (s *snapshotPins) oldest(k partitionKey, now time.Time) (storage.SCN, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pins := s.live(k, now)
	if len(pins) == 0 {
		return storage.SCN{}, false
	}
	scn := pins[0].scn
	for _, p := range pins[1:] {
		if p.scn.Less(scn) {
			scn = p.scn
		}
	}
	return scn, true
}

// prune drops every partition's pins expired at now: those of partitions
// no longer hosted too, which no retention pass asks for.
func (s *snapshotPins) prune(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.pins {
		s.live(k, now)
	}
}

// live drops the partition's pins expired at now and returns the others;
// s.mu is held.
func (s *snapshotPins) live(k partitionKey, now time.Time) []*snapshotPin {
	pins := s.pins[k]
	kept := pins[:0]
	for _, p := range pins {
		if p.until.IsZero() || now.Before(p.until) {
			kept = append(kept, p)
		}
	}
	clear(pins[len(kept):])
	if len(kept) == 0 {
		delete(s.pins, k)
		return nil
	}
	s.pins[k] = kept
	return kept
}

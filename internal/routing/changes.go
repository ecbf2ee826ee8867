package routing

import (
	"fmt"
	"sync"

	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/topo"
)

// ChangeSources tells a router's change streams where to read (it
// implements changes.Sources): logs from the relays (each new read of a
// partition goes to the next relay, so a consumer whose relay failed
// resumes on another), from the partition's master when there is none;
// snapshots from the master.
type ChangeSources struct {
	view    *RoutingView
	relays  *topo.RelayWatch
	remotes *node.Remotes

	mu    sync.Mutex
	turns map[string]int
	// logs and snaps are relays and storage nodes of this process, by
	// URL, read without the wire (CallLocally).
	logs  map[string]node.LogSource
	snaps map[string]node.Snapshotter
}

// CallLocally makes the sources read the relays in logs and take
// snapshots from the storage nodes in snaps, both by URL, directly: those
// of the router's own process.
func (s *ChangeSources) CallLocally(logs map[string]node.LogSource, snaps map[string]node.Snapshotter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.logs, s.snaps = logs, snaps
}

// NewChangeSources reads through relays (with remotes) and view.
func NewChangeSources(view *RoutingView, relays *topo.RelayWatch, remotes *node.Remotes) *ChangeSources {
	return &ChangeSources{view: view, relays: relays, remotes: remotes, turns: map[string]int{}}
}

func (s *ChangeSources) Log(db string, part int) (node.LogSource, error) {
	if urls := s.relays.URLs(); len(urls) > 0 {
		k := fmt.Sprint(db, "/", part)
		s.mu.Lock()
		turn := s.turns[k]
		s.turns[k] = turn + 1
		url := urls[turn%len(urls)]
		local := s.logs[url]
		s.mu.Unlock()
		if local != nil {
			return local, nil
		}
		return s.remotes.Get(url), nil
	}
	return s.master(db, part)
}

func (s *ChangeSources) Snapshot(db string, part int) (node.Snapshotter, error) {
	url, err := s.masterURL(db, part)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	local := s.snaps[url]
	s.mu.Unlock()
	if local != nil {
		return local, nil
	}
	return s.remotes.Get(url), nil
}

// master is the partition's master, called directly (change streams are
// not the traffic whose failures routers report).
func (s *ChangeSources) master(db string, part int) (*node.Remote, error) {
	url, err := s.masterURL(db, part)
	if err != nil {
		return nil, err
	}
	return s.remotes.Get(url), nil
}

func (s *ChangeSources) masterURL(db string, part int) (string, error) {
	t := s.view.Table(db)
	if t == nil {
		return "", fmt.Errorf("database %s has no routing table yet: %w", db, node.ErrNotMaster)
	}
	_, url := t.Master(part)
	if url == "" {
		return "", fmt.Errorf("partition %s/%d has no master: %w", db, part, node.ErrNotMaster)
	}
	return url, nil
}

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
		s.mu.Unlock()
		return s.remotes.Get(urls[turn%len(urls)]), nil
	}
	return s.master(db, part)
}

func (s *ChangeSources) Snapshot(db string, part int) (node.Snapshotter, error) {
	return s.master(db, part)
}

// master is the partition's master, called directly (change streams are
// not the traffic whose failures routers report).
func (s *ChangeSources) master(db string, part int) (*node.Remote, error) {
	t := s.view.Table(db)
	if t == nil {
		return nil, fmt.Errorf("database %s has no routing table yet: %w", db, node.ErrNotMaster)
	}
	_, url := t.Master(part)
	if url == "" {
		return nil, fmt.Errorf("partition %s/%d has no master: %w", db, part, node.ErrNotMaster)
	}
	return s.remotes.Get(url), nil
}

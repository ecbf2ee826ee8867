package routing

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/storage"
	"github.com/cortado-db/cortado/internal/topo"
)

// ChangeSources tells a router's change streams where to read (it
// implements changes.Sources): logs from the relays (each new read of a
// partition goes to the next relay, so a consumer whose relay failed
// resumes on another), from the partition's master when there is none
// or every relay failed a read within relayPause (a relay that is
// registered but unreachable must not stall the streams, as it does not
// stall slaves); snapshots from the master. A relay whose stream falls
// silent while the partition's master moves on counts as failed too, as
// it does for a slave (node.WatchRelay): a relay cut off, or paused, is
// left in about 1.5 s rather than after 5 s of missed heartbeats.
type ChangeSources struct {
	view    *RoutingView
	relays  *topo.RelayWatch
	remotes *node.Remotes

	// behind and failed count reads that left a relay: it fell silent
	// while the master moved on, or its read failed.
	behind, failed atomic.Uint64

	mu    sync.Mutex
	turns map[string]int
	// failedAt holds, by relay URL, until when reads skip the relay.
	failedAt map[string]time.Time
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
	return &ChangeSources{view: view, relays: relays, remotes: remotes, turns: map[string]int{}, failedAt: map[string]time.Time{}}
}

// relayPause is how long, after a relay failed a read, change streams
// read from the partitions' masters instead (a slave does the same).
const relayPause = 5 * time.Second

func (s *ChangeSources) Log(db string, part int) (node.LogSource, error) {
	if src := s.relay(db, part); src != nil {
		return src, nil
	}
	return s.master(db, part)
}

// relay is the next relay in turn for the partition that has not failed
// a read within relayPause, nil when there is none.
func (s *ChangeSources) relay(db string, part int) node.LogSource {
	urls := s.relays.URLs()
	if len(urls) == 0 {
		return nil
	}
	k := fmt.Sprint(db, "/", part)
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for range urls {
		turn := s.turns[k]
		s.turns[k] = turn + 1
		url := urls[turn%len(urls)]
		if now.Before(s.failedAt[url]) {
			continue
		}
		if local := s.logs[url]; local != nil {
			return local
		}
		return &relayLog{src: s.remotes.Get(url), url: url, s: s}
	}
	return nil
}

func (s *ChangeSources) relayFailed(url string, behind bool) {
	if behind {
		s.behind.Add(1)
	} else {
		s.failed.Add(1)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failedAt[url] = time.Now().Add(relayPause)
}

// RelayLeftStats counts the change streams' reads that left a relay:
// behind (it fell silent while the master moved on), failed (its read
// failed, or stayed silent for 5 s).
func (s *ChangeSources) RelayLeftStats() (behind, failed uint64) {
	return s.behind.Load(), s.failed.Load()
}

// relayLog is a relay's log that tells its ChangeSources when reading it
// failed: not when the stream's own callback failed, nor when the
// caller gave up.
type relayLog struct {
	src *node.Remote
	url string
	s   *ChangeSources
}

func (r *relayLog) Log(ctx context.Context, req node.LogRequest) (*node.LogResult, error) {
	res, err := r.src.Log(ctx, req)
	if err != nil && ctx.Err() == nil {
		r.s.relayFailed(r.url, false)
	}
	return res, err
}

// StreamLog streams the relay's log, watched as a slave watches it
// (node.WatchRelay) when the partition's master is known: a stream
// silent for 1.5 s while the master holds newer commits ends with
// node.ErrRelayBehind, and the relay is skipped as a failed one is.
func (r *relayLog) StreamLog(ctx context.Context, req node.LogRequest, fn func(*node.LogResult) error) error {
	quiet := node.NewQuietness()
	var at atomic.Pointer[storage.SCN] // the newest commit the reader has
	at.Store(&req.After)
	wctx, unwatch := ctx, func() {}
	if master, err := r.s.master(req.DB, req.Partition); err == nil {
		wctx, unwatch = node.WatchRelay(ctx, master, req.DB, req.Partition, func() storage.SCN { return *at.Load() }, quiet)
	}
	defer unwatch()
	var fnErr error
	err := r.src.StreamLog(wctx, req, func(res *node.LogResult) error {
		quiet.Handling()
		defer quiet.Heard()
		if n := len(res.Commits); n > 0 {
			scn := res.Commits[n-1].SCN
			at.Store(&scn)
		}
		fnErr = fn(res)
		return fnErr
	})
	if cause := context.Cause(wctx); errors.Is(cause, node.ErrRelayBehind) && ctx.Err() == nil {
		r.s.relayFailed(r.url, true)
		return fmt.Errorf("relay %s, partition %s/%d: %w", r.url, req.DB, req.Partition, cause)
	}
	if err != nil && fnErr == nil && ctx.Err() == nil {
		r.s.relayFailed(r.url, false)
	}
	return err
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

// Master is the partition's master, asked for its newest commit (the
// Redis cache tier's updater).
func (s *ChangeSources) Master(db string, part int) (node.Acker, error) {
	m, err := s.master(db, part)
	if err != nil {
		return nil, err
	}
	return m, nil
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

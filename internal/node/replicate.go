package node

import (
	"context"
	"fmt"
	"time"

	"github.com/cortado-db/cortado/internal/storage"
)

// LogRequest asks a partition's master for the commits after an SCN.
type LogRequest struct {
	DB        string
	Partition int
	After     storage.SCN
	// Max bounds the commits returned (default 256).
	Max int
	// Wait is how long to wait for a commit when there is none yet.
	Wait time.Duration
	// Ack says the asker is a slave that durably holds every commit up
	// to After: semi-sync writes waiting for After are acknowledged.
	Ack bool
}

// LogResult is a batch of commits in SCN order, or word that the asker's
// timeline diverged from this one after Common (it must truncate to Common
// before following).
type LogResult struct {
	Commits  []storage.Commit
	Diverged bool
	Common   storage.SCN
	// SourceRole and SourceSCN are the answering replica's role and last
	// SCN: a replica taking over mastership drains until the old master
	// is no longer MASTER and it holds the old master's last SCN.
	SourceRole Role
	SourceSCN  storage.SCN
}

// LogSource is where a slave reads its master's log: a local Node, or a
// Remote one.
type LogSource interface {
	Log(ctx context.Context, req LogRequest) (*LogResult, error)
}

// Log serves a partition's commits after req.After, waiting up to req.Wait
// for one when there is none.
func (n *Node) Log(ctx context.Context, req LogRequest) (*LogResult, error) {
	p, err := n.partition(req.DB, req.Partition)
	if err != nil {
		return nil, err
	}
	if req.Max <= 0 {
		req.Max = 256
	}
	if !req.After.IsZero() {
		ok, err := p.HasCommit(req.After)
		if err != nil {
			return nil, err
		}
		if ok && req.Ack {
			n.roles.entry(req.DB, req.Partition).ack(req.After)
		}
		if !ok && !behind(p, req.After) {
			// The asker has a commit this timeline does not: it
			// diverged after the newest commit both have. (Reading on
			// from its position would hand it later commits of another
			// history.)
			common, err := p.LastCommitBefore(req.After)
			if err != nil {
				return nil, err
			}
			return &LogResult{Diverged: true, Common: common, SourceRole: n.Role(req.DB, req.Partition), SourceSCN: p.SCN()}, nil
		}
	}
	deadline := time.Now().Add(req.Wait)
	for {
		changed := p.Changed()
		if !req.After.IsZero() {
			// Still behind the asker in its generation: nothing to
			// serve until this replica catches up.
			if ok, err := p.HasCommit(req.After); err != nil || !ok {
				if err != nil {
					return nil, err
				}
				if !behind(p, req.After) {
					return n.Log(ctx, req) // diverged meanwhile
				}
				select {
				case <-changed:
					continue
				case <-time.After(time.Until(deadline)):
					return &LogResult{SourceRole: n.Role(req.DB, req.Partition), SourceSCN: p.SCN()}, nil
				case <-ctx.Done():
					return &LogResult{}, nil
				}
			}
		}
		res := &LogResult{SourceRole: n.Role(req.DB, req.Partition), SourceSCN: p.SCN()}
		err := p.ReadLog(req.After, func(c storage.Commit) bool {
			if c.SCN == req.After {
				return true
			}
			res.Commits = append(res.Commits, c)
			return len(res.Commits) < req.Max
		})
		if err != nil || len(res.Commits) > 0 || time.Now().After(deadline) {
			return res, err
		}
		select {
		case <-changed:
		case <-time.After(time.Until(deadline)):
		case <-ctx.Done():
			return res, nil
		}
	}
}

// behind reports whether replica p is behind a follower at after in the
// follower's own generation and still in it, so it may yet reach after.
func behind(p *storage.Partition, after storage.SCN) bool {
	own := p.SCN()
	return own.Gen == after.Gen && own.Seq < after.Seq && p.Generation() == own.Gen
}

// Follow keeps this node's replica of a partition on its master's
// timeline until ctx ends: it applies the master's commits in SCN order
// and, when its own timeline diverged (it was master before a failover),
// first truncates what the master's timeline does not contain. truncated
// is told how many events each truncation undid.
func (n *Node) Follow(ctx context.Context, db string, id int, master LogSource, truncated func(int)) error {
	p, err := n.partition(db, id)
	if err != nil {
		return err
	}
	for ctx.Err() == nil {
		res, err := master.Log(ctx, LogRequest{DB: db, Partition: id, After: p.SCN(), Wait: time.Second, Ack: true})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("partition %s/%d: read master log: %w", db, id, err)
		}
		n.roles.entry(db, id).heardFromMaster()
		if res.Diverged {
			undone, err := p.TruncateAfter(res.Common)
			if err != nil {
				return err
			}
			if truncated != nil {
				truncated(undone)
			}
			continue
		}
		if err := p.ApplyAll(res.Commits); err != nil {
			return err
		}
		if n.opts.ReplicationLag != nil {
			for _, c := range res.Commits {
				n.opts.ReplicationLag(time.Since(c.Timestamp))
			}
		}
	}
	return nil
}

// Drain brings this replica of a partition up to its old master before it
// takes over: it applies the old master's commits until the old master has
// stopped being MASTER and this replica holds its last SCN. If the old
// master cannot be reached (it died: a failover) or does not step down
// within limit, Drain returns and the caller proceeds with what it has.
func (n *Node) Drain(ctx context.Context, db string, id int, old LogSource, limit time.Duration) error {
	p, err := n.partition(db, id)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		// No waiting on the source: a relay or a stepped-down master
		// that has nothing newer says so at once.
		res, err := old.Log(ctx, LogRequest{DB: db, Partition: id, After: p.SCN()})
		if err != nil || res.Diverged {
			return nil // unreachable, timed out, or not a predecessor
		}
		if err := p.ApplyAll(res.Commits); err != nil {
			return err
		}
		if res.SourceRole != Master && p.SCN() == res.SourceSCN {
			return nil
		}
		if len(res.Commits) == 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
}

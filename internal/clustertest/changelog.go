package clustertest

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/cortado-db/cortado/client"
	"github.com/cortado-db/cortado/internal/storage"
)

// ChangeLog is what a change-stream consumer built from the events it
// applied, as a downstream system would keep them: per partition, the
// changes in order, undone after the SCN a rollback names and replaced
// by a snapshot once its last row came (a snapshot cut off midway is
// dropped: the stream resumes from the position before it, with the
// snapshot again or with the changes after that position); and every
// change that came repeated or out of commit order. Its caller
// serializes the calls.
type ChangeLog struct {
	// Token resumes after the last event applied.
	Token string
	// Parts holds, per partition, the changes as applied.
	Parts map[int][]Change
	// Rollbacks are the rollbacks met, "p<partition>→<scn>", in order;
	// Snapshots counts the snapshots begun.
	Rollbacks []string
	Snapshots int
	// SnapshotsOf counts the snapshots begun by partition.
	SnapshotsOf map[int]int
	// Problems are changes repeated or out of commit order, and events
	// without an SCN.
	Problems []string
	last     map[int]Change // per partition, the newest change seen
	// staged holds, per partition, the rows of a snapshot arriving.
	staged map[int][]Change
}

// Change is one change applied: the document's table/key and what it
// became.
type Change struct {
	SCN   storage.SCN
	Order int
	Op    string
	Key   string
	After []byte
}

// NewChangeLog starts a consumer's bookkeeping at token.
func NewChangeLog(token string) *ChangeLog {
	return &ChangeLog{Token: token, Parts: map[int][]Change{}, last: map[int]Change{}, staged: map[int][]Change{}}
}

// Apply takes one event.
func (l *ChangeLog) Apply(e *client.ChangeEvent) {
	p := e.Source.Partition
	scn, err := storage.ParseSCN(e.Source.SCN)
	if err != nil {
		l.Problems = append(l.Problems, fmt.Sprintf("an event without an SCN: %s", e.Raw))
		return
	}
	switch e.Type {
	case "rollback":
		l.Rollbacks = append(l.Rollbacks, fmt.Sprintf("p%d→%s", p, scn))
		kept := l.Parts[p][:0]
		for _, r := range l.Parts[p] {
			if !scn.Less(r.SCN) {
				kept = append(kept, r)
			}
		}
		l.Parts[p] = kept
		l.last[p] = Change{SCN: scn, Order: 1 << 30}
		delete(l.staged, p)
	case "change":
		rec := Change{SCN: scn, Op: e.Op, Key: e.Source.Table + "/" + keyPath(e.Source.Key), After: bytes.Clone(e.After)}
		if e.Op == "r" {
			if st, ok := l.staged[p]; !ok || st[0].SCN != scn {
				// A snapshot begins (one of another SCN replaces what
				// came of a snapshot cut off; one of the same SCN, sent
				// again, only repeats rows).
				l.staged[p] = nil
				l.Snapshots++
				if l.SnapshotsOf == nil {
					l.SnapshotsOf = map[int]int{}
				}
				l.SnapshotsOf[p]++
			}
			l.staged[p] = append(l.staged[p], rec)
			if e.Source.Snapshot == "last" {
				// The snapshot replaces the partition's state.
				l.Parts[p] = l.staged[p]
				delete(l.staged, p)
				l.last[p] = Change{SCN: scn, Order: 1 << 30}
			}
			break
		}
		// A snapshot cut off midway, the stream resumed with changes
		// after the position before it: the state held goes on.
		delete(l.staged, p)
		if e.Transaction != nil {
			rec.Order = e.Transaction.TotalOrder
		}
		prev := l.last[p]
		if !(prev.SCN.Less(scn) || prev.SCN == scn && prev.Order < rec.Order) {
			l.Problems = append(l.Problems, fmt.Sprintf("partition %d: %s #%d after %s #%d (repeated or out of commit order)", p, scn, rec.Order, prev.SCN, prev.Order))
		}
		l.last[p] = rec
		l.Parts[p] = append(l.Parts[p], rec)
	case "resolved":
		// Nothing after the position the stream resumed from: a
		// snapshot cut off midway is dropped.
		delete(l.staged, p)
	}
	l.Token = e.Token
}

// State replays the changes applied: table/key → the document.
func (l *ChangeLog) State() map[string][]byte {
	out := map[string][]byte{}
	for _, recs := range l.Parts {
		for _, r := range recs {
			if r.Op == "d" {
				delete(out, r.Key)
			} else {
				out[r.Key] = r.After
			}
		}
	}
	return out
}

// keyPath is a key's parts joined by "/", as a document's path names it.
func keyPath(k client.Key) string {
	parts := make([]string, len(k))
	for i, p := range k {
		parts[i] = fmt.Sprint(p)
	}
	return strings.Join(parts, "/")
}

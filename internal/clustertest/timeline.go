package clustertest

import (
	"context"
	"fmt"
	"slices"

	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/storage"
)

// Log is a replica's retained commit log of one partition: the SCN it
// starts after and the SCNs it holds, in order.
type Log struct {
	Start storage.SCN
	SCNs  []storage.SCN
}

// Agrees reports whether two replicas' logs hold the same commits where
// both hold them (after the later start): replicas on one timeline do,
// whatever each trimmed.
func (l Log) Agrees(o Log) bool {
	from := l.Start
	if from.Less(o.Start) {
		from = o.Start
	}
	after := func(s []storage.SCN) []storage.SCN {
		i, _ := slices.BinarySearchFunc(s, from, func(a, b storage.SCN) int {
			if a.Less(b) {
				return -1
			}
			if b.Less(a) {
				return 1
			}
			return 0
		})
		for i < len(s) && !from.Less(s[i]) {
			i++
		}
		return s[i:]
	}
	return slices.Equal(after(l.SCNs), after(o.SCNs))
}

func (l Log) String() string {
	if len(l.SCNs) == 0 {
		return fmt.Sprintf("no commits after %s", l.Start)
	}
	return fmt.Sprintf("%d commits after %s, to %s", len(l.SCNs), l.Start, l.SCNs[len(l.SCNs)-1])
}

// Timeline reads a replica's retained commit log of one partition
// (through its internal API at url).
func Timeline(url, db string, p int) (Log, error) {
	r := node.NewRemote(url)
	defer r.Close()
	ctx := context.Background()
	st, err := r.Status(ctx, node.StatusRequest{DB: db})
	if err != nil {
		return Log{}, err
	}
	var out Log
	for _, ps := range st {
		if ps.Partition == p {
			out.Start = ps.LogStart
		}
	}
	after := out.Start
	for {
		res, err := r.Log(ctx, node.LogRequest{DB: db, Partition: p, After: after, Max: 1000})
		if err != nil {
			return Log{}, err
		}
		if res.Trimmed {
			// Trimmed meanwhile: start over from the new start.
			out, after = Log{Start: res.LogStart}, res.LogStart
			continue
		}
		if len(res.Commits) == 0 {
			return out, nil
		}
		for _, c := range res.Commits {
			out.SCNs = append(out.SCNs, c.SCN)
		}
		after = out.SCNs[len(out.SCNs)-1]
	}
}

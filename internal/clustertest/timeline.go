package clustertest

import (
	"context"

	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/storage"
)

// Timeline reads a replica's whole commit log of one partition (through
// its internal API at url) and returns its SCNs in order: replicas on one
// timeline return the same sequence.
func Timeline(url, db string, p int) ([]storage.SCN, error) {
	r := node.NewRemote(url)
	defer r.Close()
	var out []storage.SCN
	after := storage.SCN{}
	for {
		res, err := r.Log(context.Background(), node.LogRequest{DB: db, Partition: p, After: after, Max: 1000})
		if err != nil {
			return nil, err
		}
		if len(res.Commits) == 0 {
			return out, nil
		}
		for _, c := range res.Commits {
			out = append(out, c.SCN)
		}
		after = out[len(out)-1]
	}
}

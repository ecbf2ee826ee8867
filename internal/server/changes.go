package server

import (
	"github.com/cortado-db/cortado/internal/node"
)

// localSources serves a single node's change stream from the node itself.
type localSources struct{ n *node.Node }

func (s localSources) Log(string, int) (node.LogSource, error)        { return s.n, nil }
func (s localSources) Snapshot(string, int) (node.Snapshotter, error) { return s.n, nil }
func (s localSources) Master(string, int) (node.Acker, error)         { return s.n, nil }

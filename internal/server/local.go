package server

import (
	"context"
	"sync/atomic"

	"github.com/cortado-db/cortado/internal/node"
)

// localNode is a storage node of this process as this process's router
// calls it: the node itself, without the wire. A call whose deadline has
// passed is dropped before it starts and counted, as the node's internal
// API drops and counts it. It does not take a slot of the node's limiter:
// the limiter guards a node against the routers of other processes, and
// here the process's own admission (the document API's) already bounds
// what its router sends — as with a single node, which has no other.
// Through the limiter, 32 closed-loop writers (a bulk load) were refused
// as overloaded once its queue's 100 ms had passed, where over the wire
// the router's connection held them back instead. A router of `serve
// --nodes N` reaches its N nodes this way, and replication inside the
// process (the relay's pulls, the slaves' reads and acknowledgements) calls
// them directly too (node.LocalPeers). CockroachDB calls its own node the
// same way.
type localNode struct {
	n       *node.Node
	expired *atomic.Uint64
}

var _ node.Service = (*localNode)(nil)

// InProcess implements node.InProcess.
func (c *localNode) InProcess() bool { return true }

// call runs f on the node unless ctx has ended: a call whose context
// ended is dropped and counted, as the internal API's interceptor does.
func call[Req, Res any](c *localNode, ctx context.Context, f func(*node.Node, context.Context, Req) (Res, error), req Req) (Res, error) {
	if err := ctx.Err(); err != nil {
		c.expired.Add(1)
		var zero Res
		return zero, err
	}
	return f(c.n, ctx, req)
}

func (c *localNode) Get(ctx context.Context, req node.GetRequest) (*node.Item, error) {
	return call(c, ctx, (*node.Node).Get, req)
}

func (c *localNode) MultiGet(ctx context.Context, req node.MultiGetRequest) (*node.MultiGetResult, error) {
	return call(c, ctx, (*node.Node).MultiGet, req)
}

func (c *localNode) Scan(ctx context.Context, req node.ScanRequest) (*node.ScanResult, error) {
	return call(c, ctx, (*node.Node).Scan, req)
}

func (c *localNode) Write(ctx context.Context, req node.WriteRequest) (*node.WriteResult, error) {
	return call(c, ctx, (*node.Node).Write, req)
}

package server

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/cortado-db/cortado/internal/admission"
	"github.com/cortado-db/cortado/internal/node"
)

// localNode is a storage node of this process as this process's router
// calls it: the node itself, without the wire, admitted by the limiter
// its internal API admits calls with (the same bound, the same count of
// calls dropped because their deadline had passed). A router of `serve
// --nodes N` reaches its N nodes this way; replication (relay, slaves)
// still goes over the wire. CockroachDB calls its own node the same way.
type localNode struct {
	id      string
	n       *node.Node
	l       *admission.Limiter
	expired *atomic.Uint64
}

var _ node.Service = (*localNode)(nil)

// InProcess implements router.InProcess.
func (c *localNode) InProcess() bool { return true }

// admit takes a slot as the internal API's interceptor does, failing as a
// remote call that met the same refusal fails.
func (c *localNode) admit(ctx context.Context) (func(), error) {
	if err := ctx.Err(); err != nil {
		c.expired.Add(1)
		return nil, err
	}
	release, err := c.l.Acquire(ctx, admission.Interactive)
	if err != nil {
		if ctx.Err() != nil {
			c.expired.Add(1)
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("storage node %s: %w: at its limit of calls in progress and queued", c.id, node.ErrOverloaded)
	}
	return release, nil
}

func (c *localNode) Get(ctx context.Context, req node.GetRequest) (*node.Item, error) {
	release, err := c.admit(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	return c.n.Get(ctx, req)
}

func (c *localNode) MultiGet(ctx context.Context, req node.MultiGetRequest) ([]*node.Item, error) {
	release, err := c.admit(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	return c.n.MultiGet(ctx, req)
}

func (c *localNode) Scan(ctx context.Context, req node.ScanRequest) (*node.ScanResult, error) {
	release, err := c.admit(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	return c.n.Scan(ctx, req)
}

func (c *localNode) Write(ctx context.Context, req node.WriteRequest) (*node.WriteResult, error) {
	release, err := c.admit(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	return c.n.Write(ctx, req)
}

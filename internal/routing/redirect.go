package routing

import (
	"context"
	"errors"
	"time"

	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/topo"
)

// redirecting is a partition's master as the router's routing table names
// it. A request that node refuses as a slave naming a master of a newer
// generation than the table's (node.NotMasterError: the router has not
// heard from etcd since, or not yet) is sent once to that master, if the
// table knows it at the same URL. Nothing was done on the refusal, so the
// request is not repeated; the named node refuses it in turn if it is no
// master either.
type redirecting struct {
	node.Service
	v    *RoutingView
	t    *topo.RoutingTable
	part int
}

// named is the master err names, if the request should go there.
func (s redirecting) named(err error) node.Service {
	var nm *node.NotMasterError
	if !errors.As(err, &nm) || nm.Hint.Generation <= s.t.Partitions[s.part].Generation {
		return nil
	}
	if url, ok := s.t.Nodes[nm.Hint.ID]; !ok || url != nm.Hint.URL {
		return nil
	}
	return s.v.service(s.t, nm.Hint.ID, nm.Hint.URL)
}

func (s redirecting) Get(ctx context.Context, req node.GetRequest) (*node.Item, error) {
	it, err := s.Service.Get(ctx, req)
	if m := s.named(err); m != nil {
		return m.Get(ctx, req)
	}
	return it, err
}

func (s redirecting) MultiGet(ctx context.Context, req node.MultiGetRequest) ([]*node.Item, error) {
	items, err := s.Service.MultiGet(ctx, req)
	if m := s.named(err); m != nil {
		return m.MultiGet(ctx, req)
	}
	return items, err
}

func (s redirecting) Scan(ctx context.Context, req node.ScanRequest) (*node.ScanResult, error) {
	res, err := s.Service.Scan(ctx, req)
	if m := s.named(err); m != nil {
		return m.Scan(ctx, req)
	}
	return res, err
}

func (s redirecting) Write(ctx context.Context, req node.WriteRequest) (*node.WriteResult, error) {
	res, err := s.Service.Write(ctx, req)
	if m := s.named(err); m != nil {
		return m.Write(ctx, req)
	}
	return res, err
}

// Addr, InProcess and Quiet are the named master's (see reporting).
func (s redirecting) Addr() string {
	if a, ok := s.Service.(interface{ Addr() string }); ok {
		return a.Addr()
	}
	return ""
}

func (s redirecting) InProcess() bool { return node.IsInProcess(s.Service) }

func (s redirecting) Quiet() time.Duration {
	if q, ok := s.Service.(interface{ Quiet() time.Duration }); ok {
		return q.Quiet()
	}
	return 0
}

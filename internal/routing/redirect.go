package routing

import (
	"context"
	"errors"
	"time"

	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/topo"
)

// redirecting is a partition's master as the router's routing table names
// it, for a router that may not have heard of a newer table:
//
//   - A request the node refuses as a slave naming a master of a newer
//     generation than the table's (node.NotMasterError) is sent once to
//     that master, if the table knows it at the same URL.
//
//   - A request that never reached the node (node.ErrNotDelivered), sent
//     while the router's registration in etcd has lapsed (it is cut off,
//     so its table may be stale), is sent to the table's slaves in turn
//     instead: one that has become master does it, one that follows a
//     newer master names it as above.
//
//   - A request the master refuses as not (yet) master while its table
//     says it is taking the partition over from a live master (a planned
//     hand-over: a node stopping cleanly, a node given its partitions
//     back) is asked again, every handOverPoll for up to HandOverWait,
//     of the master the newest table names: the new master takes over
//     once it has drained the old one, and the caller sees a short wait,
//     not a 503.
//
// Each refusal and each undelivered request did nothing, so no request is
// done twice; whichever node gets it decides for itself whether it is the
// master.
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
	s.v.toNamed.Add(1)
	return s.v.service(s.t, nm.Hint.ID, nm.Hint.URL)
}

// HandOverWait bounds how long a request waits for a planned hand-over
// to complete (redirecting); handOverPoll is how often it asks again.
const (
	HandOverWait = 2 * time.Second
	handOverPoll = 10 * time.Millisecond
)

// redirect makes call, which the table's master answered with res and
// err, to another node as redirecting says, and waits out a planned
// hand-over.
func redirect[R any](ctx context.Context, s redirecting, res R, err error, call func(node.Service) (R, error)) (R, error) {
	res, err = redirectOnce(s, res, err, call)
	deadline := time.Now().Add(HandOverWait)
	for errors.Is(err, node.ErrNotMaster) && time.Now().Before(deadline) {
		t := s.v.Table(s.t.DB)
		if t == nil || s.part >= len(t.Partitions) || t.Partitions[s.part].From == "" {
			break // no planned hand-over under way
		}
		id, url := t.Master(s.part)
		if url == "" {
			break
		}
		tm := time.NewTimer(handOverPoll)
		select {
		case <-ctx.Done():
			tm.Stop()
			return res, err
		case <-tm.C:
		}
		next := redirecting{Service: s.v.service(t, id, url), v: s.v, t: t, part: s.part}
		res, err = call(next.Service)
		if err != nil {
			res, err = redirectOnce(next, res, err, call)
		}
	}
	return res, err
}

// redirectOnce makes call, which the table's master answered with res
// and err, to another node as redirecting says.
func redirectOnce[R any](s redirecting, res R, err error, call func(node.Service) (R, error)) (R, error) {
	if m := s.named(err); m != nil {
		return call(m)
	}
	if !errors.Is(err, node.ErrNotDelivered) {
		return res, err
	}
	if _, lapsed := s.v.RegistrationLapsed(); !lapsed {
		return res, err
	}
	for _, slave := range s.v.slavesOf(s.t, s.part) {
		s.v.toSlaves.Add(1)
		r, serr := call(slave)
		if m := s.named(serr); m != nil {
			return call(m)
		}
		if errors.Is(serr, node.ErrNotDelivered) || errors.Is(serr, node.ErrNotMaster) {
			continue // down too, or a slave that names no newer master
		}
		return r, serr
	}
	return res, err
}

func (s redirecting) Get(ctx context.Context, req node.GetRequest) (*node.Item, error) {
	res, err := s.Service.Get(ctx, req)
	if err == nil {
		return res, nil
	}
	return redirect(ctx, s, res, err, func(n node.Service) (*node.Item, error) { return n.Get(ctx, req) })
}

func (s redirecting) MultiGet(ctx context.Context, req node.MultiGetRequest) (*node.MultiGetResult, error) {
	res, err := s.Service.MultiGet(ctx, req)
	if err == nil {
		return res, nil
	}
	return redirect(ctx, s, res, err, func(n node.Service) (*node.MultiGetResult, error) { return n.MultiGet(ctx, req) })
}

func (s redirecting) Scan(ctx context.Context, req node.ScanRequest) (*node.ScanResult, error) {
	res, err := s.Service.Scan(ctx, req)
	if err == nil {
		return res, nil
	}
	return redirect(ctx, s, res, err, func(n node.Service) (*node.ScanResult, error) { return n.Scan(ctx, req) })
}

func (s redirecting) Write(ctx context.Context, req node.WriteRequest) (*node.WriteResult, error) {
	res, err := s.Service.Write(ctx, req)
	if err == nil {
		return res, nil
	}
	return redirect(ctx, s, res, err, func(n node.Service) (*node.WriteResult, error) { return n.Write(ctx, req) })
}

// Addr, InProcess and Quiet are the table's master's (see reporting).
func (s redirecting) Addr() string {
	if a, ok := s.Service.(interface{ Addr() string }); ok {
		return a.Addr()
	}
	return ""
}

func (s redirecting) InProcess() bool { return node.IsInProcess(s.Service) }

func (s redirecting) Quiet() time.Duration { return quietOf(s.Service) }

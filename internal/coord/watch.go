package coord

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Change is what happened under a watched prefix. A Reset carries every
// key there is (KVs): the receiver replaces whatever it knew. Otherwise
// Events are the changes since the last Change, in order.
type Change struct {
	Reset  bool
	KVs    []*mvccpb.KeyValue
	Events []*clientv3.Event
	// Rev is the etcd revision the receiver is now up to date with.
	Rev int64
}

// Puts is every key-value the change put: all of a Reset's keys, or
// those of its put events, in order. For receivers that only ever add or
// replace what they know.
func (c Change) Puts() []*mvccpb.KeyValue {
	out := c.KVs
	for _, ev := range c.Events {
		if ev.Type == clientv3.EventTypePut {
			out = append(out, ev.Kv)
		}
	}
	return out
}

// Watcher follows every key under a prefix: it lists them (a Reset), then
// passes on each change from that revision. It never stops on its own
// before its context ends: a watch that breaks (etcd restarted, the
// channel closed, a lost leader) is resumed after the last revision seen,
// and one whose revision was compacted starts over with a new Reset, after
// a backoff of 50 ms doubling to 2 s while etcd keeps failing. One
// goroutine, owned by the context passed to Watch; Done is closed when it
// has returned.
type Watcher struct {
	c    chan Change
	done chan struct{}
}

// Watch starts a Watcher of prefix; it runs until ctx ends.
func Watch(ctx context.Context, cli *clientv3.Client, prefix string) *Watcher {
	w := &Watcher{c: make(chan Change), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.run(ctx, cli, prefix)
	}()
	return w
}

// Changes delivers the changes, a Reset first.
func (w *Watcher) Changes() <-chan Change { return w.c }

// Done is closed when the watcher has stopped (its context ended).
func (w *Watcher) Done() <-chan struct{} { return w.done }

// Each calls fn with every change, in order, until the watcher stops.
func (w *Watcher) Each(fn func(Change)) {
	for {
		select {
		case <-w.done:
			return
		case c := <-w.c:
			fn(c)
		}
	}
}

const (
	watchBackoffMin = 50 * time.Millisecond
	watchBackoffMax = 2 * time.Second
)

func (w *Watcher) run(ctx context.Context, cli *clientv3.Client, prefix string) {
	backoff := watchBackoffMin
	pause := func() {
		t := time.NewTimer(backoff)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		backoff = min(2*backoff, watchBackoffMax)
	}
	var rev int64 // 0: list first
	for ctx.Err() == nil {
		if rev == 0 {
			resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
			if err != nil {
				pause()
				continue
			}
			rev = resp.Header.Revision
			if !w.send(ctx, Change{Reset: true, KVs: resp.Kvs, Rev: rev}) {
				return
			}
		}
		// The leader requirement makes a watch on a member cut off from
		// its cluster fail instead of going silent.
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for wr := range cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
			if err := wr.Err(); err != nil {
				if wr.CompactRevision > 0 || errors.Is(err, rpctypes.ErrCompacted) {
					rev = 0 // what we missed is gone: list again
				}
				break
			}
			if len(wr.Events) == 0 {
				continue // progress notification
			}
			backoff = watchBackoffMin
			rev = wr.Header.Revision
			if !w.send(ctx, Change{Events: wr.Events, Rev: rev}) {
				cancel()
				return
			}
		}
		cancel()
		pause()
	}
}

func (w *Watcher) send(ctx context.Context, c Change) bool {
	select {
	case w.c <- c:
		return true
	case <-ctx.Done():
		return false
	}
}

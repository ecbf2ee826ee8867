package topo

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/cortado-db/cortado/internal/coord"
)

// RegisterRelay publishes a relay's URL under a lease of ttlSeconds until
// ctx ends; slaves then read their masters' logs through it. The relay's
// process record (build and protocol) goes under the same lease.
func RegisterRelay(ctx context.Context, cli *clientv3.Client, prefix string, p Process, ttlSeconds int) (*Registration, error) {
	p.Role = RoleRelay
	return PutLeased(ctx, cli, RelaysPrefix(prefix)+p.ID, p.URL, ttlSeconds, p.KV(prefix))
}

// Registration is a key kept under a lease by PutLeased until its context
// ends; Done is closed when the goroutine keeping it has returned.
type Registration struct {
	done chan struct{}

	mu     sync.Mutex
	lapsed time.Time // when the lease was found lapsed; zero while held
}

// Done is closed once the registration is no longer kept.
func (r *Registration) Done() <-chan struct{} { return r.done }

// Lapsed says since when the lease has not been held (its keep-alives
// went unanswered for its TTL: etcd restarted, or is unreachable), while
// the registration is being made again.
func (r *Registration) Lapsed() (since time.Time, lapsed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lapsed, !r.lapsed.IsZero()
}

func (r *Registration) setLapsed(t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lapsed = t
}

// KV is one key and its value.
type KV struct{ Key, Value string }

// PutLeased puts key=value, and the also entries, in one transaction
// under a lease kept alive until ctx ends (or the process dies, when it
// lapses after ttlSeconds). The first registration happens before it
// returns; if the lease is lost later (etcd restarted or was unreachable
// past the TTL) it registers again under a new one.
func PutLeased(ctx context.Context, cli *clientv3.Client, key, value string, ttlSeconds int, also ...KV) (*Registration, error) {
	register := func() (*concurrency.Session, error) {
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(ttlSeconds), concurrency.WithContext(ctx))
		if err != nil {
			return nil, err
		}
		puts := []clientv3.Op{clientv3.OpPut(key, value, clientv3.WithLease(s.Lease()))}
		for _, kv := range also {
			puts = append(puts, clientv3.OpPut(kv.Key, kv.Value, clientv3.WithLease(s.Lease())))
		}
		if _, err := cli.Txn(ctx).Then(puts...).Commit(); err != nil {
			coord.EndSession(cli, s)
			return nil, err
		}
		return s, nil
	}
	s, err := register()
	if err != nil {
		return nil, err
	}
	reg := &Registration{done: make(chan struct{})}
	go func() {
		defer close(reg.done)
		for {
			select {
			case <-ctx.Done():
				coord.EndSession(cli, s)
				return
			case <-s.Done(): // the lease lapsed: register again
			}
			reg.setLapsed(time.Now())
			coord.EndSession(cli, s)
			for {
				if s, err = register(); err == nil {
					reg.setLapsed(time.Time{})
					break
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
			}
		}
	}()
	return reg, nil
}

// RelayWatch keeps the URL of a registered relay ("" if none): the one
// with the lowest key, so every node picks the same.
type RelayWatch struct {
	mu   sync.Mutex
	url  string
	all  []string
	done chan struct{}
}

// URL returns the relay every node reads through ("" if none).
func (w *RelayWatch) URL() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.url
}

// URLs returns every registered relay's URL, in key order.
func (w *RelayWatch) URLs() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.all
}

// WatchRelays follows the registered relays until ctx ends; Done is
// closed when it has stopped.
func WatchRelays(ctx context.Context, cli *clientv3.Client, prefix string) *RelayWatch {
	rw := &RelayWatch{done: make(chan struct{})}
	w := coord.Watch(ctx, cli, RelaysPrefix(prefix))
	go func() {
		defer close(rw.done)
		relays := map[string]string{}
		for {
			select {
			case <-w.Done():
				return
			case c := <-w.Changes():
				if c.Reset {
					clear(relays)
				}
				for _, kv := range c.KVs {
					relays[string(kv.Key)] = string(kv.Value)
				}
				for _, ev := range c.Events {
					if ev.Type == clientv3.EventTypePut {
						relays[string(ev.Kv.Key)] = string(ev.Kv.Value)
					} else {
						delete(relays, string(ev.Kv.Key))
					}
				}
				ids := slices.Sorted(maps.Keys(relays))
				all := make([]string, len(ids))
				for i, id := range ids {
					all[i] = relays[id]
				}
				url := ""
				if len(all) > 0 {
					url = all[0]
				}
				rw.mu.Lock()
				rw.url, rw.all = url, all
				rw.mu.Unlock()
			}
		}
	}()
	return rw
}

// Done is closed when the watch has stopped.
func (w *RelayWatch) Done() <-chan struct{} { return w.done }

package cluster

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// RegisterRelay publishes a relay's URL under a lease of ttlSeconds until
// ctx ends; slaves then read their masters' logs through it.
func RegisterRelay(ctx context.Context, cli *clientv3.Client, prefix, id, url string, ttlSeconds int) error {
	return putLeased(ctx, cli, relaysPrefix(prefix)+id, url, ttlSeconds)
}

// putLeased puts key=value under a lease kept alive until ctx ends (or the
// process dies, when it lapses after ttlSeconds). The first registration
// happens before it returns; if the lease is lost later (etcd restarted
// or was unreachable past the TTL) it registers again under a new one.
func putLeased(ctx context.Context, cli *clientv3.Client, key, value string, ttlSeconds int) error {
	register := func() (*concurrency.Session, error) {
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(ttlSeconds), concurrency.WithContext(ctx))
		if err != nil {
			return nil, err
		}
		if _, err := cli.Put(ctx, key, value, clientv3.WithLease(s.Lease())); err != nil {
			s.Close()
			return nil, err
		}
		return s, nil
	}
	s, err := register()
	if err != nil {
		return err
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				s.Close()
				return
			case <-s.Done(): // the lease lapsed: register again
			}
			s.Close()
			for {
				if s, err = register(); err == nil {
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
	return nil
}

// relayWatch keeps the URL of a registered relay ("" if none).
type relayWatch struct {
	mu  sync.Mutex
	url string
}

func (w *relayWatch) get() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.url
}

// watchRelays follows the registered relays until ctx ends.
func watchRelays(ctx context.Context, cli *clientv3.Client, prefix string) *relayWatch {
	w := &relayWatch{}
	load := func() int64 {
		resp, err := cli.Get(ctx, relaysPrefix(prefix), clientv3.WithPrefix(), clientv3.WithLimit(1))
		if err != nil {
			return 0
		}
		w.mu.Lock()
		w.url = ""
		if len(resp.Kvs) > 0 {
			w.url = string(resp.Kvs[0].Value)
		}
		w.mu.Unlock()
		return resp.Header.Revision
	}
	rev := load()
	go func() {
		for ctx.Err() == nil {
			for range cli.Watch(ctx, relaysPrefix(prefix), clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
				rev = load()
			}
		}
	}()
	return w
}

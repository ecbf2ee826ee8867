package topo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Member is a storage node's registration: its NodeInfo under an etcd
// lease that it keeps alive. When the process dies, is paused or is cut
// off, the lease lapses after its TTL and the controller sees the node
// gone. The member knows a lower bound of its own lease's life (Valid), so
// a master that was paused stops writing before it hears it was expelled;
// when it hears (Lost), it rejoins under a new lease, a new incarnation.
type Member struct {
	cli    *clientv3.Client
	prefix string
	ttl    int
	log    *slog.Logger

	mu         sync.Mutex
	info       NodeInfo
	lease      clientv3.LeaseID
	validUntil time.Time
	lost       chan struct{}
	cancel     context.CancelFunc
	done       chan struct{}
}

// Join registers a node with a lease of ttlSeconds and keeps it alive
// until Leave or Abandon.
func Join(ctx context.Context, cli *clientv3.Client, prefix string, info NodeInfo, ttlSeconds int, log *slog.Logger) (*Member, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Member{cli: cli, prefix: prefix, ttl: ttlSeconds, log: log, info: info, lost: make(chan struct{}), done: make(chan struct{})}
	if err := m.register(ctx); err != nil {
		return nil, err
	}
	kctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	go m.keepAlive(kctx)
	return m, nil
}

// register takes a new lease and publishes the node under it.
func (m *Member) register(ctx context.Context) error {
	sent := time.Now()
	g, err := m.cli.Grant(ctx, int64(m.ttl))
	if err != nil {
		return fmt.Errorf("node %s: lease: %w", m.info.ID, err)
	}
	m.mu.Lock()
	m.info.Incarnation = int64(g.ID)
	info := m.info
	m.mu.Unlock()
	if err := m.publish(ctx, info, g.ID); err != nil {
		m.cli.Revoke(context.Background(), g.ID)
		return fmt.Errorf("node %s: register: %w", info.ID, err)
	}
	m.mu.Lock()
	m.lease = g.ID
	m.validUntil = sent.Add(m.validity(g.TTL))
	m.mu.Unlock()
	return nil
}

// validity is how long after a keep-alive was sent the lease is certainly
// still held: its TTL less a margin for clock-rate differences.
func (m *Member) validity(ttl int64) time.Duration {
	return time.Duration(ttl) * time.Second * 9 / 10
}

func (m *Member) keepAlive(ctx context.Context) {
	defer close(m.done)
	every := time.Duration(m.ttl) * time.Second / 4
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.mu.Lock()
		lease := m.lease
		m.mu.Unlock()
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, every)
		resp, err := m.cli.KeepAliveOnce(rctx, lease)
		cancel()
		switch {
		case err == nil:
			m.mu.Lock()
			m.validUntil = sent.Add(m.validity(resp.TTL))
			m.mu.Unlock()
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			// Expelled: the controller has moved on without us.
			m.log.Warn("membership lease lost; rejoining", "node", m.info.ID)
			m.mu.Lock()
			close(m.lost)
			m.lost = make(chan struct{})
			m.mu.Unlock()
			for ctx.Err() == nil {
				if err := m.register(ctx); err == nil {
					break
				}
				sleep(ctx, every)
			}
		default:
			// etcd unreachable: try again; Valid turns false on its own
			// once the lease may have lapsed.
		}
	}
}

// Valid reports whether the lease is certainly still held.
func (m *Member) Valid() bool {
	_, valid := m.Held()
	return valid
}

// Held returns the current lease (the incarnation) and whether it is
// certainly still held, read together: a write that began under one
// lease is acknowledged only while that same lease is held.
func (m *Member) Held() (lease int64, valid bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int64(m.lease), time.Now().Before(m.validUntil)
}

// Lost is closed when the current incarnation's lease turned out to have
// lapsed: the node must fence itself. The member has already begun to
// rejoin; call Lost again for the next incarnation's channel.
func (m *Member) Lost() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lost
}

// Incarnation is the current lease.
func (m *Member) Incarnation() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int64(m.lease)
}

// Drain republishes the node's registration, under the same lease, as
// draining (NodeInfo.Draining): the controller moves its masterships to
// other replicas. It stays draining if it must rejoin.
func (m *Member) Drain(ctx context.Context) error {
	m.mu.Lock()
	m.info.Draining = true
	info, lease := m.info, m.lease
	m.mu.Unlock()
	return m.publish(ctx, info, lease)
}

// publish puts the node's registration, info, under lease.
func (m *Member) publish(ctx context.Context, info NodeInfo, lease clientv3.LeaseID) error {
	val, _ := json.Marshal(info)
	_, err := m.cli.Put(ctx, NodeKey(m.prefix, info.ID), string(val), clientv3.WithLease(lease))
	return err
}

// Leave revokes the lease: the node is gone at once. From the moment
// Leave is called Held reports the lease lost, so that nothing begun under
// it is acknowledged once the controller may have moved on.
func (m *Member) Leave() error {
	m.mu.Lock()
	m.validUntil = time.Time{}
	m.mu.Unlock()
	m.cancel()
	<-m.done
	m.mu.Lock()
	lease := m.lease
	m.validUntil = time.Time{} // a renewal in flight at the first reset may have set it again
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := m.cli.Revoke(ctx, lease)
	return err
}

// Abandon stops renewing the lease without revoking it, as a crashed
// process would: the node disappears when the TTL lapses.
func (m *Member) Abandon() {
	m.cancel()
	<-m.done
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

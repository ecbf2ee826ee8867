// Package coord owns Cortado's connection to etcd, its coordination
// service: starting an embedded single-member etcd for `cortado serve` and
// tests, and opening clients to an external etcd cluster. It never stores
// Cortado data itself; the registry and cluster manager do, through the
// clients it hands out.
package coord

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Where an embedded etcd listens unless told otherwise.
const (
	DefaultClientURL = "http://127.0.0.1:2379"
	DefaultPeerURL   = "http://127.0.0.1:2380"
)

// EmbeddedOptions configures an in-process etcd.
type EmbeddedOptions struct {
	// Dir holds etcd's data (WAL and snapshots).
	Dir string
	// ClientURL is where etcd listens for clients (default
	// http://127.0.0.1:2379).
	ClientURL string
	// PeerURL is where etcd listens for peers (default
	// http://127.0.0.1:2380). A single member never gets peer traffic,
	// but etcd needs the address.
	PeerURL string
}

// Embedded is a running in-process etcd.
type Embedded struct {
	etcd *embed.Etcd
	// Endpoint is the client URL to connect to.
	Endpoint string
	// Options are the options it was started with, defaults filled in:
	// starting again with them reopens the same member.
	Options EmbeddedOptions
}

// StartEmbedded starts a single-member etcd and waits until it serves.
func StartEmbedded(opts EmbeddedOptions) (*Embedded, error) {
	if opts.ClientURL == "" {
		opts.ClientURL = DefaultClientURL
	}
	if opts.PeerURL == "" {
		opts.PeerURL = DefaultPeerURL
	}
	cu, err := url.Parse(opts.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("etcd client url: %w", err)
	}
	pu, err := url.Parse(opts.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("etcd peer url: %w", err)
	}
	cfg := embed.NewConfig()
	cfg.Name = "cortado"
	cfg.Dir = filepath.Clean(opts.Dir)
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd in %s: %w", opts.Dir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, fmt.Errorf("embedded etcd in %s not ready after 30s", opts.Dir)
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd: %w", err)
	}
	return &Embedded{etcd: e, Endpoint: cu.String(), Options: opts}, nil
}

// StartLoopback starts a single-member etcd in dir on free loopback ports.
// A port found free can be taken by another process before etcd binds it;
// then it tries again with new ports, a few times.
func StartLoopback(dir string) (*Embedded, error) {
	for attempt := 1; ; attempt++ {
		cu, err := FreeLoopbackURL()
		if err != nil {
			return nil, err
		}
		pu, err := FreeLoopbackURL()
		if err != nil {
			return nil, err
		}
		e, err := StartEmbedded(EmbeddedOptions{Dir: dir, ClientURL: cu, PeerURL: pu})
		if err != nil && IsAddrInUse(err) && attempt < 8 {
			// etcd may have written its member's peer URL already.
			if rerr := os.RemoveAll(dir); rerr != nil {
				return nil, rerr
			}
			continue
		}
		return e, err
	}
}

// IsAddrInUse reports whether err is a listener's "address already in
// use", the error of a port another process took first.
func IsAddrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || (err != nil && strings.Contains(err.Error(), "address already in use"))
}

// Close stops etcd and waits for it.
func (e *Embedded) Close() { e.etcd.Close() }

// Connect opens a client to endpoints.
func Connect(ctx context.Context, endpoints []string) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Context:     ctx,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("connect to etcd %v: %w", endpoints, err)
	}
	// Fail fast when nothing answers, instead of on first use.
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := cli.Get(sctx, "/cortado/ping"); err != nil {
		cli.Close()
		return nil, fmt.Errorf("etcd %v does not answer: %w", endpoints, err)
	}
	return cli, nil
}

// FreeLoopbackURL returns an http URL on a loopback port that was free a
// moment ago, for tests and for embedded mode. The port is below the
// kernel's ephemeral range when it can be (ip_local_port_range): a port
// of that range, once let go, may become the source port of any outgoing
// connection meanwhile, and a process that listens on it later (etcd
// restarted on the URLs it was given first, as a restarted serve does)
// then fails with "address already in use" — it did, once in a CI run.
// A port below the range is taken only by another listener.
func FreeLoopbackURL() (string, error) {
	if lo, ok := ephemeralStart(); ok && lo > minFixedPort+1 {
		for range 32 {
			port := minFixedPort + rand.IntN(lo-minFixedPort)
			if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
				l.Close()
				return fmt.Sprintf("http://127.0.0.1:%d", port), nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return "http://" + l.Addr().String(), nil
}

// minFixedPort is the lowest port FreeLoopbackURL picks below the
// ephemeral range (above the ports services commonly take).
const minFixedPort = 10000

// ephemeralStart reads the first port of the kernel's ephemeral range.
func ephemeralStart() (int, bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, false
	}
	lo, err := strconv.Atoi(f[0])
	return lo, err == nil
}

// EndSession ends a session and revokes its lease at once, so that the
// keys under it (a registration, a controller's leadership) go with it.
// Session.Close revokes under the context the session was made with,
// which at shutdown is the caller's, already ended: the revoke failed and
// the keys stayed for the lease's TTL (a restarted serve waited that long
// for a controller, and routers and slaves kept using a stopped relay).
func EndSession(cli *clientv3.Client, s *concurrency.Session) error {
	s.Orphan()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := cli.Revoke(ctx, s.Lease())
	return err
}

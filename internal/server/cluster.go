package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/agent"
	"github.com/cortado-db/cortado/internal/controller"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/problem"
	"github.com/cortado-db/cortado/internal/relay"
	"github.com/cortado-db/cortado/internal/release"
	"github.com/cortado-db/cortado/internal/router"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
	"github.com/cortado-db/cortado/internal/topo"
	"github.com/cortado-db/cortado/internal/wire"
)

// member is one storage node in a cluster: its engine and node, its
// membership lease, and the agent that carries out the routing tables.
type member struct {
	id     string
	engine *storage.Engine
	node   *node.Node
	member *topo.Member
	cancel context.CancelFunc
	done   chan struct{}
	// drainFor is how long a clean stop waits for the node's masterships
	// to move (drain); zero: it does not wait.
	drainFor time.Duration
}

// startMember opens a storage node in dir, registers it as id at url
// (where its internal API is served) and starts its agent.
func (s *Server) startMember(ctx context.Context, dir, id, url string, plans *schema.Plans) (*member, error) {
	if url == "" {
		return nil, errors.New("a storage node needs the URL its internal API is reached at")
	}
	if id == "" {
		id = strings.TrimPrefix(strings.TrimPrefix(url, "http://"), "https://")
	}
	opts, err := s.storageOptions(ctx)
	if err != nil {
		return nil, err
	}
	eng, err := storage.Open(filepath.Join(dir, "storage"), opts)
	if err != nil {
		return nil, err
	}
	s.Metrics.RegisterPebble(id, eng)
	m := &member{id: id, engine: eng, node: node.New(eng, s.reg, plans, s.opts.Logger, node.Options{
		ReplicationLag:         func(d time.Duration) { s.cluster.Lag.Observe(d.Seconds()) },
		AckLag:                 func(d time.Duration) { s.cluster.AckLag.Observe(d.Seconds()) },
		Retained:               s.retained,
		IndexBuilding:          s.indexBuilding(id),
		SnapshotBytesPerSecond: s.opts.SnapshotBytesPerSecond,
		WriteBytes:             s.opts.WriteBytes,
	})}
	s.members = append(s.members, m)
	info := topo.NodeInfo{ID: id, URL: url, Rack: s.opts.Rack, Build: release.Get().Revision, Protocol: s.opts.ProtocolVersion}
	if m.member, err = topo.Join(ctx, s.cli, s.opts.Prefix, info, s.opts.LeaseTTL, s.opts.Logger); err != nil {
		return nil, err
	}
	m.node.RequireLease(m.member.Held)
	actx, cancel := context.WithCancel(context.Background())
	m.cancel, m.done = cancel, make(chan struct{})
	a := &agent.Agent{
		Client: s.cli, Prefix: s.opts.Prefix, ID: id, Node: m.node, Member: m.member,
		Log: s.opts.Logger.With("node", id), MaxTransitions: s.opts.MaxTransitions, ProtocolVersion: s.opts.ProtocolVersion, Local: s.peers,
		Truncated: func(n int) { s.cluster.Truncated.Add(float64(n)) },
		Rebuilt:   func(int) { s.cluster.Rebuilt.Inc() },
		Dropped:   s.cluster.CopiesDropped.Inc,
		LeftRelay: func(reason string) { s.cluster.RelayLeft.WithLabelValues(reason).Inc() },
		Alarm: func(err error) {
			s.cluster.TruncationRefused.Inc()
			s.opts.Logger.Error("replica refused to truncate acknowledged commits: an acknowledged write would have been lost", "node", id, "err", err)
		},
	}
	go func() {
		defer close(m.done)
		var wg sync.WaitGroup
		if s.opts.RetentionInterval >= 0 {
			wg.Go(func() { m.node.RunRetention(actx, s.opts.RetentionInterval) })
		}
		if s.opts.IndexBuildRate >= 0 {
			wg.Go(func() { m.node.RunIndexBuilds(actx, s.opts.IndexBuildRate) })
		}
		a.Run(actx)
		wg.Wait()
	}()
	go func() {
		// A node whose disk failed gives up its partitions at once: it
		// leaves the cluster (the controller fails them over without
		// waiting for a lease to lapse), fences them, and stays out.
		// Leaving comes first: on a stalled disk (not a full or failing
		// one) writes in flight hang in their fsync holding their
		// partitions' roles, and fencing waits for them — until the disk
		// comes back, which left the partitions without a master all the
		// while (docs/jepsen.md, stall-disk). Once left, none of those
		// writes can be acknowledged: the lease they began under is no
		// longer held (Member.Leave).
		select {
		case <-actx.Done():
		case <-eng.FailedC():
			s.opts.Logger.Error("storage failed; leaving the cluster", "node", id, "err", eng.Failed())
			if err := m.member.Leave(); err != nil {
				s.opts.Logger.Warn("leave the cluster", "node", id, "err", err)
			}
			m.node.FenceAll()
		}
	}()
	return m, nil
}

// DefaultDrainTimeout is Options.DrainTimeout's default: less than the
// 30 s most supervisors (systemd, Kubernetes) give a stopping process
// before they kill it.
const DefaultDrainTimeout = 15 * time.Second

// drain hands the partitions the node masters to other replicas before a
// clean stop, as a rolling restart needs: it marks the node's
// registration draining, so the controller makes a caught-up replica of
// each such partition master by a planned hand-over (the new master
// drains this one; writes in flight are kept), and waits until each new
// master has confirmed holding everything this replica held, or for
// drainFor. A partition with no other live replica stays; after the
// wait, leave fails over whatever did not move.
func (m *member) drain(cli *clientv3.Client, prefix string, log *slog.Logger) {
	if m.drainFor <= 0 || m.member == nil || m.engine.Failed() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.drainFor)
	defer cancel()
	log = log.With("node", m.id)
	if err := m.member.Drain(ctx); err != nil {
		log.Warn("drain: mark the node draining", "err", err)
		return
	}
	type part struct {
		db string
		id int
	}
	held := map[part]storage.SCN{} // zero while the node still masters it
	st, _ := m.node.Status(ctx, node.StatusRequest{})
	for _, p := range st {
		if p.Role == node.Master {
			held[part{p.DB, p.Partition}] = storage.SCN{}
		}
	}
	log.Info("draining: handing masterships to other replicas", "partitions", len(held))
	start := time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for ; len(held) > 0; st, _ = m.node.Status(ctx, node.StatusRequest{}) {
		tables := map[string]*topo.RoutingTable{}
		hosted := map[part]bool{}
		for _, p := range st {
			k := part{p.DB, p.Partition}
			hosted[k] = true
			at, ok := held[k]
			switch {
			case !ok:
			case p.Role == node.Master:
				if _, loaded := tables[k.db]; !loaded {
					tables[k.db], _ = topo.LoadRoutingTable(ctx, cli, prefix, k.db)
				}
				if t := tables[k.db]; t != nil && !elsewhere(t, k.id, m.id) {
					delete(held, k) // nowhere to go: it stays until leave
				}
			case at.IsZero():
				held[k] = p.SCN // stepped down holding this
				if !m.node.Confirmed(k.db, k.id).Less(p.SCN) {
					delete(held, k)
				}
			case !m.node.Confirmed(k.db, k.id).Less(at):
				delete(held, k) // the new master holds it all
			}
		}
		for k := range held {
			if !hosted[k] {
				delete(held, k) // its database was dropped
			}
		}
		if len(held) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			log.Warn("drain: time is up; leaving, the rest fails over", "partitions", len(held), "after", m.drainFor)
			return
		case <-tick.C:
		}
	}
	log.Info("drained: every partition another replica can master has a new master", "took", time.Since(start).Round(time.Millisecond))
}

// elsewhere reports whether partition p has a live replica other than
// node id, to which its mastership can go.
func elsewhere(t *topo.RoutingTable, p int, id string) bool {
	if p >= len(t.Partitions) {
		return false
	}
	for _, r := range t.Partitions[p].Replicas {
		if _, live := t.Nodes[r]; live && r != id {
			return true
		}
	}
	return false
}

// leave fences every partition and leaves the cluster at once (a clean
// stop does not wait for the lease to lapse): nothing is written once the
// controller may have moved on.
func (m *member) leave() error {
	if m.member == nil || m.engine.Failed() != nil {
		return nil
	}
	m.node.FenceAll()
	return m.member.Leave()
}

// stopAgent stops the node's agent (its replication and background work)
// and waits for it.
func (m *member) stopAgent() {
	if m.cancel != nil {
		m.cancel()
		<-m.done
	}
}

// startLocalCluster runs, for `serve --nodes N`, N storage nodes with
// their internal APIs on loopback ports, and a controller.
func (s *Server) startLocalCluster(ctx context.Context, plans *schema.Plans) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	relayURL := "http://" + ln.Addr().String()
	if !s.opts.NoLocalCalls {
		s.peers = &node.LocalPeers{}
	}
	rpc, r, err := s.startRelay(ctx, "relay", relayURL)
	if err != nil {
		ln.Close()
		return err
	}
	s.extra = append(s.extra, wire.Serve(ln, nil, nil, rpc))
	s.local = map[string]node.Service{}
	s.localLogs = map[string]node.LogSource{relayURL: node.LogFunc(r.Log)}
	if s.peers != nil {
		s.peers.Add(relayURL, node.LogFunc(r.Log))
	}
	s.localSnaps = map[string]node.Snapshotter{}
	for i := range s.opts.Nodes {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		dir := filepath.Join(s.opts.DataDir, fmt.Sprintf("node%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			ln.Close()
			return err
		}
		// Node IDs are stable across restarts (the data stays with
		// them); the port is new each time and advertised again.
		url := "http://" + ln.Addr().String()
		m, err := s.startMember(ctx, dir, fmt.Sprintf("node%d", i), url, plans)
		if err != nil {
			ln.Close()
			return err
		}
		rpc, local := s.nodeRPC(m)
		s.local[url] = local
		s.localSnaps[url] = m.node
		if s.peers != nil {
			s.peers.Add(url, m.node)
		}
		s.extra = append(s.extra, wire.Serve(ln, nil, nil, rpc))
	}
	s.startController()
	return nil
}

// startRelay runs a relay in the background, registered as id at url
// (where the returned server will be served).
func (s *Server) startRelay(ctx context.Context, id, url string) (*wire.Server, *relay.Relay, error) {
	if url == "" {
		return nil, nil, errors.New("a relay needs the URL its log API is reached at")
	}
	if id == "" {
		id = strings.TrimPrefix(url, "http://")
	}
	r := &relay.Relay{Client: s.cli, Prefix: s.opts.Prefix, Buffer: s.opts.RelayBuffer, BufferBytes: s.opts.RelayBufferBytes, Logger: s.opts.Logger.With("relay", id), ProtocolVersion: s.opts.ProtocolVersion, Local: s.peers,
		Pulled: func(n int) { s.cluster.RelayPulled.Add(float64(n)) },
		Served: func(n int) { s.cluster.RelayServed.Add(float64(n)) },
	}
	s.Metrics.RegisterRelayBuffer(r.Buffered)
	rctx := s.background(func(ctx context.Context) { r.Run(ctx) })
	reg, err := topo.RegisterRelay(rctx, s.cli, s.opts.Prefix, s.process(topo.RoleRelay, id, url), s.opts.LeaseTTL)
	if err != nil {
		return nil, nil, err
	}
	// After the relay's own stop (which ends rctx), wait for its
	// registration to be let go.
	s.stop = append(s.stop, func() { <-reg.Done() })
	rpc := wire.NewServer()
	r.Register(rpc, s.serveOptions())
	return rpc, r, nil
}

// startController campaigns for leadership in the background.
func (s *Server) startController() {
	id := s.opts.ControllerID
	if id == "" {
		host, _ := os.Hostname()
		id = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	c := &controller.Controller{
		Client: s.cli, Prefix: s.opts.Prefix, Registry: s.reg, ID: id, LeaseTTL: s.opts.LeaseTTL,
		Log: s.opts.Logger.With("controller", id),
	}
	if s.opts.CheckInterval > 0 {
		c.CheckInterval = s.opts.CheckInterval
		c.OnCheck = func(res []controller.PartitionCheck) {
			counts := map[string]int{}
			for _, pc := range res {
				for _, r := range pc.Replicas {
					counts[r.Result]++
				}
			}
			s.cluster.Checked(counts, float64(time.Now().Unix()))
		}
	}
	s.background(func(ctx context.Context) {
		// The record is for operators only: a controller that cannot
		// register it still leads.
		if reg, err := topo.RegisterProcess(ctx, s.cli, s.opts.Prefix, s.process(topo.RoleController, id, ""), s.opts.LeaseTTL); err != nil {
			c.Log.Warn("controller: register the process", "err", err)
		} else {
			defer func() { <-reg.Done() }()
		}
		c.Run(ctx)
	})
}

// process is this process's record in a role (topo.Process): its build
// and newest protocol.
func (s *Server) process(role, id, url string) topo.Process {
	return topo.Process{Role: role, ID: id, URL: url, Build: release.Get().Revision, Protocol: s.opts.ProtocolVersion}
}

// background runs a role until Close, which cancels the returned context
// and waits for run to return.
func (s *Server) background(run func(context.Context)) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx)
	}()
	s.stop = append(s.stop, func() { cancel(); <-done })
	return ctx
}

// serveClusterStatus answers GET /_cluster.
func (s *Server) serveClusterStatus(w http.ResponseWriter, r *http.Request) {
	st, err := s.clusterStatus(r.Context())
	if err != nil {
		unavailable(w, fmt.Sprintf("cluster state: %v", err))
		return
	}
	writeJSON(w, st)
}

// clusterStatus is the cluster's status as /_cluster and /_admin show
// it; Single when this process is one node without a cluster.
func (s *Server) clusterStatus(ctx context.Context) (*controller.Status, error) {
	st, err := controller.ClusterStatus(ctx, s.cli, s.opts.Prefix)
	if st != nil {
		st.Single = s.engine != nil
		for i := range st.Databases {
			if d, err := s.reg.Database(st.Databases[i].Name); err == nil {
				st.Databases[i].Replicas, st.Databases[i].MinInSync, st.Databases[i].FailoverInSync = d.Replicas, d.InSync(), d.FailoverInSync
			}
		}
	}
	return st, err
}

// serveClusterCheck answers POST /_cluster/check[?db=name]: it runs the
// consistency check now.
func (s *Server) serveClusterCheck(w http.ResponseWriter, r *http.Request) {
	// Not ignored: ?database=x would check every database, and an
	// operator read the answer as x's.
	if bad := router.Params(r, "the consistency check", "db"); bad != nil {
		problem.Write(w, bad)
		return
	}
	if s.engine != nil {
		// One node: no replicas to compare, and no routing tables.
		if db := r.URL.Query().Get("db"); db != "" {
			if _, err := s.reg.Database(db); err != nil {
				problem.Write(w, problem.New(http.StatusNotFound, problem.TypeNoDatabase, "No such database", err.Error()))
				return
			}
		}
		writeJSON(w, map[string]any{"single": true, "partitions": []controller.PartitionCheck{}})
		return
	}
	select {
	case s.checking <- struct{}{}:
		defer func() { <-s.checking }()
	default:
		p := problem.New(http.StatusServiceUnavailable, problem.TypeOverloaded, "Overloaded",
			"a consistency check is running in this process already (each reads every replica it checks); ask again once it has answered")
		p.RetryAfter = 5
		problem.Write(w, p)
		return
	}
	res, err := controller.Check(r.Context(), s.cli, s.opts.Prefix, r.URL.Query().Get("db"))
	if errors.Is(err, controller.ErrNoDatabase) {
		problem.Write(w, problem.New(http.StatusNotFound, problem.TypeNoDatabase, "No such database", err.Error()))
		return
	}
	if err != nil {
		unavailable(w, fmt.Sprintf("consistency check: %v", err))
		return
	}
	writeJSON(w, map[string]any{"partitions": res})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func unavailable(w http.ResponseWriter, detail string) {
	p := problem.New(http.StatusServiceUnavailable, problem.TypeUnavailable, "Service unavailable", detail)
	p.RetryAfter = 1
	problem.Write(w, p)
}

// storageOptions are the options a storage engine of this process opens
// with: its logger, and the cluster's identity from etcd, which the data
// directory must match (storage.ErrOtherCluster).
func (s *Server) storageOptions(ctx context.Context) (storage.Options, error) {
	o := s.opts.Storage
	o.Logger = s.opts.Logger
	id, err := topo.ClusterID(ctx, s.cli, s.opts.Prefix)
	if err != nil {
		return o, err
	}
	o.ClusterID = id
	return o, nil
}

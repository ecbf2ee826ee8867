package clustertest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/cortado-db/cortado/internal/coord"
	"github.com/cortado-db/cortado/internal/coord/coordtest"
	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
	"github.com/cortado-db/cortado/internal/wire"
)

type storageNode struct {
	*node.Node
	eng *storage.Engine
	api *wire.Listener // the internal API, at url
	url string
}

// newTestRegistry is a registry on its own etcd with database d and its
// table T {k} → {v: string}.
func newTestRegistry(t testing.TB, d schema.Database) *registry.Registry {
	t.Helper()
	ctx := context.Background()
	_, reg := newTestEtcd(t, "/test")
	if _, _, err := reg.CreateDatabase(ctx, d); err != nil {
		t.Fatal(err)
	}
	if _, _, err := reg.RegisterVersion(ctx, d.Name, "T", []schema.KeyPart{{Name: "k"}}, `{"type":"record","name":"T","fields":[{"name":"v","type":"string"}]}`); err != nil {
		t.Fatal(err)
	}
	return reg
}

// newTestEtcd is an etcd of the test's own, a client of it, and a
// registry under prefix, all closed when the test ends.
func newTestEtcd(t testing.TB, prefix string) (*clientv3.Client, *registry.Registry) {
	t.Helper()
	ctx := context.Background()
	etcd := coordtest.Embedded(t)
	cli, err := coord.Connect(ctx, []string{etcd.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	reg, err := registry.Open(ctx, cli, registry.Options{Prefix: prefix, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	return cli, reg
}

func newStorageNode(t testing.TB, reg *registry.Registry) *storageNode {
	return newStorageNodeWith(t, reg, node.Options{})
}

func newStorageNodeWith(t testing.TB, reg *registry.Registry, opts node.Options, extra ...grpc.ServerOption) *storageNode {
	t.Helper()
	return newStorageNodeServing(t, reg, opts, node.ServeOptions{}, extra...)
}

// newStorageNodeServing is newStorageNodeWith whose internal API serves
// as serve says (an older protocol version).
func newStorageNodeServing(t testing.TB, reg *registry.Registry, opts node.Options, serve node.ServeOptions, extra ...grpc.ServerOption) *storageNode {
	t.Helper()
	eng, err := storage.Open(t.TempDir(), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	n := node.New(eng, reg, schema.NewPlans(64), slog.New(slog.DiscardHandler), opts)
	api, url := serveInternal(t, func(s *wire.Server) { node.Register(s, n, serve) }, extra...)
	return &storageNode{Node: n, eng: eng, api: api, url: url}
}

// follow runs n.Follow against src until the returned stop is called.
func follow(t *testing.T, n *storageNode, src node.LogSource, truncated *int) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := n.Follow(ctx, "d", 0, node.FollowOptions{Source: src, Replica: "follower", Truncated: func(k int) { *truncated += k }}); err != nil {
			t.Error(err)
		}
	}()
	return func() { cancel(); wg.Wait() }
}

// awaitSCN waits until n's partition reaches scn (and fails if it
// passes it without stopping there).
func awaitSCN(t *testing.T, n *storageNode, scn storage.SCN) {
	t.Helper()
	if _, err := n.Checksum(context.Background(), node.ChecksumRequest{DB: "d", At: scn, Wait: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
}

func sameState(t *testing.T, a, b *storageNode) {
	t.Helper()
	as, ac := sum(t, a, 0)
	bs, bc := sum(t, b, 0)
	if as != bs || ac != bc {
		t.Fatalf("replicas differ: %s/%x vs %s/%x", as, ac, bs, bc)
	}
}

func write(t *testing.T, n *storageNode, k, v string) storage.SCN {
	t.Helper()
	tree, _ := schema.DecodeJSON([]byte(`{"v":"` + v + `"}`))
	s, _ := schema.Parse(`{"type":"record","name":"T","fields":[{"name":"v","type":"string"}]}`)
	val, _ := schema.EncodeJSON(nil, s, tree)
	res, err := n.Write(context.Background(), node.WriteRequest{DB: "d", Partition: 0,
		Ops: []node.Op{{Kind: node.OpPut, Table: "T", Key: []keys.Part{keys.S(k)}, Version: 1, Value: val}}})
	if err != nil {
		t.Fatal(err)
	}
	return res.SCN
}

// TestReplicationAndFailover: a slave follows its master over the internal
// API and ends byte-identical; then the master falls behind the cluster (its
// last commits never reached the slave), the slave is promoted in
// generation 2 and takes writes, and the old master rejoins as slave: it
// truncates the commits the new timeline lacks and follows to the same
// state as the new master.
func TestReplicationAndFailover(t *testing.T) {
	a, master, slaves := onePartition(t, 1)
	b := slaves[0]
	var truncatedB, truncatedA int
	stopB := follow(t, b, master, &truncatedB)
	var last storage.SCN
	for i := range 20 {
		last = write(t, a, fmt.Sprintf("k%d", i%7), fmt.Sprint(i))
	}
	awaitSCN(t, b, last)
	sameState(t, a, b)
	if last != (storage.SCN{Gen: 1, Seq: 21}) { // 1:1 opened the generation
		t.Fatalf("master at %s", last)
	}

	// The slave stops hearing from the master, which commits two more.
	stopB()
	write(t, a, "k1", "lost")
	write(t, a, "new", "lost")

	// Failover: a is fenced, b becomes master of generation 2.
	a.SetRole("d", 0, node.Slave, 0, 0)
	if err := b.SetRole("d", 0, node.Master, 2, 0); err != nil {
		t.Fatal(err)
	}
	if scn := write(t, b, "k2", "gen2"); scn != (storage.SCN{Gen: 2, Seq: 2}) { // 2:1 opened it
		t.Fatalf("first write of generation 2 is %s", scn)
	}
	last = write(t, b, "k3", "gen2")

	// a rejoins as slave of b.
	stopA := follow(t, a, remote(t, b.url), &truncatedA)
	defer stopA()
	awaitSCN(t, a, last)
	sameState(t, a, b)
	if truncatedA != 2 || truncatedB != 0 {
		t.Fatalf("truncated events: a %d (want 2), b %d", truncatedA, truncatedB)
	}
	// And it keeps following.
	last = write(t, b, "k4", "more")
	awaitSCN(t, a, last)
	sameState(t, a, b)
}

// sum is a replica's checksum and the SCN it was taken at.
func sum(t testing.TB, n *storageNode, p int) (storage.SCN, uint64) {
	t.Helper()
	r, err := n.Checksum(context.Background(), node.ChecksumRequest{DB: "d", Partition: p})
	if err != nil {
		t.Fatal(err)
	}
	return r.SCN, r.Sum
}

// TestSemiSyncWaitsForDurableReplicas: with replicas 3 and minInSync 2, a
// master refuses writes while the routing table gives it no live slave
// (nothing written), answers "not replicated" for a write no slave
// applied, and acknowledges once a slave durably applied it — recording
// it in its acknowledged watermark. A slave answers no fresh read. A write
// in flight when mastership is handed over is acknowledged as soon as the
// new master holds it, not after the timeout.
func TestSemiSyncWaitsForDurableReplicas(t *testing.T) {
	ctx := context.Background()
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: 1, Replicas: 3})
	// The in-flight write below must be confirmed by the hand-over: with
	// no slave following a, its 2 s timeout would fail it instead.
	a := newStorageNodeWith(t, reg, node.Options{SemiSyncTimeout: 2 * time.Second})
	b := newStorageNodeWith(t, reg, node.Options{})
	a.SetRole("d", 0, node.Master, 1, 0)
	b.SetRole("d", 0, node.Slave, 0, 0)
	try := func(n *storageNode, k string) (*node.WriteResult, error) { return n.Write(ctx, writeReq(t, k)) }
	pa, _ := a.eng.Partition("d", 0)

	if _, err := try(a, "k0"); !errors.Is(err, node.ErrNotEnoughReplicas) || pa.SCN() != (storage.SCN{Gen: 1, Seq: 1}) {
		t.Fatalf("write with no live slave: %v, partition at %s (want the generation's marker, 1:1)", err, pa.SCN())
	}
	a.SetSlaves("d", 0, []string{"follower", "c"})
	if _, err := try(a, "k1"); !errors.Is(err, node.ErrNotReplicated) {
		t.Fatalf("write no slave applied: %v", err)
	}
	var truncated int
	stop := follow(t, b, remote(t, a.url), &truncated)
	res, err := try(a, "k2")
	if err != nil {
		t.Fatalf("write a slave applied: %v", err)
	}
	if got := pa.AcknowledgedSCN(); got != res.SCN {
		t.Fatalf("acknowledged watermark %s, want %s", got, res.SCN)
	}
	if _, err := b.Get(ctx, node.GetRequest{DB: "d", Table: "T", Partition: 0, Key: []keys.Part{keys.S("k2")}}); !errors.Is(err, node.ErrNotMaster) {
		t.Fatalf("a slave answered a fresh read: %v", err)
	}

	// Hand-over with a write in flight: b stops following, a commits and
	// waits; a steps down, b drains it and takes over, a follows b.
	stop()
	inflight := make(chan error, 1)
	go func() {
		_, err := a.Write(ctx, writeReq(t, "k3"))
		inflight <- err
	}()
	awaitSCN(t, a, storage.SCN{Gen: 1, Seq: 4})
	a.SetRole("d", 0, node.Slave, 0, 0)
	if err := b.Drain(ctx, "d", 0, remote(t, a.url), 5*time.Second, true, node.FollowOptions{Replica: "b"}); err != nil {
		t.Fatal(err)
	}
	if err := b.SetRole("d", 0, node.Master, 2, 0); err != nil {
		t.Fatal(err)
	}
	// a confirms its write once b holds it and b is established: a
	// slave (a itself, following as "follower") holds b's marker.
	b.SetSlaves("d", 0, []string{"follower", "c"})
	stopA := follow(t, a, remote(t, b.url), &truncated)
	defer stopA()
	if err := <-inflight; err != nil {
		t.Fatalf("in-flight write across the hand-over: %v", err)
	}
	if truncated != 0 {
		t.Fatalf("the hand-over truncated %d events", truncated)
	}
}

// thirdReplica is replicas 3 with minInSync 3 (thirdUnacked).
type thirdReplica struct {
	reg  *registry.Registry
	a, b *storageNode
	// ackC acknowledges scn to a as the third replica, c.
	ackC func(scn storage.SCN)
	// old is the SCN of "old", which both slaves hold, unacked that of
	// "new", which only b holds.
	old, unacked storage.SCN
}

// thirdUnacked sets up replicas 3 with minInSync 3: master a, slave b
// following it, and a third slave c that acknowledges by hand (ackC).
// It writes "old", which both slaves hold (acknowledged), and "new",
// which only b holds (its writer answered not-replicated). The follower
// stops when the test ends.
func thirdUnacked(t *testing.T) *thirdReplica {
	t.Helper()
	return thirdUnackedVia(t, func(r *node.Remote) node.LogSource { return r })
}

// thirdUnackedVia is thirdUnacked whose slave b reads a's log through
// source (given a's internal API).
func thirdUnackedVia(t *testing.T, source func(*node.Remote) node.LogSource) *thirdReplica {
	t.Helper()
	ctx := context.Background()
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: 1, Replicas: 3, MinInSync: 3})
	// Long enough for b to take "old" under the race detector on a
	// loaded machine; "new" waits out a deadline of its own instead.
	a := newStorageNodeWith(t, reg, node.Options{SemiSyncTimeout: time.Minute})
	b := newStorageNodeWith(t, reg, node.Options{SemiSyncTimeout: 10 * time.Second})
	a.SetRole("d", 0, node.Master, 1, 0)
	b.SetRole("d", 0, node.Slave, 0, 0)
	a.SetSlaves("d", 0, []string{"follower", "c"})
	ackC := func(scn storage.SCN) {
		t.Helper()
		if _, err := a.Ack(ctx, node.AckRequest{DB: "d", Partition: 0, Replica: "c", SCN: scn}); err != nil {
			t.Fatal(err)
		}
	}
	var truncated int
	t.Cleanup(follow(t, b, source(remote(t, a.url)), &truncated))
	done := make(chan error, 1)
	go func() { _, err := a.Write(ctx, writeReq(t, "old")); done <- err }()
	pa, _ := a.eng.Partition("d", 0)
	awaitSCN(t, a, storage.SCN{Gen: 1, Seq: 2})
	// Applied is not durable: c holds what a holds durably (pa.SCN()
	// was 1:1 for a moment once, and the write waited for c for good).
	if err := pa.AwaitDurable(ctx, storage.SCN{Gen: 1, Seq: 2}); err != nil {
		t.Fatal(err)
	}
	ackC(pa.SCN())
	if err := <-done; err != nil {
		t.Fatalf("a write both slaves hold: %v", err)
	}
	old := pa.SCN()
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := a.Write(short, writeReq(t, "new")); !errors.Is(err, node.ErrNotReplicated) {
		t.Fatalf("a write c does not hold: %v, want ErrNotReplicated", err)
	}
	unacked := pa.SCN()
	awaitSCN(t, b, unacked)
	return &thirdReplica{reg: reg, a: a, b: b, ackC: ackC, old: old, unacked: unacked}
}

// TestSlaveReadsOnlyAcknowledgedCommits: with replicas 3 and minInSync
// 3, a commit slave b holds but the third replica c does not is not
// acknowledged (its writer is answered "not replicated"), and a failover
// that promoted c would undo it: b's max-stale read of it waits, as the
// master's would, instead of showing it; once c holds it too, b answers
// it. A document written before, which c holds, b answers at once.
func TestSlaveReadsOnlyAcknowledgedCommits(t *testing.T) {
	ctx := context.Background()
	r := thirdUnacked(t)
	b, ackC, old, unacked := r.b, r.ackC, r.old, r.unacked

	read := func(ctx context.Context, k string) (*node.Item, error) {
		return b.Get(ctx, node.GetRequest{DB: "d", Table: "T", Partition: 0, Key: []keys.Part{keys.S(k)}, MaxStale: time.Minute})
	}
	if it, err := read(ctx, "old"); err != nil || it.SCN != old {
		t.Fatalf("b's read of an acknowledged commit: %+v %v", it, err)
	}
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if it, err := read(short, "new"); !errors.Is(err, node.ErrNotReplicated) {
		t.Fatalf("b's read of a commit c does not hold: %+v %v, want ErrNotReplicated", it, err)
	}

	// Once c holds it, b learns so with its next acknowledgement (at
	// least once a second) and answers.
	ackC(unacked)
	if it, err := read(ctx, "new"); err != nil || it.SCN != unacked {
		t.Fatalf("b's read once c holds it: %+v %v", it, err)
	}
}

// TestSlaveAsksWhenAReadWaits: b follows a source that answers only with
// commits, so on an idle partition no answer brings b's next
// acknowledgement. Once c holds the commit b's read waits for, the read
// returns all the same: b acknowledges again while it waits, and the
// master's answer says the commit is confirmed. (Without the asking, the
// read waits out its deadline.)
func TestSlaveAsksWhenAReadWaits(t *testing.T) {
	r := thirdUnackedVia(t, func(src *node.Remote) node.LogSource { return quietSource{src} })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		it, err := r.b.Get(ctx, node.GetRequest{DB: "d", Table: "T", Partition: 0, Key: []keys.Part{keys.S("new")}, MaxStale: time.Minute})
		if err == nil && it.SCN != r.unacked {
			err = fmt.Errorf("at %s, want %s", it.SCN, r.unacked)
		}
		done <- err
	}()
	r.ackC(r.unacked)
	if err := <-done; err != nil {
		t.Fatalf("b's read of a commit c holds, with no answer coming from its source: %v", err)
	}
}

// quietSource is a node's log that answers a long poll only with commits
// (or word on the asker's timeline): no heartbeat answers, which a slave
// acknowledges after.
type quietSource struct{ r *node.Remote }

func (q quietSource) Log(ctx context.Context, req node.LogRequest) (*node.LogResult, error) {
	for {
		res, err := q.r.Log(ctx, req)
		if err != nil || req.Wait == 0 || len(res.Commits) > 0 || res.Diverged || res.Trimmed || !res.Holds || ctx.Err() != nil {
			return res, err
		}
	}
}

func (q quietSource) Ack(ctx context.Context, req node.AckRequest) (*node.AckResult, error) {
	return q.r.Ack(ctx, req)
}

// TestLogOfAcknowledgedCommits: a master asked for acknowledged commits
// only (a change stream's reader) sends none that too few replicas hold,
// and sends it once they do; a reader watching the watermark (a relay's
// pull) is told of its move without a commit. Replicas 3, minInSync 3:
// a commit is acknowledged once both slaves hold it, and b's own
// acknowledgement is not enough.
func TestLogOfAcknowledgedCommits(t *testing.T) {
	ctx := context.Background()
	r := thirdUnacked(t)
	a, ackC, old, unacked := r.a, r.ackC, r.old, r.unacked

	src := remote(t, a.url) // over the wire, as relays and routers read
	res, err := src.Log(ctx, node.LogRequest{DB: "d", Partition: 0, AckedOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if !res.AckedOnly || res.Acked != old || len(res.Commits) == 0 || res.Commits[len(res.Commits)-1].SCN != old {
		t.Fatalf("acknowledged commits only, %v acknowledged and %v not: %+v", old, unacked, res)
	}
	if res, err := src.Log(ctx, node.LogRequest{DB: "d", Partition: 0}); err != nil || res.AckedOnly || res.Commits[len(res.Commits)-1].SCN != unacked {
		t.Fatalf("every commit: %+v %v", res, err)
	}

	// Both wait for c: the reader of acknowledged commits for the new
	// one, the watcher for the watermark's move.
	type answer struct {
		res  *node.LogResult
		took time.Duration
		err  error
	}
	ask := func(req node.LogRequest) chan answer {
		ch := make(chan answer, 1)
		go func() {
			start := time.Now()
			res, err := src.Log(ctx, req)
			ch <- answer{res, time.Since(start), err}
		}()
		return ch
	}
	const wait = 10 * time.Second
	reader := ask(node.LogRequest{DB: "d", Partition: 0, After: old, Wait: wait, AckedOnly: true})
	watcher := ask(node.LogRequest{DB: "d", Partition: 0, After: unacked, Wait: wait, WatchAcked: true, AckedSeen: old})
	ackC(unacked)
	if got := <-reader; got.err != nil || len(got.res.Commits) != 1 || got.res.Commits[0].SCN != unacked || got.took >= wait {
		t.Fatalf("the reader of acknowledged commits once c holds %v: %+v %v after %v", unacked, got.res, got.err, got.took)
	}
	if got := <-watcher; got.err != nil || len(got.res.Commits) != 0 || got.res.Acked != unacked || got.took >= wait {
		t.Fatalf("the watermark's watcher once c holds %v: %+v %v after %v", unacked, got.res, got.err, got.took)
	}
}

// writeReq is a put of k in table T.
func writeReq(t *testing.T, k string) node.WriteRequest {
	t.Helper()
	tree, _ := schema.DecodeJSON([]byte(`{"v":"x"}`))
	s, _ := schema.Parse(`{"type":"record","name":"T","fields":[{"name":"v","type":"string"}]}`)
	val, _ := schema.EncodeJSON(nil, s, tree)
	return node.WriteRequest{DB: "d", Partition: 0, Ops: []node.Op{{Kind: node.OpPut, Table: "T", Key: []keys.Part{keys.S(k)}, Version: 1, Value: val}}}
}

// serveInternal serves an internal API (a node's or a relay's) on a
// loopback port until the test ends, and returns its URL.
func serveInternal(t testing.TB, register func(*wire.Server), extra ...grpc.ServerOption) (*wire.Listener, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := wire.NewServer(extra...)
	register(s)
	l := wire.Serve(ln, nil, nil, s)
	t.Cleanup(l.Abort)
	return l, "http://" + ln.Addr().String()
}

// remote is a connection to the internal API at url, closed when the
// test ends.
func remote(t testing.TB, url string) *node.Remote {
	r := node.NewRemote(url)
	t.Cleanup(func() { r.Close() })
	return r
}

// TestLeaseLapsedMidRequest: a master paused in the middle of a write or
// a read (SIGSTOP past its lease) may have been replaced while it slept.
// A write it began under a lease it no longer holds is not acknowledged
// (503 not-replicated: it may or may not survive), and a read begun under
// such a lease is not answered (the new master may have acknowledged
// newer writes). The lease here changes between the start and the end of
// each request, as a rejoin under a new lease after a pause would.
func TestLeaseLapsedMidRequest(t *testing.T) {
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: 1})
	n := newStorageNodeWith(t, reg, node.Options{AllMaster: true})
	var calls atomic.Int64
	lease := int64(1)
	n.RequireLease(func() (int64, bool) {
		calls.Add(1)
		return atomic.LoadInt64(&lease), true
	})
	ctx := context.Background()
	put := node.WriteRequest{DB: "d", Partition: 0, Ops: []node.Op{{Kind: node.OpPut, Table: "T", Key: []keys.Part{keys.S("k")}, Version: 1, Value: []byte{0x02, 'a'}}}}
	if _, err := n.Write(ctx, put); err != nil {
		t.Fatalf("a write under a steady lease: %v", err)
	}
	get := node.GetRequest{DB: "d", Table: "T", Partition: 0, Key: []keys.Part{keys.S("k")}}
	if _, err := n.Get(ctx, get); err != nil {
		t.Fatalf("a read under a steady lease: %v", err)
	}
	// From now on every look at the lease finds a new one.
	n.RequireLease(func() (int64, bool) { return atomic.AddInt64(&lease, 1), true })
	if _, err := n.Write(ctx, put); !errors.Is(err, node.ErrNotReplicated) {
		t.Fatalf("a write whose lease changed under it: %v, want ErrNotReplicated", err)
	}
	if _, err := n.Get(ctx, get); !errors.Is(err, node.ErrNotMaster) {
		t.Fatalf("a read whose lease changed under it: %v, want ErrNotMaster", err)
	}
	if calls.Load() == 0 {
		t.Fatal("the lease was never asked")
	}
}

// TestNodeRefusesMalformedAvro: a write that reaches a node with bytes
// that are not a document of the named schema version (a caller other
// than the router, a corrupted request) is refused and stores nothing.
func TestNodeRefusesMalformedAvro(t *testing.T) {
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: 1})
	n := newStorageNodeWith(t, reg, node.Options{AllMaster: true})
	r := remote(t, n.url)
	ctx := context.Background()
	for _, op := range []node.Op{
		{Kind: node.OpPut, Table: "T", Key: []keys.Part{keys.S("k")}, Version: 1, Value: []byte{0xff, 0xff, 0xff}},
		{Kind: node.OpPut, Table: "T", Key: []keys.Part{keys.S("k")}, Version: 1, Value: []byte{0x02, 'a', 'x'}}, // trailing byte
		{Kind: node.OpPut, Table: "T", Key: []keys.Part{keys.S("k")}, Version: 9, Value: []byte{0x02, 'a'}},
	} {
		_, err := r.Write(ctx, node.WriteRequest{DB: "d", Partition: 0, Ops: []node.Op{op}})
		if err == nil {
			t.Fatalf("write of %x (version %d) accepted", op.Value, op.Version)
		}
	}
	if _, err := r.Get(ctx, node.GetRequest{DB: "d", Table: "T", Partition: 0, Key: []keys.Part{keys.S("k")}}); !errors.Is(err, node.ErrNotFound) {
		t.Fatalf("after refused writes: %v, want not found", err)
	}
}

// TestNewMasterIsEstablishedBeforeItServes: a replica promoted to master
// opens its generation with a marker commit, and serves a commit of an
// older generation (one it holds from its predecessor) only once a slave
// holds that marker too — a slave holding the old commit is not enough,
// since a replica holding another older generation's commits could still
// be chosen over both (Raft's Figure 8). Until then it confirms nothing
// to a former master either.
func TestNewMasterIsEstablishedBeforeItServes(t *testing.T) {
	ctx := context.Background()
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: 1, Replicas: 3})
	a := newStorageNode(t, reg)
	b := newStorageNodeWith(t, reg, node.Options{SemiSyncTimeout: 300 * time.Millisecond})
	if err := a.SetRole("d", 0, node.Master, 1, 0); err != nil {
		t.Fatal(err)
	}
	b.SetRole("d", 0, node.Slave, 0, 0)
	// a writes k under async-like conditions: no slave is required yet.
	var truncated int
	stop := follow(t, b, remote(t, a.url), &truncated)
	a.SetSlaves("d", 0, []string{"follower"})
	old := write(t, a, "k", "v")
	awaitSCN(t, b, old)
	stop()

	a.SetRole("d", 0, node.Slave, 0, 0)
	if err := b.SetRole("d", 0, node.Master, 2, 0); err != nil {
		t.Fatal(err)
	}
	pb, _ := b.eng.Partition("d", 0)
	if pb.SCN() != (storage.SCN{Gen: 2, Seq: 1}) {
		t.Fatalf("the new master is at %s, want its marker 2:1", pb.SCN())
	}
	b.SetSlaves("d", 0, []string{"c"})
	get := node.GetRequest{DB: "d", Table: "T", Partition: 0, Key: []keys.Part{keys.S("k")}}
	// A slave holds k's commit but not the marker: no answer yet.
	if _, err := b.Ack(ctx, node.AckRequest{DB: "d", Partition: 0, Replica: "c", SCN: old}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, get); !errors.Is(err, node.ErrNotReplicated) {
		t.Fatalf("a read of an older generation's commit before the marker is held: %v, want ErrNotReplicated", err)
	}
	if ack, err := b.Ack(ctx, node.AckRequest{DB: "d", Partition: 0, Replica: "c", SCN: old}); err != nil || ack.Authoritative {
		t.Fatalf("an unestablished master confirms: %+v %v", ack, err)
	}
	// Once it holds the marker, the read is answered and the master
	// confirms.
	ack, err := b.Ack(ctx, node.AckRequest{DB: "d", Partition: 0, Replica: "c", SCN: storage.SCN{Gen: 2, Seq: 1}})
	if err != nil || !ack.Held || !ack.Authoritative {
		t.Fatalf("acknowledging the marker: %+v %v", ack, err)
	}
	if it, err := b.Get(ctx, get); err != nil || it.SCN != old {
		t.Fatalf("read once established: %+v %v", it, err)
	}
}

// TestMastershipIsBoundToItsLease: a mastership is granted to one run of
// a node (its membership lease). A node that lost its lease and rejoined
// under a new one may still hold the MASTER role for a moment before it
// fences itself; it must neither write nor serve as master meanwhile.
func TestMastershipIsBoundToItsLease(t *testing.T) {
	ctx := context.Background()
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: 1})
	n := newStorageNode(t, reg)
	var lease atomic.Int64
	lease.Store(7)
	n.RequireLease(func() (int64, bool) { return lease.Load(), true })
	if err := n.SetRole("d", 0, node.Master, 1, 7); err != nil {
		t.Fatal(err)
	}
	write(t, n, "k", "v")
	get := node.GetRequest{DB: "d", Table: "T", Partition: 0, Key: []keys.Part{keys.S("k")}}
	if _, err := n.Get(ctx, get); err != nil {
		t.Fatal(err)
	}
	lease.Store(8) // rejoined; the role is still MASTER
	if _, err := n.Write(ctx, writeReq(t, "k2")); !errors.Is(err, node.ErrNotMaster) {
		t.Fatalf("a write under a new lease: %v, want ErrNotMaster", err)
	}
	if _, err := n.Get(ctx, get); !errors.Is(err, node.ErrNotMaster) {
		t.Fatalf("a fresh read under a new lease: %v, want ErrNotMaster", err)
	}
	if ack, err := n.Ack(ctx, node.AckRequest{DB: "d", Partition: 0, Replica: "x", SCN: storage.SCN{Gen: 1, Seq: 1}}); err != nil || ack.Authoritative {
		t.Fatalf("a master under a new lease speaks for the timeline: %+v %v", ack, err)
	}
	// Granted again to the new run (a new generation), it writes.
	if err := n.SetRole("d", 0, node.Master, 2, 8); err != nil {
		t.Fatal(err)
	}
	if scn := write(t, n, "k2", "v"); scn != (storage.SCN{Gen: 2, Seq: 2}) {
		t.Fatalf("write in the new mastership at %s", scn)
	}
}

// semiSyncPair is database d (one partition, replicas 3, semi-sync), its
// master a, which gives up on its replicas' acknowledgements after
// 300 ms, and a slave b ("follower" once it follows a).
func semiSyncPair(t *testing.T) (*registry.Registry, *storageNode, *storageNode) {
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: 1, Replicas: 3})
	a := newStorageNodeWith(t, reg, node.Options{SemiSyncTimeout: 300 * time.Millisecond})
	b := newStorageNodeWith(t, reg, node.Options{})
	a.SetRole("d", 0, node.Master, 1, 0)
	b.SetRole("d", 0, node.Slave, 0, 0)
	a.SetSlaves("d", 0, []string{"follower", "c"})
	return reg, a, b
}

// TestSnapshotWaitsForReplicas: a snapshot that asks for Replicated (a
// backup's) streams nothing while it holds a commit no replica took — a
// write answered "not replicated", which a failover may undo — and
// streams it once a slave holds it; a plain snapshot (a rebuild's) does
// not wait. Over the wire, and from a node of protocol 6, which streams
// at once and says it did not wait.
func TestSnapshotWaitsForReplicas(t *testing.T) {
	ctx := context.Background()
	reg, a, b := semiSyncPair(t)
	if _, err := a.Write(ctx, writeReq(t, "k1")); !errors.Is(err, node.ErrNotReplicated) {
		t.Fatalf("a write no slave applied: %v, want ErrNotReplicated", err)
	}
	snapshot := func(src node.Snapshotter, replicated bool) (rows int, first *node.SnapshotChunk, err error) {
		err = src.Snapshot(ctx, node.SnapshotRequest{DB: "d", Partition: 0, Replicated: replicated}, func(c *node.SnapshotChunk) error {
			if first == nil {
				first = c
			}
			rows += len(c.Rows)
			return nil
		})
		return rows, first, err
	}
	ra := remote(t, a.url)
	if rows, first, err := snapshot(ra, true); !errors.Is(err, node.ErrNotReplicated) || first != nil {
		t.Fatalf("a replicated snapshot holding an unreplicated commit: %d rows streamed, %v; want none and ErrNotReplicated", rows, err)
	}
	if rows, first, err := snapshot(ra, false); err != nil || rows != 1 || first.Replicated {
		t.Fatalf("a plain snapshot: %d rows, %v, %+v; want the unreplicated row, at once", rows, err, first)
	}
	// Snapshots waiting for replicas hold none of the node's slots: as
	// many as it streams at once wait, and a rebuild's snapshot is
	// streamed meanwhile.
	var waiting sync.WaitGroup
	var ended atomic.Int64
	for range node.MaxSnapshots {
		waiting.Go(func() {
			defer ended.Add(1)
			if _, _, err := snapshot(ra, true); !errors.Is(err, node.ErrNotReplicated) {
				t.Errorf("a replicated snapshot holding an unreplicated commit: %v, want ErrNotReplicated", err)
			}
		})
	}
	for plain := 0; ended.Load() < node.MaxSnapshots || plain == 0; plain++ {
		if rows, _, err := snapshot(ra, false); err != nil || rows != 1 {
			t.Errorf("a plain snapshot while %d replicated ones wait for replicas: %d rows, %v; want the row", node.MaxSnapshots, rows, err)
			break
		}
	}
	waiting.Wait()
	if t.Failed() {
		return
	}
	var truncated int
	stop := follow(t, b, ra, &truncated)
	defer stop()
	if _, err := a.Write(ctx, writeReq(t, "k2")); err != nil {
		t.Fatalf("a write a slave applied: %v", err)
	}
	rows, first, err := snapshot(ra, true)
	if err != nil || rows != 2 || !first.Replicated || first.SCN != (storage.SCN{Gen: 1, Seq: 3}) {
		t.Fatalf("a replicated snapshot once the slave holds everything: %d rows, %v, %+v; want 2 rows at 1:3, replicated", rows, err, first)
	}

	// A node of protocol 6 ignores the question and says so.
	old := newStorageNodeServing(t, reg, node.Options{SemiSyncTimeout: 300 * time.Millisecond}, node.ServeOptions{MaxVersion: 6})
	old.SetRole("d", 0, node.Master, 1, 0)
	old.SetSlaves("d", 0, []string{"follower", "c"})
	if _, err := old.Write(ctx, writeReq(t, "k1")); !errors.Is(err, node.ErrNotReplicated) {
		t.Fatalf("a write no slave applied: %v", err)
	}
	if rows, first, err := snapshot(remote(t, old.url), true); err != nil || rows != 1 || first.Replicated {
		t.Fatalf("a replicated snapshot from a node of protocol 6: %d rows, %v, %+v; want the row, not said replicated", rows, err, first)
	}
}

// TestLogStreamsBounded: a storage node serves at most MaxLogStreams log
// streams and long polls at once. One beyond is refused, and its reader
// is told the node is overloaded (and tries again); once a stream ends, a
// new one is served.
func TestLogStreamsBounded(t *testing.T) {
	const max = 3
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: 1})
	n := newStorageNodeServing(t, reg, node.Options{AllMaster: true}, node.ServeOptions{MaxLogStreams: max})
	r := remote(t, n.url)
	var wg sync.WaitGroup
	open := func(ctx context.Context) <-chan error {
		heard := make(chan error, 1)
		wg.Go(func() {
			err := r.StreamLog(ctx, node.LogRequest{DB: "d", Partition: 0}, func(*node.LogResult) error {
				select {
				case heard <- nil:
				default:
				}
				return nil
			})
			select {
			case heard <- err:
			default:
			}
		})
		return heard
	}
	var cancels []context.CancelFunc
	defer func() {
		for _, c := range cancels {
			c()
		}
		wg.Wait()
	}()
	for i := range max {
		ctx, cancel := context.WithCancel(t.Context())
		cancels = append(cancels, cancel)
		if err := <-open(ctx); err != nil {
			t.Fatalf("stream %d of %d: %v", i+1, max, err)
		}
	}
	err := <-open(t.Context())
	if !errors.Is(err, node.ErrOverloaded) {
		t.Fatalf("a stream beyond %d: %v, want ErrOverloaded", max, err)
	}
	// A long poll counts as a stream.
	if _, err := r.Log(t.Context(), node.LogRequest{DB: "d", Partition: 0, Wait: time.Millisecond}); !errors.Is(err, node.ErrOverloaded) {
		t.Fatalf("a long poll beyond %d streams: %v, want ErrOverloaded", max, err)
	}
	// One ends; the next is served once its handler has returned.
	cancels[0]()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithCancel(t.Context())
		err := <-open(ctx)
		cancels = append(cancels, cancel)
		if err == nil {
			break
		}
		if !errors.Is(err, node.ErrOverloaded) || time.Now().After(deadline) {
			t.Fatalf("after one of %d streams ended: %v", max, err)
		}
	}
}

// TestWriteInAnotherPartitionRefused: a storage node refuses a write
// whose key belongs to another partition than the one it names, as bad
// input, and stores nothing: the document would be missing to reads by
// its key and found by queries of every partition.
func TestWriteInAnotherPartitionRefused(t *testing.T) {
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: 4})
	n := newStorageNodeWith(t, reg, node.Options{AllMaster: true})
	r := remote(t, n.url)
	ctx := t.Context()
	home := partitionOf(t, reg, "k")
	wrong := (home + 1) % 4
	put := func(part int) error {
		_, err := r.Write(ctx, node.WriteRequest{DB: "d", Partition: part, Ops: []node.Op{{Kind: node.OpPut, Table: "T", Key: []keys.Part{keys.S("k")}, Version: 1, Value: []byte{0x02, 'v'}}}})
		return err
	}
	if err := put(wrong); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("the key's partition is %d, not %d", home, wrong)) {
		t.Fatalf("a write of a key of partition %d to partition %d: %v", home, wrong, err)
	}
	for part := range 4 {
		if _, err := r.Get(ctx, node.GetRequest{DB: "d", Table: "T", Partition: part, Key: []keys.Part{keys.S("k")}}); !errors.Is(err, node.ErrNotFound) {
			t.Fatalf("partition %d after the refused write: %v", part, err)
		}
	}
	if err := put(home); err != nil {
		t.Fatalf("the write to its own partition: %v", err)
	}
}

package clustertest

import (
	"context"
	"errors"
	"io"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
	"github.com/cortado-db/cortado/internal/wire"
)

// wireMethods are the internal API's calls, each with a fresh request
// message the fuzzer's bytes are decoded into; stream marks the
// server-streaming ones.
var wireMethods = []struct {
	name   string
	req    func() proto.Message
	res    func() proto.Message
	stream bool
}{
	{"Hello", func() proto.Message { return new(wire.HelloRequest) }, func() proto.Message { return new(wire.HelloResult) }, false},
	{"Get", func() proto.Message { return new(wire.GetRequest) }, func() proto.Message { return new(wire.Item) }, false},
	{"MultiGet", func() proto.Message { return new(wire.MultiGetRequest) }, func() proto.Message { return new(wire.Items) }, false},
	{"Scan", func() proto.Message { return new(wire.ScanRequest) }, func() proto.Message { return new(wire.ScanResult) }, false},
	{"Write", func() proto.Message { return new(wire.WriteRequest) }, func() proto.Message { return new(wire.WriteResult) }, false},
	{"Log", func() proto.Message { return new(wire.LogRequest) }, func() proto.Message { return new(wire.LogResult) }, false},
	{"Ack", func() proto.Message { return new(wire.AckRequest) }, func() proto.Message { return new(wire.AckResult) }, false},
	{"Status", func() proto.Message { return new(wire.StatusRequest) }, func() proto.Message { return new(wire.StatusResult) }, false},
	{"Checksum", func() proto.Message { return new(wire.ChecksumRequest) }, func() proto.Message { return new(wire.ChecksumResult) }, false},
	{"StreamLog", func() proto.Message { return new(wire.LogRequest) }, func() proto.Message { return new(wire.LogResult) }, true},
	{"Snapshot", func() proto.Message { return new(wire.SnapshotRequest) }, func() proto.Message { return new(wire.SnapshotChunk) }, true},
}

// wireSeed is a request of a method of wireMethods (its index).
type wireSeed struct {
	method uint8
	req    proto.Message
}

// wireSeeds are the fuzz tests' seeds: requests of every call, hostile
// in the ways a storage node bounds (keys that are not in the key
// encoding, negative partitions, unknown operation kinds, malformed
// patches, huge waits, limits and byte bounds), in database d of table T
// (key k, document {"v": string}).
func wireSeeds() []wireSeed {
	index := wireIndex()
	var seeds []wireSeed
	for _, r := range []proto.Message{
		&wire.GetRequest{Db: "d", Table: "T", Partition: 0, Key: keys.Encode([]keys.Part{keys.S("a")})},
		&wire.GetRequest{Db: "d", Table: "T", Partition: -1, Key: []byte{0xff, 0x00}},
		&wire.MultiGetRequest{Db: "d", Table: "T", Keys: [][]byte{{0x10}, nil}},
		&wire.MultiGetRequest{Db: "d", Table: "T", Keys: [][]byte{keys.Encode([]keys.Part{keys.S("a")}), keys.Encode([]keys.Part{keys.S("a")})}, MaxBytes: 1},
		&wire.MultiGetRequest{Db: "d", Table: "T", Keys: [][]byte{keys.Encode([]keys.Part{keys.S("a")})}, MaxBytes: -1 << 62},
		&wire.ScanRequest{Db: "d", Table: "T", Limit: -5, After: []byte{}},
		&wire.ScanRequest{Db: "d", Table: "T", Prefix: keys.Encode([]keys.Part{keys.S("a")}), Query: "v:x OR (NOT \"a b\")", Sort: "-v", After: []byte{1, 0xff, 2}},
		&wire.ScanRequest{Db: "d", Table: "T", Query: "x", Limit: 1 << 30},
		&wire.ScanRequest{Db: "d", Table: "T", Limit: 0, MaxBytes: 1},
		&wire.ScanRequest{Db: "d", Table: "T", Query: "x", MaxBytes: 1 << 62},
		&wire.WriteRequest{Db: "d", Ops: []*wire.Op{{Kind: "put", Table: "T", Key: keys.Encode([]keys.Part{keys.S("x")}), Version: 1, Value: []byte{0x02, 'h'}}}},
		&wire.WriteRequest{Db: "d", Ops: []*wire.Op{{Kind: "patch", Table: "T", Key: keys.Encode([]keys.Part{keys.S("x")}), Patch: []byte(`{"set":{"v":`)}}},
		&wire.WriteRequest{Db: "d", Ops: []*wire.Op{{Kind: "deleteCollection", Table: "T"}, {Kind: "bogus"}}},
		&wire.WriteRequest{Db: "d", Partition: 1, Ops: []*wire.Op{{Kind: "put", Table: "T", Key: keys.Encode([]keys.Part{keys.S("g")}), Version: 1, Value: []byte{0xff, 0xff, 0xff}}}},
		&wire.LogRequest{Db: "d", Max: 1 << 30, WaitNanos: 1 << 62, After: &wire.SCN{Gen: 9, Seq: 1 << 63}},
		&wire.AckRequest{Db: "d", Replica: "r", Scn: &wire.SCN{Gen: 1, Seq: 1}},
		&wire.ChecksumRequest{Db: "d", At: &wire.SCN{Gen: 1, Seq: 99}, WaitNanos: 1 << 62},
		&wire.HelloRequest{MinVersion: 99, MaxVersion: 1},
		&wire.SnapshotRequest{Db: "d", Partition: 1, BytesPerSecond: 1},
		&wire.SnapshotRequest{Db: "d", Partition: 1 << 30, BytesPerSecond: -5},
	} {
		name := strings.TrimSuffix(string(r.ProtoReflect().Descriptor().Name()), "Request")
		m, ok := index[name]
		if !ok {
			panic("no call takes a " + name + "Request")
		}
		seeds = append(seeds, wireSeed{m, r})
	}
	// Staleness bounds on reads of many documents: a node that masters
	// all answers them as a master.
	seeds = append(seeds,
		wireSeed{index["MultiGet"], &wire.MultiGetRequest{Db: "d", Table: "T", Keys: [][]byte{keys.Encode([]keys.Part{keys.S("a")})}, MaxStaleNanos: -1 << 62}},
		wireSeed{index["Scan"], &wire.ScanRequest{Db: "d", Table: "T", Query: "x", MaxStaleNanos: 1 << 62}})
	// Byte bounds on log answers.
	for _, m := range []uint8{index["Log"], index["StreamLog"]} {
		for _, r := range []*wire.LogRequest{{Db: "d", Max: 5, MaxBytes: -1 << 62}, {Db: "d", MaxBytes: 1}} {
			seeds = append(seeds, wireSeed{m, r})
		}
	}
	return seeds
}

// wireIndex maps each call's name to its index in wireMethods.
func wireIndex() map[string]uint8 {
	index := map[string]uint8{}
	for i, m := range wireMethods {
		index[m.name] = uint8(i)
	}
	return index
}

// sentinelKey and sentinelValue are the document the fuzz tests write
// first and check after every input: Avro string "sentinel" at key
// sentinel of table T.
var (
	sentinelKey   = keys.Encode([]keys.Part{keys.S("sentinel")})
	sentinelValue = []byte{0x10, 's', 'e', 'n', 't', 'i', 'n', 'e', 'l'}
)

// sparesSentinel reports whether req leaves the sentinel alone: a write
// to database d that names its key, or deletes a whole collection, is
// not sent.
func sparesSentinel(req proto.Message) bool {
	w, ok := req.(*wire.WriteRequest)
	if !ok || w.Db != "d" {
		return true
	}
	for _, op := range w.Ops {
		if string(op.Key) == string(sentinelKey) || op.Kind == "deleteCollection" {
			return false
		}
	}
	return true
}

// callWire decodes body as the request of wireMethods[method] (modulo
// their number) and, unless it is no such request or send refuses it,
// sends it on conn with a deadline of 3 s. The call must end within it
// (with a result or a status error): a call whose own wait is longer is
// cut by the caller's deadline, which the servers honour. It returns
// the request and the result (nil unless the call succeeded).
func callWire(t *testing.T, conn *grpc.ClientConn, method uint8, body []byte, send func(proto.Message) bool) (req, res proto.Message, err error, sent bool) {
	m := wireMethods[int(method)%len(wireMethods)]
	req, res = m.req(), m.res()
	if proto.Unmarshal(body, req) != nil || !send(req) {
		return nil, nil, nil, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	if m.stream {
		// The first message (or the end) of the stream, then leave.
		err = firstOfStream(ctx, conn, m.name, req, res)
	} else {
		err = conn.Invoke(ctx, "/cortado.wire.v1.Node/"+m.name, req, res, grpc.WaitForReady(true))
	}
	if _, ok := status.FromError(err); !ok && err != io.EOF {
		t.Fatalf("%s: not a status error: %v", m.name, err)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Fatalf("%s took %v: past its 3 s deadline", m.name, took)
	}
	if err != nil {
		res = nil
	}
	return req, res, err, true
}

// FuzzInternalAPI sends a storage node that masters every partition
// arbitrary internal requests: the fuzzer's bytes decoded as each call's
// request message (wireSeeds). Every call answers (a result or a status
// error) within its deadline (callWire), the node stays up, a sentinel
// document written first is unchanged, and what a write stored reads
// give back. `scripts/test` runs it for a bounded time.
func FuzzInternalAPI(f *testing.F) {
	for _, s := range wireSeeds() {
		b, _ := proto.Marshal(s.req)
		f.Add(s.method, b)
	}
	reg := newTestRegistry(f, schema.Database{Name: "d", Partitions: 2})
	n := newStorageNodeWith(f, reg, node.Options{AllMaster: true})
	p := partitionOf(f, reg, "sentinel")
	ctx := context.Background()
	r := remote(f, n.url)
	if _, err := r.Write(ctx, node.WriteRequest{DB: "d", Partition: p, Ops: []node.Op{{Kind: node.OpPut, Table: "T", Key: []keys.Part{keys.S("sentinel")}, Version: 1, Value: sentinelValue}}}); err != nil {
		f.Fatal(err)
	}
	before, err := r.Get(ctx, node.GetRequest{DB: "d", Table: "T", Partition: p, Key: []keys.Part{keys.S("sentinel")}})
	if err != nil {
		f.Fatal(err)
	}
	conn, err := wire.Dial(n.url)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { conn.Close() })
	f.Fuzz(func(t *testing.T, method uint8, body []byte) {
		// The checks end well inside the 10 s after which Go's fuzz
		// worker gives up on an input as hung.
		ctx, cancel := context.WithTimeout(ctx, 7*time.Second)
		defer cancel()
		req, _, callErr, sent := callWire(t, conn, method, body, sparesSentinel)
		if !sent {
			return
		}
		after, err := r.Get(ctx, node.GetRequest{DB: "d", Table: "T", Partition: p, Key: []keys.Part{keys.S("sentinel")}})
		if err != nil || after.ETag != before.ETag || after.SCN != before.SCN {
			t.Fatalf("after %v: sentinel %+v, %v; was %+v", req, after, err, before)
		}
		// What a write stored, reads give back.
		if w, ok := req.(*wire.WriteRequest); ok && callErr == nil && w.Db == "d" && w.Partition >= 0 && w.Partition < 2 {
			for _, op := range w.Ops {
				k, kerr := keys.Decode(op.Key)
				if op.Kind != "put" || op.Table != "T" || kerr != nil || len(k) != 1 {
					continue
				}
				if _, gerr := r.Get(ctx, node.GetRequest{DB: "d", Table: "T", Partition: int(w.Partition), Key: k}); gerr != nil && !errors.Is(gerr, node.ErrNotFound) {
					t.Fatalf("after %v: reading %v back: %v", w, k, gerr)
				}
			}
		}
	})
}

// FuzzReplicatedInternalAPI is FuzzInternalAPI against a replicated
// cluster: three storage nodes, each the master of some of the four
// partitions and a slave of the others (replicas 3, semi-sync), and a
// relay, whose log API (Hello, Log, StreamLog; the other calls are
// unimplemented there) takes the same inputs. So slaves are sent writes,
// masters acknowledgements that name any replica (stored per partition:
// bounded, TestAcksFromStrangersAreBounded), and the relay log requests
// of every shape. Besides FuzzInternalAPI's checks: a write a node
// accepted was sent to the partition's master, with keys of that
// partition, and every replica then holds the same contents at the
// write's SCN (their checksums there).
func FuzzReplicatedInternalAPI(f *testing.F) {
	const targets = 4 // the three nodes, then the relay
	add := func(target int, s wireSeed) {
		b, _ := proto.Marshal(s.req)
		f.Add(uint8(target), s.method, b)
	}
	seeds, index := wireSeeds(), wireIndex()
	for p := range int32(4) {
		// Acknowledgements from a slave, from strangers with long and
		// short names, and one of a commit no replica holds; log reads
		// that acknowledge; a write of one key to each partition (its
		// own takes it, the others refuse it).
		seeds = append(seeds,
			wireSeed{index["Ack"], &wire.AckRequest{Db: "d", Partition: p, Replica: "n1", Scn: &wire.SCN{Gen: 1, Seq: 1}}},
			wireSeed{index["Ack"], &wire.AckRequest{Db: "d", Partition: p, Replica: strings.Repeat("n", 4096), Scn: &wire.SCN{Gen: 1, Seq: 1}}},
			wireSeed{index["Ack"], &wire.AckRequest{Db: "d", Partition: p, Replica: "n2", Scn: &wire.SCN{Gen: 1, Seq: 1 << 40}}},
			wireSeed{index["Log"], &wire.LogRequest{Db: "d", Partition: p, Ack: true, Replica: "n0", After: &wire.SCN{Gen: 1, Seq: 1}, WaitNanos: int64(time.Millisecond)}},
			wireSeed{index["StreamLog"], &wire.LogRequest{Db: "d", Partition: p, AckedOnly: true, WatchAcked: true, BufferOnly: true}},
			wireSeed{index["Write"], &wire.WriteRequest{Db: "d", Partition: p, Ops: []*wire.Op{{Kind: "put", Table: "T", Key: keys.Encode([]keys.Part{keys.S("w")}), Version: 1, Value: []byte{0x02, 'w'}}}}})
	}
	// Each to one target in turn (every one at each run of the tests
	// costs seconds: calls that wait out their deadline), and the log
	// reads to the relay too.
	for i, s := range seeds {
		add(i%targets, s)
		if m := wireMethods[s.method].name; (m == "Log" || m == "StreamLog" || m == "Hello") && i%targets != targets-1 {
			add(targets-1, s)
		}
	}
	c := startClusterWith(f, clusterOptions{nodes: 3, partitions: 4, replicas: 3, relayBuffer: 100})
	c.put("sentinel", "sentinel")
	ids := slices.Sorted(maps.Keys(c.nodes))
	var conns []*grpc.ClientConn
	var urls []string
	remotes := map[string]*node.Remote{}
	for _, id := range ids {
		remotes[id] = remote(f, c.nodes[id].url)
		urls = append(urls, c.nodes[id].url)
	}
	for _, url := range append(urls, c.relayURL) {
		conn, err := wire.Dial(url)
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { conn.Close() })
		conns = append(conns, conn)
	}
	p := partitionOf(f, c.reg, "sentinel")
	master, _ := c.view.Table("d").Master(p)
	db, err := c.reg.Database("d")
	if err != nil {
		f.Fatal(err)
	}
	ctx := context.Background()
	sentinel := node.GetRequest{DB: "d", Table: "T", Partition: p, Key: []keys.Part{keys.S("sentinel")}}
	before, err := remotes[master].Get(ctx, sentinel)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, target, method uint8, body []byte) {
		ctx, cancel := context.WithTimeout(ctx, 7*time.Second)
		defer cancel()
		to := int(target) % targets
		req, res, _, sent := callWire(t, conns[to], method, body, sparesSentinel)
		if !sent {
			return
		}
		table := c.view.Table("d")
		if m, _ := table.Master(p); m != master {
			t.Fatalf("after %v: the sentinel's partition moved from %s to %s", req, master, m)
		}
		after, err := remotes[master].Get(ctx, sentinel)
		if err != nil || after.ETag != before.ETag || after.SCN != before.SCN {
			t.Fatalf("after %v: sentinel %+v, %v; was %+v", req, after, err, before)
		}
		w, ok := req.(*wire.WriteRequest)
		if !ok || res == nil {
			return
		}
		// A write was accepted: by the partition's master, and every
		// replica comes to hold the same at its SCN.
		if to == len(ids) || w.Db != "d" || w.Partition < 0 || int(w.Partition) >= len(table.Partitions) {
			t.Fatalf("%v accepted by %s", w, append(ids, "the relay")[to])
		}
		part := int(w.Partition)
		if m, _ := table.Master(part); m != ids[to] {
			t.Fatalf("%v accepted by %s, a slave of partition %d (its master: %s)", w, ids[to], part, m)
		}
		for _, op := range w.Ops {
			if k, err := keys.Decode(op.Key); err == nil && len(k) > 0 && db.PartitionOf(k[0]) != part {
				t.Fatalf("%v accepted: a key of partition %d stored in partition %d", w, db.PartitionOf(k[0]), part)
			}
		}
		scn := res.(*wire.WriteResult).GetScn()
		at := storage.SCN{Gen: scn.GetGen(), Seq: scn.GetSeq()}
		var sums []uint64
		for _, id := range table.Partitions[part].Replicas {
			sum, err := remotes[id].Checksum(ctx, node.ChecksumRequest{DB: "d", Partition: part, At: at, Wait: 5 * time.Second})
			if err != nil {
				t.Fatalf("after %v: the checksum of %s's replica at %s: %v", w, id, at, err)
			}
			sums = append(sums, sum.Sum)
		}
		if slices.Min(sums) != slices.Max(sums) {
			t.Fatalf("after %v: the replicas %v of partition %d differ at %s: %x", w, table.Partitions[part].Replicas, part, at, sums)
		}
	})
}

// firstOfStream opens a server stream, sends req and reads one message
// (or the stream's end) into res.
func firstOfStream(ctx context.Context, conn *grpc.ClientConn, name string, req, res proto.Message) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, "/cortado.wire.v1.Node/"+name, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	if err := st.SendMsg(req); err != nil {
		return err
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	return st.RecvMsg(res)
}

// partitionOf is the partition of a string key in database d.
func partitionOf(t testing.TB, reg interface {
	Database(string) (*schema.Database, error)
}, k string) int {
	d, err := reg.Database("d")
	if err != nil {
		t.Fatal(err)
	}
	return d.PartitionOf(keys.S(k))
}

package clustertest

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/schema"
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

// FuzzInternalAPI sends a storage node arbitrary internal requests: the
// fuzzer's bytes decoded as each call's request message (keys that are
// not in the key encoding, negative partitions, unknown operation kinds,
// malformed patches, huge waits). Every call answers (a result or a
// status error) within its deadline, the node stays up, and a sentinel
// document written first is unchanged. `scripts/test` runs it for a
// bounded time.
func FuzzInternalAPI(f *testing.F) {
	seeds := []proto.Message{
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
	}
	for i, m := range seeds {
		b, _ := proto.Marshal(m)
		f.Add(uint8(i), b)
	}
	// Staleness bounds on reads of many documents (MultiGet is method 2,
	// Scan 3): a node that masters all answers them as a master.
	for m, r := range map[uint8]proto.Message{
		2: &wire.MultiGetRequest{Db: "d", Table: "T", Keys: [][]byte{keys.Encode([]keys.Part{keys.S("a")})}, MaxStaleNanos: -1 << 62},
		3: &wire.ScanRequest{Db: "d", Table: "T", Query: "x", MaxStaleNanos: 1 << 62},
	} {
		b, _ := proto.Marshal(r)
		f.Add(m, b)
	}
	// Byte bounds on log answers (Log is method 5, StreamLog 9).
	for _, m := range []uint8{5, 9} {
		for _, r := range []*wire.LogRequest{{Db: "d", Max: 5, MaxBytes: -1 << 62}, {Db: "d", MaxBytes: 1}} {
			b, _ := proto.Marshal(r)
			f.Add(m, b)
		}
	}
	reg := newTestRegistry(f, schema.Database{Name: "d", Partitions: 2})
	n := newStorageNodeWith(f, reg, node.Options{AllMaster: true})
	sentinel := keys.Encode([]keys.Part{keys.S("sentinel")})
	value := []byte{0x10, 's', 'e', 'n', 't', 'i', 'n', 'e', 'l'} // Avro string "sentinel"
	p := partitionOf(f, reg, "sentinel")
	ctx := context.Background()
	r := remote(f, n.url)
	if _, err := r.Write(ctx, node.WriteRequest{DB: "d", Partition: p, Ops: []node.Op{{Kind: node.OpPut, Table: "T", Key: []keys.Part{keys.S("sentinel")}, Version: 1, Value: value}}}); err != nil {
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
		m := wireMethods[int(method)%len(wireMethods)]
		req := m.req()
		if proto.Unmarshal(body, req) != nil {
			return
		}
		if w, ok := req.(*wire.WriteRequest); ok && w.Db == "d" {
			// The sentinel must survive whatever else is written.
			for _, op := range w.Ops {
				if string(op.Key) == string(sentinel) || op.Kind == "deleteCollection" {
					return
				}
			}
		}
		// A call whose own wait is longer is cut by the caller's
		// deadline, which the node honours. The whole input, checks
		// included, ends well inside the 10 s after which Go's fuzz
		// worker gives up on an input as hung.
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		ctx, cancelChecks := context.WithTimeout(ctx, 7*time.Second)
		defer cancelChecks()
		start := time.Now()
		var callErr error
		if m.stream {
			// The first message (or the end) of the stream, then leave.
			callErr = firstOfStream(cctx, conn, m.name, req, m.res())
		} else {
			callErr = conn.Invoke(cctx, "/cortado.wire.v1.Node/"+m.name, req, m.res(), grpc.WaitForReady(true))
		}
		if _, ok := status.FromError(callErr); !ok && callErr != io.EOF {
			t.Fatalf("%s: not a status error: %v", m.name, callErr)
		}
		if took := time.Since(start); took > 4*time.Second {
			t.Fatalf("%s took %v: past its 3 s deadline", m.name, took)
		}
		after, err := r.Get(ctx, node.GetRequest{DB: "d", Table: "T", Partition: p, Key: []keys.Part{keys.S("sentinel")}})
		if err != nil || after.ETag != before.ETag || after.SCN != before.SCN {
			t.Fatalf("after %s %v: sentinel %+v, %v; was %+v", m.name, req, after, err, before)
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

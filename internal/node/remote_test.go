package node

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/storage"
)

// A call on a connection closed meanwhile (the router dropped a node that
// left the cluster while a request was routed to it) is "unavailable, not
// delivered": the router answers 503 and a client may retry, never 500.
func TestCallOnClosedRemoteIsNotDelivered(t *testing.T) {
	r := NewRemote("http://127.0.0.1:1")
	r.Close()
	_, err := r.Write(context.Background(), WriteRequest{DB: "d", Ops: []Op{{Kind: "delete", Table: "T"}}})
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrNotDelivered) {
		t.Fatalf("write on a closed connection: %v, want unavailable and not delivered", err)
	}
}

// TestDeadlinePassedOnTheNode: a call the node reset because the
// request's deadline passed there first is a passed deadline here too
// (the router answers deadline-exceeded), not an unreachable node.
func TestDeadlinePassedOnTheNode(t *testing.T) {
	r := NewRemote("http://127.0.0.1:1")
	defer r.Close()
	err := r.fail(context.Background(), status.Error(codes.DeadlineExceeded, "stream terminated by RST_STREAM with error code: CANCEL"))
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("%v, want the deadline passed and not unavailable", err)
	}
}

// TestLogRequestWire: a log request crosses the wire unchanged, and a
// byte bound from the wire is kept within MaxLogBytes.
func TestLogRequestWire(t *testing.T) {
	r := LogRequest{DB: "d", Partition: 3, Max: 16, MaxBytes: 65536, Wait: time.Second, Ack: true, Replica: "n1", BufferOnly: true}
	r.After.Gen, r.After.Seq = 2, 7
	if got := logFrom(logTo(r)); got != r {
		t.Fatalf("%+v crossed the wire as %+v", r, got)
	}
	for _, hostile := range []int64{-1, 1 << 40} {
		w := logTo(r)
		w.MaxBytes = hostile
		if got := logFrom(w).MaxBytes; got < 0 || got > MaxLogBytes {
			t.Fatalf("max_bytes %d from the wire became %d", hostile, got)
		}
	}
}

// TestLogResultWire: a relay's word of how long ago it heard from the
// master crosses the wire; a negative one (which would make a slave
// fresher than its master) arrives as 0.
func TestLogResultWire(t *testing.T) {
	r := &LogResult{Holds: true, SourceRole: Offline, SourceSCN: storage.SCN{Gen: 2, Seq: 9}, SourceBehind: 1500 * time.Millisecond}
	if got := logResultFrom(logResultTo(r)); got.SourceBehind != r.SourceBehind || got.SourceSCN != r.SourceSCN || got.SourceRole != Offline {
		t.Fatalf("%+v crossed the wire as %+v", r, got)
	}
	w := logResultTo(r)
	w.SourceBehindNanos = -int64(time.Hour)
	if got := logResultFrom(w).SourceBehind; got != 0 {
		t.Fatalf("source_behind_nanos -1h from the wire became %v", got)
	}
}

// TestMultiGetAnswered: an answer under its byte bound covers every key;
// one that reached it covers the keys up to its last document, missing
// and repeated keys included; a bound from the wire stays within
// MaxReadBytes, and a scan's count within MaxScanLimit.
func TestMultiGetAnswered(t *testing.T) {
	k := func(s string) []keys.Part { return []keys.Part{keys.S(s)} }
	item := func(s string, n int) *Item { return &Item{Key: k(s), Body: make([]byte, n)} }
	r := MultiGetRequest{Keys: [][]keys.Part{k("a"), k("b"), k("a"), k("c"), k("d")}, MaxBytes: 100}
	cases := []struct {
		name  string
		items []*Item
		want  int
	}{
		{"nothing found", nil, 5},
		{"under the bound", []*Item{item("a", 40), item("a", 40), item("d", 19)}, 5},
		{"reached at the repeated key", []*Item{item("a", 40), item("a", 60)}, 3},
		{"reached at the first", []*Item{item("a", 100)}, 1},
		{"reached at the last", []*Item{item("a", 40), item("a", 40), item("d", 20)}, 5},
		{"b missing, reached at c", []*Item{item("a", 10), item("a", 10), item("c", 80)}, 4},
	}
	for _, tc := range cases {
		if got := r.Answered(tc.items); got != tc.want {
			t.Errorf("%s: %d keys answered, want %d", tc.name, got, tc.want)
		}
	}
	w := multiGetTo(r)
	if got, err := multiGetFrom(w); err != nil || got.MaxBytes != 100 || len(got.Keys) != 5 {
		t.Fatalf("%+v crossed the wire as %+v (%v)", r, got, err)
	}
	for _, hostile := range []int64{-1, 1 << 40} {
		w.MaxBytes = hostile
		if got, _ := multiGetFrom(w); got.MaxBytes < 0 || got.MaxBytes > MaxReadBytes || got.ByteLimit() > MaxReadBytes {
			t.Fatalf("max_bytes %d from the wire became %d", hostile, got.MaxBytes)
		}
		s := scanTo(ScanRequest{DB: "d", Table: "T"})
		s.MaxBytes, s.Limit = hostile, int32(hostile)
		if got, _ := scanFrom(s); got.MaxBytes < 0 || got.MaxBytes > MaxReadBytes || got.ByteLimit() > MaxReadBytes || got.CountLimit() != MaxScanLimit {
			t.Fatalf("a scan's max_bytes %d and limit %d from the wire became %d bytes, %d documents", hostile, s.Limit, got.ByteLimit(), got.CountLimit())
		}
	}
}

// TestNotMasterNamesTheMaster: a slave's refusal names its master across
// the wire; a refusal without a master known names none.
func TestNotMasterNamesTheMaster(t *testing.T) {
	r := NewRemote("http://127.0.0.1:1")
	defer r.Close()
	hint := MasterHint{ID: "s2", URL: "http://127.0.0.1:7002", Generation: 5}
	err := r.fail(context.Background(), toStatus(&NotMasterError{Hint: hint, Err: ErrNotMaster}, nil))
	var nm *NotMasterError
	if !errors.Is(err, ErrNotMaster) || !errors.As(err, &nm) || nm.Hint != hint {
		t.Fatalf("%v, want not-master naming %+v", err, hint)
	}
	err = r.fail(context.Background(), toStatus(ErrNotMaster, nil))
	if !errors.Is(err, ErrNotMaster) || errors.As(err, &nm) {
		t.Fatalf("%v, want not-master naming no one", err)
	}
}

// TestWireErrorsRoundTrip: every error a node sends across the wire comes
// out on the router's side matching the same sentinel, wrapped or not, so
// a remote node's error maps to the status a local one's does.
func TestWireErrorsRoundTrip(t *testing.T) {
	r := NewRemote("http://127.0.0.1:1")
	defer r.Close()
	for _, k := range wireKinds {
		for _, sent := range []error{k.err, &OpError{Index: 2, Err: errors.Join(errors.New("context"), k.err)}} {
			if err := r.fail(context.Background(), toStatus(sent, &Item{})); !errors.Is(err, k.err) {
				t.Errorf("%s: sent %v, got %v", k.kind, sent, err)
			}
		}
	}
}

// TestEscapedPathsNeedVersion5: a patch path with escapes is not sent to
// a node of a protocol before 5, which would take the backslash for part
// of a map key; to one of 5 it goes.
func TestEscapedPathsNeedVersion5(t *testing.T) {
	r := NewRemote("http://127.0.0.1:1")
	defer r.Close()
	escaped := WriteRequest{DB: "d", Ops: []Op{{Kind: OpPatch, Table: "T", Key: []keys.Part{keys.S("k")},
		Patch: &Patch{Remove: []string{`sites.example\.com`}}}}}
	r.version.Store(4)
	if _, err := r.Write(context.Background(), escaped); !errors.Is(err, ErrBadPatch) {
		t.Fatalf("an escaped path to a node of protocol 4: %v, want a bad patch", err)
	}
	plain := escaped
	plain.Ops = []Op{escaped.Ops[0]}
	plain.Ops[0].Patch = &Patch{Remove: []string{"sites.x"}}
	if _, err := r.Write(context.Background(), plain); errors.Is(err, ErrBadPatch) {
		t.Fatalf("a plain path to a node of protocol 4 was refused: %v", err)
	}
	r.version.Store(5)
	if _, err := r.Write(context.Background(), escaped); errors.Is(err, ErrBadPatch) {
		t.Fatalf("an escaped path to a node of protocol 5 was refused: %v", err)
	}
}

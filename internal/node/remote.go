package node

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
	"github.com/cortado-db/cortado/internal/wire"
)

// The storage node's internal API is the gRPC service of package wire.
// Errors cross it as a wire.Error in the status details, so the router
// maps a remote node's error exactly as it maps a local one.

var wireKinds = []struct {
	kind string
	err  error
	code codes.Code
}{
	{"not-found", ErrNotFound, codes.NotFound},
	{"precondition-failed", ErrPreconditionFailed, codes.FailedPrecondition},
	{"not-modified", ErrNotModified, codes.FailedPrecondition},
	{"not-master", ErrNotMaster, codes.FailedPrecondition},
	{"not-enough-replicas", ErrNotEnoughReplicas, codes.FailedPrecondition},
	{"truncate-acknowledged", storage.ErrTruncateAcknowledged, codes.DataLoss},
	{"drain-incomplete", ErrDrainIncomplete, codes.FailedPrecondition},
	{"storage-failed", storage.ErrFailed, codes.Internal},
	{"not-replicated", ErrNotReplicated, codes.Aborted},
	{"too-stale", ErrTooStale, codes.FailedPrecondition},
	{"bad-patch", ErrBadPatch, codes.InvalidArgument},
	{"bad-request", errBadRequest, codes.InvalidArgument},
	{"no-database", registry.ErrNoDatabase, codes.NotFound},
	{"no-table", registry.ErrNoTable, codes.NotFound},
	{"no-version", registry.ErrNoVersion, codes.NotFound},
	{"deadline", context.DeadlineExceeded, codes.DeadlineExceeded},
	{"passed", storage.ErrPassed, codes.OutOfRange},
	{"keys-exhausted", storage.ErrKeysExhausted, codes.FailedPrecondition},
	{"commit-too-large", storage.ErrCommitTooLarge, codes.FailedPrecondition},
	{"unavailable", ErrUnavailable, codes.Unavailable},
	{"invalid-query", ErrInvalidQuery, codes.InvalidArgument},
	{"index-building", ErrIndexBuilding, codes.FailedPrecondition},
}

// toStatus carries err across the wire; item is the headers of a
// not-modified read, or a slave's not-found one (its staleness).
func toStatus(err error, item *Item) error {
	w := &wire.Error{Kind: "internal", Message: err.Error()}
	code := codes.Unknown
	var oe *OpError
	if errors.As(err, &oe) {
		// The index travels beside the message, which fromWire wraps
		// in an OpError again: the message does not repeat it.
		w.HasOp, w.Op = true, int32(oe.Index)
		if err == error(oe) {
			w.Message = oe.Err.Error()
		}
	}
	var fe *schema.FieldError
	if errors.As(err, &fe) {
		w.Kind, w.Path, w.Message, code = "field", fe.Path, fe.Reason, codes.InvalidArgument
	} else {
		for _, k := range wireKinds {
			if errors.Is(err, k.err) {
				w.Kind, code = k.kind, k.code
				break
			}
		}
	}
	if item != nil && (errors.Is(err, ErrNotModified) || errors.Is(err, ErrNotFound)) {
		w.Item = itemTo(item)
	}
	var nm *NotMasterError
	if errors.As(err, &nm) {
		w.Master = &wire.MasterHint{Id: nm.Hint.ID, Url: nm.Hint.URL, Generation: nm.Hint.Generation}
	}
	st, serr := status.New(code, w.Message).WithDetails(w)
	if serr != nil {
		return status.Error(code, w.Message)
	}
	return st.Err()
}

// fromWire is the error a wire.Error stands for.
func fromWire(w *wire.Error) error {
	var err error = &remoteError{msg: w.Message}
	if w.Kind == "field" {
		err = &schema.FieldError{Path: w.Path, Reason: w.Message}
	}
	for _, k := range wireKinds {
		if k.kind == w.Kind {
			err = &remoteError{msg: w.Message, is: k.err}
		}
	}
	if h := w.GetMaster(); h.GetUrl() != "" && errors.Is(err, ErrNotMaster) {
		err = &NotMasterError{Hint: MasterHint{ID: h.GetId(), URL: h.GetUrl(), Generation: h.GetGeneration()}, Err: err}
	}
	if w.HasOp {
		err = &OpError{Index: int(w.Op), Err: err}
	}
	return err
}

// remoteError is an error reported by a remote node; it matches the
// sentinel it was made from with errors.Is.
type remoteError struct {
	msg string
	is  error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.is }

// Remote is a storage node (or, for the log, a relay) reached over the
// internal protocol. Close releases its connection.
type Remote struct {
	base    string
	conn    *grpc.ClientConn
	c       wire.NodeClient
	maxV    uint32
	version atomic.Uint32 // negotiated; 0 until the first call
	hello   sync.Mutex
	stall   *stallGuard // of the document calls
}

// NewRemote returns the Service of the node at base (e.g.
// "http://10.0.0.5:7070", the URL it registered): one connection, shared
// by every call, opened on first use.
func NewRemote(base string) *Remote {
	return newRemote(base, wire.Version, newStallGuard(StallOptions{}))
}

func newRemote(base string, maxVersion uint32, stall *stallGuard) *Remote {
	r := &Remote{base: strings.TrimSuffix(base, "/"), maxV: maxVersion, stall: stall}
	conn, err := wire.Dial(r.base)
	if err == nil {
		r.conn, r.c = conn, wire.NewNodeClient(conn)
		stall.ping = r.ping
	}
	return r
}

// ping asks the node whether it is alive (the stall guard's ping): Hello,
// which no admission holds back.
func (r *Remote) ping(ctx context.Context) error {
	_, err := r.c.Hello(ctx, &wire.HelloRequest{MinVersion: wire.MinVersion, MaxVersion: r.maxV})
	return err
}

// Quiet is how long the node has answered none of the document calls
// waiting on it (0 while none waits): a router hedges at once a read to
// a node that has been quiet for long.
func (r *Remote) Quiet() time.Duration { return r.stall.quiet() }

// Addr is the node's URL.
func (r *Remote) Addr() string { return r.base }

// Left ends the document calls waiting on the node, which left the
// cluster, as unavailable (stallGuard.leave).
func (r *Remote) Left() { r.stall.leave() }

// Close closes the connection, and waits for the stall guard's ping.
func (r *Remote) Close() error {
	if r.conn == nil {
		return nil
	}
	err := r.conn.Close()
	r.stall.close()
	return err
}

var _ Service = (*Remote)(nil)

// protocol returns the protocol version agreed with the remote side,
// exchanging versions on the first call (and again after the remote side
// was found to have changed).
func (r *Remote) protocol(ctx context.Context) (uint32, error) {
	if r.c == nil {
		return 0, fmt.Errorf("storage node %q: %w (%w): bad address", r.base, ErrUnavailable, ErrNotDelivered)
	}
	if v := r.version.Load(); v != 0 {
		return v, nil
	}
	r.hello.Lock()
	defer r.hello.Unlock()
	if v := r.version.Load(); v != 0 {
		return v, nil
	}
	res, err := r.c.Hello(ctx, &wire.HelloRequest{MinVersion: wire.MinVersion, MaxVersion: r.maxV})
	if err != nil {
		return 0, r.fail(ctx, err)
	}
	v, err := wire.Negotiate(wire.MinVersion, r.maxV, res.MinVersion, res.MaxVersion)
	if err != nil {
		return 0, fmt.Errorf("storage node %s: %w", r.base, err)
	}
	r.version.Store(v)
	return v, nil
}

// fail turns a failed call's error into the node's error, or into
// ErrUnavailable (with ErrNotDelivered when the request never left: the
// connection could not be made).
func (r *Remote) fail(ctx context.Context, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("storage node %s: %w: %v", r.base, ErrUnavailable, err)
	}
	for _, d := range st.Details() {
		if w, ok := d.(*wire.Error); ok {
			return fromWire(w)
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	// No wire.Error: the status is the transport's, not the node's (a
	// connection reset, a stream cancelled by a stopping server). The
	// request may or may not have been carried out.
	switch st.Code() {
	case codes.Unavailable, codes.Canceled:
		// A connection that could not be made, or one this side closed
		// (the caller is stopping) before the call was sent.
		if strings.Contains(st.Message(), "while dialing") || strings.Contains(st.Message(), "client connection is closing") {
			return fmt.Errorf("storage node %s: %w (%w): %s", r.base, ErrUnavailable, ErrNotDelivered, st.Message())
		}
	case codes.DeadlineExceeded:
		// The node had the same deadline and reset the call when it
		// passed there, a moment before it did here: the request's
		// deadline passed, as when ctx ends first.
		return fmt.Errorf("storage node %s: %w: %s", r.base, context.DeadlineExceeded, st.Message())
	case codes.ResourceExhausted:
		return fmt.Errorf("storage node %s: %w: %s", r.base, ErrOverloaded, st.Message())
	case codes.Unimplemented:
		r.version.Store(0) // the other side changed: agree again
		return fmt.Errorf("storage node %s: %s: %s", r.base, st.Code(), st.Message())
	}
	return fmt.Errorf("storage node %s: %w: %s: %s", r.base, ErrUnavailable, st.Code(), st.Message())
}

// call runs one unary call, f (a method expression of wire.NodeClient),
// after the version exchange.
func call[Req, Res any](r *Remote, ctx context.Context, f func(wire.NodeClient, context.Context, Req, ...grpc.CallOption) (Res, error), req Req) (Res, error) {
	var zero Res
	if _, err := r.protocol(ctx); err != nil {
		return zero, err
	}
	res, err := f(r.c, ctx, req)
	if err != nil {
		return zero, r.fail(ctx, err)
	}
	return res, nil
}

// errItem returns the headers an error carries: a not-modified read's,
// or a slave's not-found read's.
func errItem(err error) *Item {
	st, ok := status.FromError(err)
	if !ok {
		return nil
	}
	for _, d := range st.Details() {
		if w, ok := d.(*wire.Error); ok && w.Item != nil {
			it, _ := itemFrom(w.Item)
			return it
		}
	}
	return nil
}

// Get implements Service.
func (r *Remote) Get(ctx context.Context, req GetRequest) (*Item, error) {
	if _, err := r.protocol(ctx); err != nil {
		return nil, err
	}
	ctx, end, err := r.stall.begin(ctx, r.base)
	if err != nil {
		return nil, err
	}
	w, err := r.c.Get(ctx, getTo(req))
	if err != nil {
		return errItem(err), end(r.fail(ctx, err))
	}
	end(nil)
	return itemFrom(w)
}

// guarded is call for a document call: under the stall guard.
func guarded[Req, Res any](r *Remote, ctx context.Context, f func(wire.NodeClient, context.Context, Req, ...grpc.CallOption) (Res, error), req Req) (Res, error) {
	ctx, end, err := r.stall.begin(ctx, r.base)
	if err != nil {
		var zero Res
		return zero, err
	}
	res, err := call(r, ctx, f, req)
	return res, end(err)
}

// MultiGet implements Service.
func (r *Remote) MultiGet(ctx context.Context, req MultiGetRequest) (*MultiGetResult, error) {
	w, err := guarded(r, ctx, wire.NodeClient.MultiGet, multiGetTo(req))
	if err != nil {
		return nil, err
	}
	items, err := itemsFrom(w.Items)
	if err != nil {
		return nil, err
	}
	return &MultiGetResult{Items: items, Stale: time.Duration(w.StaleNanos)}, nil
}

// Scan implements Service.
func (r *Remote) Scan(ctx context.Context, req ScanRequest) (*ScanResult, error) {
	if req.Query != "" {
		// An older node would ignore the query and answer a plain scan.
		v, err := r.protocol(ctx)
		if err != nil {
			return nil, err
		}
		if v < 4 {
			return nil, fmt.Errorf("storage node %s speaks protocol %d: %w: queries need 4 (upgrade it)", r.base, v, ErrUnavailable)
		}
	}
	w, err := guarded(r, ctx, wire.NodeClient.Scan, scanTo(req))
	if err != nil {
		return nil, err
	}
	items, err := itemsFrom(w.Items)
	if err != nil {
		return nil, err
	}
	return &ScanResult{Items: items, Next: w.Next, SCN: scnFrom(w.Scn), Stale: max(0, time.Duration(w.StaleNanos))}, nil
}

// Write implements Service.
func (r *Remote) Write(ctx context.Context, req WriteRequest) (*WriteResult, error) {
	if escapes(req) {
		v, err := r.protocol(ctx)
		if err != nil {
			return nil, err
		}
		if v < 5 {
			return nil, fmt.Errorf("%w: storage node %s speaks protocol version %d, which reads a backslash in a patch path as part of a key; escaped paths work once every node runs a version that speaks 5 (nothing was done)", ErrBadPatch, r.base, v)
		}
	}
	if keepsMarks(req) {
		v, err := r.protocol(ctx)
		if err != nil {
			return nil, err
		}
		if v < 6 {
			return nil, fmt.Errorf("storage node %s speaks protocol %d: %w: restoring auto-increment marks needs 6 (upgrade it; nothing was done)", r.base, v, ErrUnavailable)
		}
	}
	wr, err := writeTo(req)
	if err != nil {
		return nil, err
	}
	w, err := guarded(r, ctx, wire.NodeClient.Write, wr)
	if err != nil {
		return nil, err
	}
	return writeResultFrom(w)
}

// Log implements LogSource: one long poll.
func (r *Remote) Log(ctx context.Context, req LogRequest) (*LogResult, error) {
	w, err := call(r, ctx, wire.NodeClient.Log, logTo(req))
	if err != nil {
		return nil, err
	}
	return logResultFrom(w), nil
}

// logIdle is how long a log stream may stay silent (its source sends a
// heartbeat every logHeartbeat) before the reader takes it for dead.
const logIdle = 5 * logHeartbeat

// StreamLog implements LogStreamer: on protocol 2 one stream, on protocol
// 1 successive long polls.
func (r *Remote) StreamLog(ctx context.Context, req LogRequest, fn func(*LogResult) error) error {
	v, err := r.protocol(ctx)
	if err != nil {
		return err
	}
	if v < 2 {
		return pollLog(ctx, r, req, fn)
	}
	return receive(r, ctx, func(ctx context.Context) (grpc.ServerStreamingClient[wire.LogResult], error) {
		return r.c.StreamLog(ctx, logTo(req))
	}, func(w *wire.LogResult) (bool, error) {
		res := logResultFrom(w)
		return res.Diverged || res.Trimmed, fn(res)
	})
}

// receive reads a server stream opened by open into fn until fn says it
// is done or fails. A stream silent for logIdle is taken for dead; the
// time fn takes does not count (a slow reader, such as a change-stream
// consumer or a slave waiting on its disk, is not a silent source).
func receive[W any](r *Remote, ctx context.Context, open func(context.Context) (grpc.ServerStreamingClient[W], error), fn func(*W) (done bool, err error)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	idle := time.AfterFunc(logIdle, cancel)
	defer idle.Stop()
	stream, err := open(ctx)
	if err != nil {
		return r.streamFail(ctx, idle, err)
	}
	for {
		w, err := stream.Recv()
		if err != nil {
			return r.streamFail(ctx, idle, err)
		}
		if !idle.Stop() {
			return r.streamFail(ctx, idle, ctx.Err())
		}
		done, err := fn(w)
		if err != nil || done {
			return err
		}
		idle.Reset(logIdle)
	}
}

func (r *Remote) streamFail(ctx context.Context, idle *time.Timer, err error) error {
	if !idle.Stop() && ctx.Err() != nil {
		// The idle timer fired (or ctx ended) before the source spoke.
		return fmt.Errorf("storage node %s: %w: log stream silent for %v", r.base, ErrUnavailable, logIdle)
	}
	return r.fail(ctx, err)
}

// Ack implements Acker.
func (r *Remote) Ack(ctx context.Context, req AckRequest) (*AckResult, error) {
	w, err := call(r, ctx, wire.NodeClient.Ack, &wire.AckRequest{Db: req.DB, Partition: int32(req.Partition), Replica: req.Replica, Scn: scnTo(req.SCN)})
	if err != nil {
		return nil, err
	}
	return &AckResult{Held: w.Held, Authoritative: w.Authoritative, Head: scnFrom(w.Head), Acknowledged: scnFrom(w.Acknowledged)}, nil
}

// Status lists the remote node's partitions.
func (r *Remote) Status(ctx context.Context, req StatusRequest) ([]PartitionStatus, error) {
	w, err := call(r, ctx, wire.NodeClient.Status, &wire.StatusRequest{Db: req.DB})
	if err != nil {
		return nil, err
	}
	return statusFrom(w), nil
}

// Checksum checksums a partition on the remote node.
func (r *Remote) Checksum(ctx context.Context, req ChecksumRequest) (*ChecksumResult, error) {
	w, err := call(r, ctx, wire.NodeClient.Checksum, &wire.ChecksumRequest{Db: req.DB, Partition: int32(req.Partition), At: scnTo(req.At), WaitNanos: int64(req.Wait)})
	if err != nil {
		return nil, err
	}
	return &ChecksumResult{SCN: scnFrom(w.Scn), Sum: w.Sum, Tables: w.Tables}, nil
}

// Remotes hands out one Remote per base URL, made on first use, so a
// caller that reaches many nodes shares one connection per node.
type Remotes struct {
	// MaxVersion is the newest protocol version spoken (default
	// wire.Version); set it before first use.
	MaxVersion uint32
	// Stall is each node's stall guard (stall.go) on document calls;
	// set it before first use.
	Stall StallOptions
	// Local, when set before first use, holds the storage nodes and
	// relay of the caller's own process: Source and Peer return those
	// themselves, called without the wire.
	Local *LocalPeers

	mu sync.Mutex
	m  map[string]*Remote
}

// Peer is another storage node as replication reaches it: its log, the
// acknowledgements it counts as a master, and its snapshots.
type Peer interface {
	LogSource
	Acker
	Snapshotter
}

var (
	_ Peer = (*Remote)(nil)
	_ Peer = (*Node)(nil)
)

// LocalPeers holds the storage nodes and relay of one process by the base
// URL they are reached at from other processes (`serve --nodes N`), so
// that replication inside the process calls them directly, as its router
// does its own nodes. Safe for concurrent use: a relay and agents may
// already run while later nodes are added.
type LocalPeers struct {
	mu sync.RWMutex
	m  map[string]LogSource
}

// Add makes src (a *Node, or a relay's log) the log at base.
func (l *LocalPeers) Add(base string, src LogSource) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]LogSource{}
	}
	l.m[base] = src
}

func (l *LocalPeers) get(base string) LogSource {
	if l == nil {
		return nil
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.m[base]
}

// Source returns the log at base: the process's own node or relay when
// Local holds it, else the Remote.
func (rs *Remotes) Source(base string) LogSource {
	if src := rs.Local.get(base); src != nil {
		return src
	}
	return rs.Get(base)
}

// Peer returns the storage node at base: the process's own when Local
// holds it, else the Remote.
func (rs *Remotes) Peer(base string) Peer {
	if p, ok := rs.Local.get(base).(Peer); ok {
		return p
	}
	return rs.Get(base)
}

// Get returns the Remote for base.
func (rs *Remotes) Get(base string) *Remote {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r, ok := rs.m[base]
	if !ok {
		v := rs.MaxVersion
		if v == 0 {
			v = wire.Version
		}
		r = newRemote(base, v, newStallGuard(rs.Stall))
		if rs.m == nil {
			rs.m = map[string]*Remote{}
		}
		rs.m[base] = r
	}
	return r
}

// Left ends the document calls waiting on the node at base, if any were
// made (Remote.Left).
func (rs *Remotes) Left(base string) {
	rs.mu.Lock()
	r := rs.m[base]
	rs.mu.Unlock()
	if r != nil {
		r.Left()
	}
}

// Close closes every connection.
func (rs *Remotes) Close() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, r := range rs.m {
		r.Close()
	}
	rs.m = nil
}

// Snapshot implements Snapshotter (protocol 3).
func (r *Remote) Snapshot(ctx context.Context, req SnapshotRequest, fn func(*SnapshotChunk) error) error {
	v, err := r.protocol(ctx)
	if err != nil {
		return err
	}
	if v < 3 {
		return fmt.Errorf("storage node %s speaks protocol %d: %w: snapshots need 3", r.base, v, ErrUnavailable)
	}
	// A snapshot's reader may be slow (a change-stream consumer): its
	// time is not the source's silence, or a snapshot would never end.
	return receive(r, ctx, func(ctx context.Context) (grpc.ServerStreamingClient[wire.SnapshotChunk], error) {
		return r.c.Snapshot(ctx, &wire.SnapshotRequest{Db: req.DB, Partition: int32(req.Partition), BytesPerSecond: req.BytesPerSecond, Replicated: req.Replicated})
	}, func(w *wire.SnapshotChunk) (bool, error) {
		c := snapshotChunkFrom(w)
		return c.Last, fn(c)
	})
}

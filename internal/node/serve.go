package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cortado-db/cortado/internal/wire"
)

// LogFunc serves one read of a partition's log: a Node's Log, or a
// relay's.
type LogFunc func(context.Context, LogRequest) (*LogResult, error)

// Log implements LogSource.
func (f LogFunc) Log(ctx context.Context, req LogRequest) (*LogResult, error) { return f(ctx, req) }

// DefaultMaxLogStreams is how many log streams (StreamLog) and long
// polls (Log) one internal API serves at once by default. A stream with
// its reader held about 28 KiB and four goroutines (two of them here;
// 10,000 measured in one process) and answers every second (a
// heartbeat): the bound keeps callers that open streams by the million
// from taking the process's memory. A replica's stream, or a relay's, is
// one per partition it reads from this process; the default leaves room
// for tens of thousands of partitions.
const DefaultMaxLogStreams = 65536

// ServeOptions configure the internal API a process serves.
type ServeOptions struct {
	// MaxVersion is the newest protocol version served (default
	// wire.Version). Setting it to an older one makes the process speak
	// as the previous release did: for rolling-upgrade tests.
	MaxVersion uint32
	// MaxLogStreams bounds the log streams and long polls served at
	// once (default DefaultMaxLogStreams; negative: no bound). One beyond
	// it is refused (ResourceExhausted, which a reader takes as overload
	// and tries again after its StreamRetry wait).
	MaxLogStreams int
	// StreamStall bounds how long one message of a stream (a snapshot's
	// chunk, a log stream's answer) may wait for its reader to take it
	// (default DefaultStreamStall; negative: no bound); the stream ends
	// with DeadlineExceeded past it. A snapshot holds one of the node's
	// MaxSnapshots slots, a Pebble snapshot and its partition's log while
	// it streams, a log stream one of MaxLogStreams and its answers'
	// share of LogStreamBytes, so a reader that stops reading must not
	// hold them for good.
	StreamStall time.Duration
	// SnapshotMinReadRate is the slowest a snapshot's reader may take it,
	// in bytes a second over the whole stream after a first StreamStall
	// (default DefaultSnapshotMinReadRate, and at most half the rate the
	// node streams that snapshot at; negative: no floor). A reader that
	// takes a little now and then, never waiting StreamStall for one
	// chunk, would otherwise hold the snapshot for as long as it likes.
	SnapshotMinReadRate int64
	// LogStreamBytes bounds the bytes of commits the process's log
	// streams hold at once in answers not yet written to their readers
	// (default DefaultLogStreamBytes; negative: no bound). An answer
	// waits in memory until its reader takes it, and each stream holds
	// two (one handed to gRPC, encoded; the next one built, and encoded,
	// its Send waiting): up to MaxLogBytes each, so readers that stop
	// reading made the process hold some 50 MiB a stream. The memory
	// held is up to three times the bound. Past the bound a stream's
	// answers shrink, to logAnswerFloor bytes (and at least one commit).
	LogStreamBytes int64
	// Logger is where streams cut off are reported (a node's own logger
	// when nil; slog.Default for a relay's).
	Logger *slog.Logger
}

// DefaultLogStreamBytes is ServeOptions.LogStreamBytes's default;
// logAnswerFloor the least a log stream's answer may carry when the
// bound is spent.
const (
	DefaultLogStreamBytes = 128 << 20
	logAnswerFloor        = 16 << 10
)

// DefaultStreamStall is ServeOptions.StreamStall's default: four times
// a router's write timeout, within which the router itself cuts a
// client that stopped reading, and so stops reading the snapshot or the
// change stream it passes on. DefaultSnapshotMinReadRate is
// ServeOptions.SnapshotMinReadRate's.
const (
	DefaultStreamStall         = 2 * time.Minute
	DefaultSnapshotMinReadRate = 64 << 10
)

// Register serves n's internal API on s.
func Register(s *wire.Server, n *Node, o ServeOptions) {
	if o.Logger == nil {
		o.Logger = n.log
	}
	svc := o.service(s, n.Log)
	svc.n = n
	wire.RegisterNodeServer(s.GRPC, svc)
}

// RegisterLog serves only the log API (Hello, Log, StreamLog) on s, with
// log: what a relay serves.
func RegisterLog(s *wire.Server, log LogFunc, o ServeOptions) {
	wire.RegisterNodeServer(s.GRPC, o.service(s, log))
}

// service is the internal API's service with o's defaults filled in,
// serving log; a node's sets n too.
func (o ServeOptions) service(s *wire.Server, log LogFunc) *service {
	if o.StreamStall == 0 {
		o.StreamStall = DefaultStreamStall
	}
	if o.SnapshotMinReadRate == 0 {
		o.SnapshotMinReadRate = DefaultSnapshotMinReadRate
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &service{log: log, max: o.version(), stopping: s.Stopping(), streams: o.streams(), logBytes: o.logBytes(),
		detach: s.Go, stall: o.StreamStall, snapshotFloor: o.SnapshotMinReadRate, logger: o.Logger}
}

func (o ServeOptions) logBytes() *byteGate {
	if o.LogStreamBytes == 0 {
		o.LogStreamBytes = DefaultLogStreamBytes
	}
	return newByteGate(o.LogStreamBytes)
}

func (o ServeOptions) streams() *streamGate {
	if o.MaxLogStreams == 0 {
		o.MaxLogStreams = DefaultMaxLogStreams
	}
	return &streamGate{max: int64(o.MaxLogStreams)}
}

// streamGate counts the log streams served, up to max (none if max is
// negative).
type streamGate struct {
	max  int64
	open atomic.Int64
}

func (g *streamGate) enter() bool {
	if g.open.Add(1) > g.max && g.max >= 0 {
		g.open.Add(-1)
		return false
	}
	return true
}

func (g *streamGate) leave() { g.open.Add(-1) }

func (g *streamGate) refusal() error {
	return status.Errorf(codes.ResourceExhausted, "this process serves %d log streams and long polls already (--max-log-streams)", g.max)
}

func (o ServeOptions) version() uint32 {
	if o.MaxVersion == 0 {
		return wire.Version
	}
	return o.MaxVersion
}

// logHeartbeat is how often a log stream sends a message when there is
// nothing new: readers learn they are current (slave reads' staleness)
// and find a dead stream.
const logHeartbeat = time.Second

var errBadRequest = errors.New("malformed internal request")

// service is the gRPC face of a node (n set) or of a relay (log only).
type service struct {
	wire.UnimplementedNodeServer
	n        *Node
	log      LogFunc
	max      uint32
	stopping <-chan struct{}
	streams  *streamGate
	logBytes *byteGate // the bytes of log streams' answers not yet written
	// detach runs a stream's sender, which may outlive its handler
	// (wire.Server.Go); stall bounds one Send of it (none if < 0), and
	// snapshotFloor the bytes a second a snapshot's reader takes (none
	// if < 0).
	detach        func(func())
	stall         time.Duration
	snapshotFloor int64
	logger        *slog.Logger
}

func (s *service) node() (*Node, error) {
	if s.n == nil {
		return nil, status.Error(codes.Unimplemented, "a relay serves only the log")
	}
	return s.n, nil
}

func (s *service) Hello(_ context.Context, req *wire.HelloRequest) (*wire.HelloResult, error) {
	if _, err := wire.Negotiate(wire.MinVersion, s.max, req.MinVersion, req.MaxVersion); err != nil {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	return &wire.HelloResult{MinVersion: wire.MinVersion, MaxVersion: s.max}, nil
}

func (s *service) Get(ctx context.Context, w *wire.GetRequest) (*wire.Item, error) {
	n, err := s.node()
	if err != nil {
		return nil, err
	}
	req, err := getFrom(w)
	if err != nil {
		return nil, toStatus(err, nil)
	}
	it, err := n.Get(ctx, req)
	if err != nil {
		return nil, toStatus(err, it)
	}
	return itemTo(it), nil
}

func (s *service) MultiGet(ctx context.Context, w *wire.MultiGetRequest) (*wire.Items, error) {
	n, err := s.node()
	if err != nil {
		return nil, err
	}
	req, err := multiGetFrom(w)
	if err != nil {
		return nil, toStatus(err, nil)
	}
	res, err := n.MultiGet(ctx, req)
	if err != nil {
		return nil, toStatus(err, nil)
	}
	return &wire.Items{Items: itemsTo(res.Items), StaleNanos: int64(res.Stale)}, nil
}

func (s *service) Scan(ctx context.Context, w *wire.ScanRequest) (*wire.ScanResult, error) {
	n, err := s.node()
	if err != nil {
		return nil, err
	}
	req, err := scanFrom(w)
	if err != nil {
		return nil, toStatus(err, nil)
	}
	res, err := n.Scan(ctx, req)
	if err != nil {
		return nil, toStatus(err, nil)
	}
	return &wire.ScanResult{Items: itemsTo(res.Items), Next: res.Next, Scn: scnTo(res.SCN), StaleNanos: int64(res.Stale)}, nil
}

func (s *service) Write(ctx context.Context, w *wire.WriteRequest) (*wire.WriteResult, error) {
	n, err := s.node()
	if err != nil {
		return nil, err
	}
	req, err := writeFrom(w)
	if err != nil {
		return nil, toStatus(err, nil)
	}
	res, err := n.Write(ctx, req)
	if err != nil {
		return nil, toStatus(err, nil)
	}
	return writeResultTo(res), nil
}

func (s *service) Log(ctx context.Context, w *wire.LogRequest) (*wire.LogResult, error) {
	// A long poll holds what a stream does while it waits, and a relay
	// admits no call otherwise: it counts as one.
	if !s.streams.enter() {
		return nil, s.streams.refusal()
	}
	defer s.streams.leave()
	res, err := s.log(ctx, logFrom(w))
	if err != nil {
		return nil, toStatus(err, nil)
	}
	return logResultTo(res), nil
}

// StreamLog sends what successive Log calls would answer, each after the
// last commit sent: the first waits as long as the request says, later
// ones at most logHeartbeat. Only the first acknowledges (the reader holds
// the request's SCN; what it applies later it acknowledges with Ack). It
// ends after telling the reader it diverged, when the reader goes, when
// one answer has waited stall for its reader, or when the server stops.
func (s *service) StreamLog(w *wire.LogRequest, stream wire.Node_StreamLogServer) error {
	if s.max < 2 {
		return status.Error(codes.Unimplemented, "StreamLog needs protocol version 2")
	}
	if !s.streams.enter() {
		return s.streams.refusal()
	}
	// The answers are sent from a goroutine of its own, and the handler
	// watches its Sends (watchSends), as a snapshot's are.
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	var sending atomic.Int64 // when the Send under way began (UnixNano), 0 between Sends
	result := make(chan error, 1)
	s.detach(func() {
		defer s.streams.leave()
		result <- s.streamLog(ctx, w, stream, &sending)
	})
	return s.watchSends(result, &sending, nil, "a log stream", "answer", "db", w.Db, "partition", w.Partition)
}

// streamLog is StreamLog's sender. Each answer is built within what the
// process's bound (logBytes) grants it, and holds its grant until the
// Send after it returns: grpc-go lets a Send return once what came
// before it on the stream was written but for 64 KiB (its write quota),
// so by then this answer has left the process.
func (s *service) streamLog(ctx context.Context, w *wire.LogRequest, stream wire.Node_StreamLogServer, sending *atomic.Int64) error {
	var sent, building int64 // grants: the answer handed to gRPC, and the one being built and sent
	defer func() { s.logBytes.release(sent + building) }()
	budgeted := func(ctx context.Context, req LogRequest) (*LogResult, error) {
		building = s.logBytes.share(int64(req.ByteLimit()), logAnswerFloor)
		req.MaxBytes = int(building)
		res, err := s.log(ctx, req)
		size := int64(0)
		if res != nil {
			for i := range res.Commits {
				size += int64(res.Commits[i].Size())
			}
		}
		if size > building { // an answer holds at least one commit, whatever its size
			building += s.logBytes.share(size-building, size-building)
		} else {
			s.logBytes.release(building - size)
			building = size
		}
		return res, err
	}
	var sendErr error
	err := pollLog(ctx, LogFunc(budgeted), logFrom(w), func(res *LogResult) error {
		m := logResultTo(res)
		sending.Store(time.Now().UnixNano())
		sendErr = stream.Send(m)
		sending.Store(0)
		s.logBytes.release(sent)
		sent, building = building, 0
		return sendErr
	})
	switch {
	case err == nil, sendErr != nil:
		return sendErr
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	}
	return toStatus(err, nil)
}

// watchSends waits for the result of a stream's sender, run detached,
// and returns early (so ending the stream) when the server stops or when
// one of its Sends (sending: when the one under way began, UnixNano, or
// 0) has waited s.stall for its reader; slow, if not nil, is asked at
// each look too, and ends the stream with the error it returns. Only the
// handler's return ends a Send blocked on its reader (grpc-go then ends
// the stream); the sender, detached, returns once that Send fails and
// lets go of what it holds. what and message name the stream and its
// messages in the log and the error; attrs say which partition.
func (s *service) watchSends(result <-chan error, sending *atomic.Int64, slow func() error, what, message string, attrs ...any) error {
	var tick <-chan time.Time
	if s.stall > 0 {
		t := time.NewTicker(max(s.stall/4, time.Millisecond))
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case err := <-result:
			return err
		case <-s.stopping:
			return status.Error(codes.Unavailable, "the node is shutting down")
		case <-tick:
			if at := sending.Load(); at != 0 && time.Since(time.Unix(0, at)) > s.stall {
				s.logger.Warn(what+"'s reader stopped reading: the stream ends", append(attrs, "waited", s.stall)...)
				return status.Errorf(codes.DeadlineExceeded, "%s's reader took no %s for %s", what, message, s.stall)
			}
			if slow == nil {
				continue
			}
			if err := slow(); err != nil {
				s.logger.Warn(what+"'s reader reads too slowly: the stream ends", append(attrs, "err", err)...)
				return status.Error(codes.DeadlineExceeded, err.Error())
			}
		}
	}
}

func (s *service) Ack(ctx context.Context, w *wire.AckRequest) (*wire.AckResult, error) {
	n, err := s.node()
	if err != nil {
		return nil, err
	}
	res, err := n.Ack(ctx, AckRequest{DB: w.Db, Partition: int(w.Partition), Replica: w.Replica, SCN: scnFrom(w.Scn)})
	if err != nil {
		return nil, toStatus(err, nil)
	}
	return &wire.AckResult{Held: res.Held, Authoritative: res.Authoritative, Head: scnTo(res.Head), Acknowledged: scnTo(res.Acknowledged)}, nil
}

func (s *service) Status(ctx context.Context, w *wire.StatusRequest) (*wire.StatusResult, error) {
	n, err := s.node()
	if err != nil {
		return nil, err
	}
	res, err := n.Status(ctx, StatusRequest{DB: w.Db})
	if err != nil {
		return nil, toStatus(err, nil)
	}
	return statusTo(res), nil
}

func (s *service) Checksum(ctx context.Context, w *wire.ChecksumRequest) (*wire.ChecksumResult, error) {
	n, err := s.node()
	if err != nil {
		return nil, err
	}
	res, err := n.Checksum(ctx, ChecksumRequest{DB: w.Db, Partition: int(w.Partition), At: scnFrom(w.At), Wait: time.Duration(w.WaitNanos)})
	if err != nil {
		return nil, toStatus(err, nil)
	}
	return &wire.ChecksumResult{Scn: scnTo(res.SCN), Sum: res.Sum, Tables: res.Tables}, nil
}

// Snapshot streams a consistent snapshot of a partition (protocol 3).
func (s *service) Snapshot(w *wire.SnapshotRequest, stream wire.Node_SnapshotServer) error {
	n, err := s.node()
	if err != nil {
		return err
	}
	if s.max < 3 {
		return status.Error(codes.Unimplemented, "Snapshot needs protocol version 3")
	}
	// The snapshot streams from a goroutine of its own, and the handler
	// watches its Sends (watchSends): a reader that stops reading, or
	// reads too slowly, lets go of the slot, the Pebble snapshot and the
	// log's pin.
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	req := SnapshotRequest{DB: w.Db, Partition: int(w.Partition), BytesPerSecond: w.BytesPerSecond, Replicated: w.Replicated && s.max >= 7}
	floor := min(s.snapshotFloor, n.snapshotRate(req)/2)
	var (
		sending atomic.Int64 // when the Send under way began (UnixNano), 0 between Sends
		started atomic.Int64 // when the first Send began (UnixNano)
		sent    atomic.Int64 // bytes the Sends took
	)
	result := make(chan error, 1)
	s.detach(func() {
		var sendErr error
		err := n.Snapshot(ctx, req, func(c *SnapshotChunk) error {
			m := snapshotChunkTo(c)
			now := time.Now().UnixNano()
			started.CompareAndSwap(0, now)
			sending.Store(now)
			sendErr = stream.Send(m)
			sending.Store(0)
			sent.Add(int64(proto.Size(m)))
			return sendErr
		})
		switch {
		case err == nil:
		case sendErr != nil:
			err = sendErr
		case ctx.Err() != nil:
			err = status.FromContextError(ctx.Err()).Err()
		default:
			err = toStatus(err, nil)
		}
		result <- err
	})
	slow := func() error {
		at := started.Load()
		if at == 0 || floor <= 0 {
			return nil
		}
		late := time.Since(time.Unix(0, at)) - s.stall
		if took := sent.Load(); late > 0 && float64(took) < float64(floor)*late.Seconds() {
			return fmt.Errorf("a snapshot's reader took %d bytes in %s, below %d bytes a second", took, late+s.stall, floor)
		}
		return nil
	}
	return s.watchSends(result, &sending, slow, "a snapshot", "chunk", "db", w.Db, "partition", w.Partition)
}

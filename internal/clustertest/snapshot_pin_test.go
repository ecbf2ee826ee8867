package clustertest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
	"github.com/cortado-db/cortado/internal/wire"
)

// TestSnapshotPinsTheLog: a master whose retention keeps 1 KB of log
// trims nothing after the SCN of a snapshot it streams, so its asker can
// read on from there once the snapshot ends, however many commits come
// meanwhile; nor within the grace after the snapshot ends. Past the
// grace it trims as before. (Without the pin the asker finds the log
// trimmed past the snapshot and is sent back for another: with a
// retention shorter than the stream, round and round.)
func TestSnapshotPinsTheLog(t *testing.T) {
	ctx := context.Background()
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: 1, Replicas: 1,
		Retention: schema.Retention{MaxAge: "0s", MaxBytes: 1024}})
	const grace = time.Hour
	a := newStorageNodeWith(t, reg, node.Options{SnapshotPinGrace: grace})
	a.SetRole("d", 0, node.Master, 1, 0)
	value := strings.Repeat("x", 200)
	for i := range 20 {
		write(t, a, fmt.Sprint("k", i), value)
	}
	// The asker takes the snapshot's first chunk and waits.
	first, release, done := make(chan storage.SCN, 1), make(chan struct{}), make(chan error, 1)
	go func() {
		done <- a.Snapshot(ctx, node.SnapshotRequest{DB: "d", Partition: 0}, func(c *node.SnapshotChunk) error {
			select {
			case first <- c.SCN:
				<-release
			default:
			}
			return nil
		})
	}()
	at := <-first
	const after = 20
	for i := range after {
		write(t, a, fmt.Sprint("n", i), value)
	}
	// trimmed runs a retention pass at now and says whether the log still
	// holds what follows the snapshot.
	trimmed := func(now time.Time) bool {
		t.Helper()
		a.Retain(now)
		res, err := a.Log(ctx, node.LogRequest{DB: "d", Partition: 0, After: at, Max: 100})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Trimmed && len(res.Commits) != after {
			t.Fatalf("the log after the snapshot's %s: %d commits, want %d", at, len(res.Commits), after)
		}
		return res.Trimmed
	}
	if trimmed(time.Now()) {
		t.Fatalf("a retention pass trimmed past %s while the snapshot there streamed", at)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if trimmed(time.Now()) {
		t.Fatalf("a retention pass trimmed past %s within the grace after its snapshot", at)
	}
	if !trimmed(time.Now().Add(2 * grace)) {
		t.Fatalf("past the grace, a log of %d commits of 200 bytes still holds all after %s: the pin outlived it", after, at)
	}
}

// TestStalledSnapshotReadersLetGo: a snapshot holds one of the node's
// MaxSnapshots slots, a Pebble snapshot and its log's pin while it
// streams, and a reader that stops reading holds them only until one
// Send has waited StreamStall. As many readers as there are slots, each
// taking the first chunk of a partition larger than a stream's
// flow-control window and then nothing, take every slot (another
// snapshot is refused meanwhile); after the stall every slot is free
// again (as many snapshots at once are served whole), and each stalled
// reader ends with an error.
func TestStalledSnapshotReadersLetGo(t *testing.T) {
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: 1})
	const stall = 500 * time.Millisecond
	a := newStorageNodeServing(t, reg, node.Options{AllMaster: true}, node.ServeOptions{StreamStall: stall})
	const docs = 160
	value := strings.Repeat("x", 64<<10) // 10 MiB in all
	for i := range docs {
		write(t, a, fmt.Sprint("k", i), value)
	}
	ra := remote(t, a.url)
	req := node.SnapshotRequest{DB: "d", Partition: 0}
	release, started := make(chan struct{}), make(chan struct{}, node.MaxSnapshots)
	errs := make(chan error, node.MaxSnapshots)
	var stalled sync.WaitGroup
	for range node.MaxSnapshots {
		stalled.Go(func() {
			first := true
			errs <- ra.Snapshot(t.Context(), req, func(*node.SnapshotChunk) error {
				if first {
					first = false
					started <- struct{}{}
					<-release
				}
				return nil
			})
		})
	}
	released := false
	defer func() {
		if !released {
			close(release)
		}
		stalled.Wait()
	}()
	for range node.MaxSnapshots {
		<-started
	}
	full := func() (int, error) {
		rows := 0
		err := ra.Snapshot(t.Context(), req, func(c *node.SnapshotChunk) error {
			rows += len(c.Rows)
			return nil
		})
		return rows, err
	}
	if _, err := full(); !errors.Is(err, node.ErrUnavailable) {
		t.Fatalf("a snapshot while %d stalled readers hold every slot: %v, want ErrUnavailable", node.MaxSnapshots, err)
	}
	// Every slot comes free: as many snapshots as there are slots, at
	// once, are each served whole (a slot frees only when its stalled
	// stream ends, and these readers read nothing more, so each ended
	// cut off).
	deadline := time.Now().Add(40 * stall)
	for {
		var round sync.WaitGroup
		var served atomic.Int64
		var last atomic.Value
		for range node.MaxSnapshots {
			round.Go(func() {
				rows, err := full()
				if err == nil && rows == docs {
					served.Add(1)
					return
				}
				if err == nil || !errors.Is(err, node.ErrUnavailable) {
					last.Store(fmt.Sprintf("%d rows, %v; want %d", rows, err, docs))
				}
			})
		}
		round.Wait()
		if v := last.Load(); v != nil {
			t.Fatalf("a snapshot after %d readers stalled: %s", node.MaxSnapshots, v)
		}
		if served.Load() == node.MaxSnapshots {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s after %d readers stalled, %d of %d snapshots at once were served", 40*stall, node.MaxSnapshots, served.Load(), node.MaxSnapshots)
		}
		time.Sleep(stall / 10)
	}
	close(release)
	released = true
	stalled.Wait()
	for range node.MaxSnapshots {
		if err := <-errs; err == nil {
			t.Fatalf("a stalled reader's snapshot ended without an error")
		}
	}
}

// TestSlowSnapshotReadersLetGo: a reader that takes a snapshot's chunks
// now and then, never waiting StreamStall for one, but slower than
// SnapshotMinReadRate over the stream, is cut off for its rate once the
// stall has passed (its windows kept small, as a hostile reader's would
// be), before it has the whole snapshot.
func TestSlowSnapshotReadersLetGo(t *testing.T) {
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: 1})
	const docs = 160
	value := strings.Repeat("x", 64<<10) // 10 MiB in all, in chunks of about 1 MiB
	n := newStorageNodeServing(t, reg, node.Options{AllMaster: true}, node.ServeOptions{StreamStall: time.Second, SnapshotMinReadRate: 8 << 20})
	for i := range docs {
		write(t, n, fmt.Sprint("k", i), value)
	}
	stream, err := wire.NewNodeClient(dialSmallWindows(t, n.url)).Snapshot(t.Context(), &wire.SnapshotRequest{Db: "d", Partition: 0})
	if err != nil {
		t.Fatal(err)
	}
	// The reader takes a chunk every 400 ms (about 2.5 MiB a second): the
	// pace is what is tested.
	rows, start := 0, time.Now()
	for {
		m, err := stream.Recv()
		if err != nil {
			if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "bytes a second") {
				t.Fatalf("a reader at about 2.5 MiB a second, below a floor of 8: %d rows of %d in %s, then %v; want it cut off for its rate", rows, docs, time.Since(start), err)
			}
			break
		}
		if rows += len(m.Rows); rows >= docs {
			t.Fatalf("a reader at about 2.5 MiB a second, below a floor of 8, took all %d rows in %s", docs, time.Since(start))
		}
		time.Sleep(400 * time.Millisecond)
	}
}

// TestStalledLogStreamsAreBoundedInBytes: log streams whose readers read
// nothing (their windows kept small, as a hostile reader's would be) hold
// the answers they were sent in the node's memory; the node bounds their
// bytes (LogStreamBytes). Twenty such streams of a partition with 20 MiB
// of log held some 30 MiB each before (600 MiB in all); now their growth of
// the heap stays within three times the bound and a little more, and a
// reader that reads still gets every commit meanwhile, in smaller
// answers.
func TestStalledLogStreamsAreBoundedInBytes(t *testing.T) {
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: 1})
	const bound = 32 << 20
	n := newStorageNodeServing(t, reg, node.Options{AllMaster: true}, node.ServeOptions{LogStreamBytes: bound})
	const docs = 320
	value := strings.Repeat("x", 64<<10)
	for i := range docs {
		write(t, n, fmt.Sprint("k", i), value)
	}
	heap := func() int64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapInuse)
	}
	// readAll reads the whole log as a reader that reads does.
	readAll := func() {
		t.Helper()
		rctx, rcancel := context.WithCancel(t.Context())
		defer rcancel()
		got := 0
		err := remote(t, n.url).StreamLog(rctx, node.LogRequest{DB: "d", Partition: 0, Max: node.MaxLogBatch}, func(res *node.LogResult) error {
			if got += len(res.Commits); got >= docs {
				rcancel()
			}
			return nil
		})
		if got != docs {
			t.Fatalf("a reader: %d commits of %d, %v", got, docs, err)
		}
	}
	readAll() // the log's blocks in Pebble's cache before the heap is measured
	before := heap()
	conn := dialSmallWindows(t, n.url)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const stalled = 20
	for range stalled {
		if _, err := wire.NewNodeClient(conn).StreamLog(ctx, &wire.LogRequest{Db: "d", Partition: 0, Max: node.MaxLogBatch}); err != nil {
			t.Fatal(err)
		}
	}
	// A reader that reads takes every commit, while the stalled ones hold
	// what they were sent.
	readAll()
	// The bound counts commits' bytes; an answer blocked in its Send is
	// held twice (its commits and their encoding), the one before it
	// once (encoded).
	if grew := heap() - before; grew > 3*bound+64<<20 {
		t.Fatalf("%d stalled log streams grew the heap by %d MiB, over three times the bound of %d MiB and 64 more", stalled, grew>>20, bound>>20)
	} else {
		t.Logf("%d stalled log streams grew the heap by %d MiB (bound %d MiB)", stalled, grew>>20, bound>>20)
	}
}

// dialSmallWindows connects to a node's internal API with the smallest
// flow-control windows HTTP/2 allows (64 KiB), as a reader that means to
// hold a node's answers would: little of what it does not read leaves
// the node. Closed when the test ends.
func dialSmallWindows(t *testing.T, url string) *grpc.ClientConn {
	conn, err := grpc.NewClient("passthrough:///"+strings.TrimPrefix(url, "http://"),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(wire.MaxMessageBytes)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestStalledLogStreamsLetGo: a log stream holds one of the process's
// MaxLogStreams and its answers' share of LogStreamBytes, and a reader
// that stops reading holds them only until one answer has waited
// StreamStall for it. As many readers as the bound allows, each taking
// nothing of a log larger than its flow-control windows, take every
// stream (another is refused meanwhile); after the stall a reader gets
// the whole log again, and each stalled stream ends with
// DeadlineExceeded.
func TestStalledLogStreamsLetGo(t *testing.T) {
	reg := newTestRegistry(t, schema.Database{Name: "d", Partitions: 1})
	const stall, streams = 500 * time.Millisecond, 4
	n := newStorageNodeServing(t, reg, node.Options{AllMaster: true}, node.ServeOptions{StreamStall: stall, MaxLogStreams: streams})
	const docs = 160
	value := strings.Repeat("x", 64<<10) // 10 MiB of log
	for i := range docs {
		write(t, n, fmt.Sprint("k", i), value)
	}
	req := &wire.LogRequest{Db: "d", Partition: 0, Max: node.MaxLogBatch}
	conn := dialSmallWindows(t, n.url)
	var stalled []wire.Node_StreamLogClient
	for range streams {
		s, err := wire.NewNodeClient(conn).StreamLog(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		// Headers are not flow-controlled: they come with the first
		// answer, so the node serves the stream.
		if _, err := s.Header(); err != nil {
			t.Fatal(err)
		}
		stalled = append(stalled, s)
	}
	// read reads the log through a stream of its own: nil once it has
	// every commit, or the stream's error.
	read := func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		s, err := wire.NewNodeClient(dialSmallWindows(t, n.url)).StreamLog(ctx, req)
		if err != nil {
			return err
		}
		for got := 0; got < docs; {
			m, err := s.Recv()
			if err != nil {
				return err
			}
			got += len(m.Commits)
		}
		return nil
	}
	// Every stream is held until the stalled ones are cut off: the
	// first read is refused unless the stall has passed already.
	start := time.Now()
	if err := read(); status.Code(err) != codes.ResourceExhausted && time.Since(start) < stall/2 {
		t.Fatalf("a log stream while %d stalled readers hold every stream: %v, want ResourceExhausted", streams, err)
	}
	for {
		err := read()
		if err == nil {
			break
		}
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("a log stream after %d readers stalled: %v", streams, err)
		}
		if time.Since(start) > 40*stall {
			t.Fatalf("%s after %d readers stalled, a log stream is still refused: %v", 40*stall, streams, err)
		}
		time.Sleep(stall / 10)
	}
	for i, s := range stalled {
		for {
			_, err := s.Recv()
			if err == nil {
				continue
			}
			if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "took no answer") {
				t.Fatalf("stalled stream %d ended with %v, want DeadlineExceeded for taking no answer", i, err)
			}
			break
		}
	}
}

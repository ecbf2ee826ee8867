package relay

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/storage"
)

func commit(seq uint64, size int) storage.Commit {
	return storage.Commit{SCN: storage.SCN{Gen: 1, Seq: seq}, Events: []storage.Event{{Table: "t", Key: []byte{byte(seq)}, Value: bytes.Repeat([]byte("x"), size)}}}
}

// TestBufferBounds: a partition's buffer keeps the newest commits within
// both bounds, contiguous after its base, and its byte count is the
// commits' size; a commit larger than the byte bound leaves it empty,
// its base at that commit.
func TestBufferBounds(t *testing.T) {
	p := &partition{}
	check := func(wantFirst, wantLast uint64, maxBytes int) {
		t.Helper()
		sum := 0
		for i, c := range p.commits {
			sum += c.Size()
			if i > 0 && c.SCN.Seq != p.commits[i-1].SCN.Seq+1 {
				t.Fatalf("buffer not contiguous at %v", c.SCN)
			}
		}
		if sum != p.bytes || p.bytes > maxBytes {
			t.Fatalf("bytes %d, commits' size %d, bound %d", p.bytes, sum, maxBytes)
		}
		if wantLast == 0 {
			if len(p.commits) != 0 {
				t.Fatalf("%d commits, want none", len(p.commits))
			}
			return
		}
		if len(p.commits) == 0 || p.commits[0].SCN.Seq != wantFirst || p.last().Seq != wantLast || p.base.Seq != wantFirst-1 {
			t.Fatalf("base %v, %d commits ending at %v; want %d..%d", p.base, len(p.commits), p.last(), wantFirst, wantLast)
		}
	}
	one := commit(1, 1000)
	size := one.Size()
	// The commit bound binds first.
	for seq := uint64(1); seq <= 20; seq++ {
		p.add([]storage.Commit{commit(seq, 1000)}, 5, 100*size)
	}
	check(16, 20, 100*size)
	// Then the byte bound, with several commits at once.
	p.add([]storage.Commit{commit(21, 1000), commit(22, 1000), commit(23, 1000)}, 100, 3*size)
	check(21, 23, 3*size)
	// A larger document pushes out more of the smaller ones: two here.
	p.add([]storage.Commit{commit(24, 2000)}, 100, 3*size)
	check(23, 24, 3*size)
	// One commit beyond the byte bound: nothing is kept, and readers
	// from before it go to the master.
	p.add([]storage.Commit{commit(25, 10*size)}, 100, 3*size)
	check(0, 0, 3*size)
	if p.base.Seq != 25 || p.last().Seq != 25 {
		t.Fatalf("base %v, last %v; want 25", p.base, p.last())
	}
	// The buffer continues from there.
	p.add([]storage.Commit{commit(26, 1000)}, 100, 3*size)
	check(26, 26, 3*size)
	// Thousands of pulls of one commit each through a full buffer: its
	// array, which add reslices rather than copies, stays within a small
	// multiple of the bound.
	for seq := uint64(27); seq <= 20000; seq++ {
		p.add([]storage.Commit{commit(seq, 10)}, 100, 100*size)
		if cap(p.commits) > 400 {
			t.Fatalf("after commit %d the buffer's array holds %d commits, bound 100", seq, cap(p.commits))
		}
	}
	check(19901, 20000, 100*size)
}

// TestBufferShare: the relay's byte budget is split evenly between the
// partitions it pulls, down to a floor.
func TestBufferShare(t *testing.T) {
	r := &Relay{BufferBytes: 64 << 20, parts: map[partKey]*partition{}}
	if got := r.share(); got != 64<<20 {
		t.Fatalf("no partition yet: share %d, want the whole budget", got)
	}
	for id := range 64 {
		r.part("d", id)
	}
	if got := r.share(); got != 1<<20 {
		t.Fatalf("64 partitions: share %d, want 1 MiB", got)
	}
	for id := range 4096 {
		r.part("e", id)
	}
	if got := r.share(); got != minShare {
		t.Fatalf("4,160 partitions: share %d, want the floor %d", got, minShare)
	}
}

// TestAnswersSayWhenTheMasterWasHeard: a relay's answers say how long ago
// its pull last had an answer from the partition's master, so that a
// slave reading it counts its staleness from then: a relay whose master
// stopped answering goes on answering its readers (with nothing new),
// and those answers must not pass for fresh.
func TestAnswersSayWhenTheMasterWasHeard(t *testing.T) {
	var answering atomic.Bool
	answering.Store(true)
	master := node.LogFunc(func(ctx context.Context, req node.LogRequest) (*node.LogResult, error) {
		if !answering.Load() {
			<-ctx.Done() // a stopped or cut-off master
			return nil, ctx.Err()
		}
		res := &node.LogResult{SourceRole: node.Master, Holds: true}
		if req.After.IsZero() {
			res.Commits = []storage.Commit{commit(1, 10), commit(2, 10)}
			return res, nil
		}
		heartbeat(ctx)
		return res, nil
	})
	r, ctx := pulling(t, master)

	req := node.LogRequest{DB: "d", Partition: 0, After: storage.SCN{Gen: 1, Seq: 2}, Wait: 10 * time.Millisecond}
	ask := func() *node.LogResult {
		t.Helper()
		res, err := r.Log(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// Until the pull has filled the buffer, the relay cannot answer a
	// reader after 1:2 (and, with no master to pass it to, says so).
	deadline := time.Now().Add(10 * time.Second)
	for {
		if res, err := r.Log(ctx, req); err == nil && res.Holds && res.SourceSCN == (storage.SCN{Gen: 1, Seq: 2}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the relay never held the master's commits")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for range 10 {
		if res := ask(); res.SourceBehind > 500*time.Millisecond {
			t.Fatalf("the master answers every 20 ms, the relay says it heard %v ago", res.SourceBehind)
		}
	}
	answering.Store(false)
	stopped := time.Now()
	for {
		res := ask()
		if len(res.Commits) > 0 || !res.Holds {
			t.Fatalf("a relay whose master stopped answered %+v", res)
		}
		// The master's last answer came before it stopped.
		if since := time.Since(stopped); res.SourceBehind < since-50*time.Millisecond {
			t.Fatalf("%v after the master stopped answering, the relay says it heard %v ago", since, res.SourceBehind)
		}
		if res.SourceBehind > time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the relay's answers never said the master was silent: %v", res.SourceBehind)
		}
	}
}

// TestACatchingUpBufferIsNotHeard: a master's answer that is one batch of
// a longer catch-up (the buffer holds 1:2, the master is at 1:4) says
// nothing of how far behind the buffer is: the relay's answers say it has
// not heard from the master until its buffer holds all the master had.
func TestACatchingUpBufferIsNotHeard(t *testing.T) {
	release := make(chan struct{})
	master := node.LogFunc(func(ctx context.Context, req node.LogRequest) (*node.LogResult, error) {
		res := &node.LogResult{SourceRole: node.Master, Holds: true, SourceSCN: storage.SCN{Gen: 1, Seq: 4}}
		switch req.After.Seq {
		case 0:
			res.Commits = []storage.Commit{commit(1, 10), commit(2, 10)}
		case 2:
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			res.Commits = []storage.Commit{commit(3, 10), commit(4, 10)}
		default:
			heartbeat(ctx)
		}
		return res, nil
	})
	r, ctx := pulling(t, master)

	// await asks after 1:1 until the relay's answer ends at last.
	await := func(last uint64) *node.LogResult {
		t.Helper()
		req := node.LogRequest{DB: "d", Partition: 0, After: storage.SCN{Gen: 1, Seq: 1}, Wait: 10 * time.Millisecond}
		deadline := time.Now().Add(10 * time.Second)
		for {
			if res, err := r.Log(ctx, req); err == nil && res.Holds && res.SourceSCN.Seq == last {
				return res
			}
			if time.Now().After(deadline) {
				t.Fatalf("the relay never held 1:%d", last)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if res := await(2); res.SourceBehind < time.Hour {
		t.Fatalf("a relay holding 1:2 of a master at 1:4 says it heard from it %v ago", res.SourceBehind)
	}
	close(release)
	if res := await(4); res.SourceBehind > time.Second {
		t.Fatalf("a relay holding all its master had says it heard from it %v ago", res.SourceBehind)
	}
}

// pulling starts a relay pulling partition d/0 from master until the test
// ends.
func pulling(t *testing.T, master node.LogSource) (*Relay, context.Context) {
	r := &Relay{Buffer: 100, BufferBytes: 1 << 20, parts: map[partKey]*partition{}}
	p := r.part("d", 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.pull(ctx, "d", 0, p, master) }()
	t.Cleanup(func() { cancel(); <-done })
	return r, ctx
}

// heartbeat is a master's wait before it answers that it has nothing new.
func heartbeat(ctx context.Context) {
	select {
	case <-time.After(20 * time.Millisecond):
	case <-ctx.Done():
	}
}

// TestAckedOnlyReaders: a reader that asks for acknowledged commits only
// (a change stream's) gets the buffered commits up to the master's
// acknowledged SCN, and the later ones once the master says they are
// acknowledged, in an answer of its own. The relay's pull asks the
// master to tell it of the watermark's moves (WatchAcked, with what it
// last heard) only once such a reader came: without one, nobody pays for
// those answers. This master answers a pull that does not watch only
// when it ends, so the reader's commits can come only by the watch.
func TestAckedOnlyReaders(t *testing.T) {
	var acked atomic.Uint64
	acked.Store(1)
	var watched, seenWrong atomic.Int64
	var lastSaid atomic.Uint64
	master := node.LogFunc(func(ctx context.Context, req node.LogRequest) (*node.LogResult, error) {
		if req.WatchAcked {
			watched.Add(1)
			if req.AckedSeen.Seq != lastSaid.Load() {
				seenWrong.Add(1)
			}
		}
		res := &node.LogResult{SourceRole: node.Master, Holds: true, SourceSCN: storage.SCN{Gen: 1, Seq: 3}}
		if req.After.IsZero() {
			res.Commits = []storage.Commit{commit(1, 10), commit(2, 10), commit(3, 10)}
		} else {
			for !req.WatchAcked || acked.Load() == req.AckedSeen.Seq {
				select {
				case <-time.After(time.Millisecond):
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
		}
		res.Acked = storage.SCN{Gen: 1, Seq: acked.Load()}
		lastSaid.Store(res.Acked.Seq)
		return res, nil
	})
	r, ctx := pulling(t, master)

	all := node.LogRequest{DB: "d", Partition: 0, Wait: 10 * time.Millisecond}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if res, err := r.Log(ctx, all); err == nil && len(res.Commits) == 3 {
			if res.AckedOnly {
				t.Fatal("an answer with every commit says it holds acknowledged ones only")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the relay never held the master's commits")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := watched.Load(); n > 0 {
		t.Fatalf("with no reader of acknowledged commits, %d of the pull's requests watched the watermark", n)
	}
	ackedOnly := all
	ackedOnly.AckedOnly = true
	res, err := r.Log(ctx, ackedOnly)
	if err != nil || len(res.Commits) != 1 || res.Commits[0].SCN.Seq != 1 || !res.AckedOnly || res.Acked.Seq != 1 {
		t.Fatalf("acknowledged commits only, 1:1 acknowledged: %+v %v", res, err)
	}
	// A reader at 1:1 waits for the master's word that 1:3 is
	// acknowledged, which comes with no commit.
	ackedOnly.After, ackedOnly.Wait = storage.SCN{Gen: 1, Seq: 1}, 10*time.Second
	got := make(chan *node.LogResult, 1)
	go func() {
		res, err := r.Log(ctx, ackedOnly)
		if err != nil {
			t.Error(err)
		}
		got <- res
	}()
	acked.Store(3)
	res = <-got
	if res == nil || len(res.Commits) != 2 || res.Commits[1].SCN.Seq != 3 || res.Acked.Seq != 3 {
		t.Fatalf("once 1:3 is acknowledged: %+v", res)
	}
	if watched.Load() == 0 {
		t.Fatal("the pull never watched the watermark")
	}
	if n := seenWrong.Load(); n > 0 {
		t.Fatalf("%d of the pull's watching requests did not say the watermark it last heard", n)
	}
}

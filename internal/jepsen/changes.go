package jepsen

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/cortado-db/cortado/client"
	"github.com/cortado-db/cortado/internal/storage"
)

// Consumer follows database d's change stream through the routers, as a
// downstream system (a search index, a cache) would, for as long as the
// run lasts: from the beginning of every partition's log, leaving after a
// random number of events and resuming from the last token (on the other
// router), undoing what a rollback event names and starting a partition
// over at a snapshot. It notes every change that comes out of commit
// order or twice. CheckChanges then holds what it built against what
// clients were told and what the database holds.
type Consumer struct {
	urls   []string
	rng    *rand.Rand
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	token  string
	parts  map[int][]change // per partition, as applied
	last   map[int]change   // per partition, the newest change seen
	inSnap map[int]bool     // per partition, a snapshot is arriving
	// problems: changes out of commit order or repeated.
	problems                              []Anomaly
	events, resumes, rollbacks, snapshots int
	lastErr                               string
}

type change struct {
	scn   storage.SCN
	order int
	op    string
	key   string // table/key, as the workload names documents
	v     int64
}

// StartConsumer starts following c's change stream.
func StartConsumer(c *Cluster, seed uint64) *Consumer {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Consumer{urls: c.routerURLs(), rng: rand.New(rand.NewPCG(seed, 7)), cancel: cancel, done: make(chan struct{}),
		token: "beginning", parts: map[int][]change{}, last: map[int]change{}, inSnap: map[int]bool{}}
	go func() {
		defer close(s.done)
		s.run(ctx)
	}()
	return s
}

// Stop stops the consumer and waits for it.
func (s *Consumer) Stop() {
	s.cancel()
	<-s.done
}

func (s *Consumer) run(ctx context.Context) {
	for i := 0; ctx.Err() == nil; i++ {
		n := 1 + s.rng.IntN(20000)
		s.mu.Lock()
		since := s.token
		s.resumes++
		s.mu.Unlock()
		cl := client.New(s.urls[i%len(s.urls)])
		for e, err := range cl.Changes(ctx, "d", &client.ChangeOptions{Since: since, Heartbeat: 200 * time.Millisecond}) {
			if err != nil {
				s.mu.Lock()
				s.lastErr = err.Error()
				s.mu.Unlock()
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
				break
			}
			s.apply(e)
			if n--; n == 0 {
				break
			}
		}
	}
}

func (s *Consumer) apply(e *client.ChangeEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := e.Source.Partition
	scn, err := storage.ParseSCN(e.Source.SCN)
	if err != nil {
		s.problems = append(s.problems, Anomaly{time.Now(), "change stream", fmt.Sprintf("an event without an SCN: %s", e.Raw)})
		return
	}
	s.events++
	switch e.Type {
	case "rollback":
		s.rollbacks++
		kept := s.parts[p][:0]
		for _, r := range s.parts[p] {
			if !scn.Less(r.scn) {
				kept = append(kept, r)
			}
		}
		s.parts[p] = kept
		s.last[p] = change{scn: scn, order: 1 << 30}
		s.inSnap[p] = false
	case "change":
		v, _ := readValue(e.After)
		rec := change{scn: scn, op: e.Op, key: e.Source.Table + "/" + fmt.Sprint(e.Source.Key...), v: v}
		if e.Op == "r" {
			if !s.inSnap[p] {
				s.parts[p] = nil // a snapshot replaces the partition's state
				s.inSnap[p] = true
				s.snapshots++
			}
			s.parts[p] = append(s.parts[p], rec)
			if e.Source.Snapshot == "last" {
				s.inSnap[p] = false
				s.last[p] = change{scn: scn, order: 1 << 30}
			}
			break
		}
		s.inSnap[p] = false
		if e.Transaction != nil {
			rec.order = e.Transaction.TotalOrder
		}
		prev := s.last[p]
		if !(prev.scn.Less(scn) || prev.scn == scn && prev.order < rec.order) {
			s.problems = append(s.problems, Anomaly{time.Now(), "change stream", fmt.Sprintf("partition %d: %s #%d after %s #%d (repeated or out of commit order)", p, scn, rec.order, prev.scn, prev.order)})
		}
		s.last[p] = rec
		s.parts[p] = append(s.parts[p], rec)
	case "resolved":
		if s.inSnap[p] {
			s.inSnap[p] = false // an empty snapshot
			s.parts[p] = nil
		}
	}
	s.token = e.Token
}

// state replays what the consumer applied: document → value.
func (s *Consumer) state() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int64{}
	for _, recs := range s.parts {
		for _, r := range recs {
			if r.op == "d" {
				delete(out, r.key)
			} else {
				out[r.key] = r.v
			}
		}
	}
	return out
}

// Stats says how the consumer went: events, resumes, rollbacks and
// snapshots, and the last error it met.
func (s *Consumer) Stats() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("%d events, %d resumes, %d rollbacks, %d snapshot rows; last error %q", s.events, s.resumes, s.rollbacks, s.snapshots, s.lastErr)
}

// CheckChanges waits (up to two minutes) until the consumer holds every
// acknowledged unique-key write with its value, every counter, and, for
// every other document it holds, what the database holds; then stops it.
// An acknowledged write it never got is lost to the change stream's
// readers; a document it holds that the database does not (a change that
// was undone without a rollback event, or a refused write that took
// effect) is an anomaly, as is a change out of commit order or repeated.
func CheckChanges(c *Cluster, h *History, s *Consumer) (lost, anomalies []Anomaly) {
	defer s.Stop()
	acked := map[string]Op{}
	for _, op := range h.ops {
		if op.Kind == "put" && op.Outcome == Ok {
			acked["U/"+op.Key] = op
		}
	}
	hc := newHTTP(c.routerURLs()...)
	dbValue := map[string]int64{} // documents read from the database, found
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st := s.state()
		lost, anomalies = nil, nil
		for k, op := range acked {
			if v, ok := st[k]; !ok || v != op.Value {
				lost = append(lost, Anomaly{op.End, "lost to the change stream", fmt.Sprintf("%s=%d acknowledged at %s (scn %s); the consumer has %v (found %v)", k, op.Value, op.End.Format(stamp), op.SCN, v, ok)})
			}
		}
		for j := range counters {
			for _, k := range []string{fmt.Sprintf("C/cas%d", j), fmt.Sprintf("C/inc%d", j)} {
				if _, ok := st[k]; !ok {
					lost = append(lost, Anomaly{time.Now(), "lost to the change stream", fmt.Sprintf("%s: the consumer never got it", k)})
				}
			}
		}
		keys := make([]string, 0, len(st))
		for k := range st {
			if _, ok := acked[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			v, ok := dbValue[k]
			if !ok {
				got, found, err := readWith(hc, "/d/"+k)
				if err != nil {
					anomalies = append(anomalies, Anomaly{time.Now(), "unreadable", err.Error()})
					continue
				}
				if !found {
					anomalies = append(anomalies, Anomaly{time.Now(), "change stream", fmt.Sprintf("the consumer has %s=%d, the database has no such document", k, st[k])})
					continue
				}
				v, dbValue[k] = got, got
			}
			if v != st[k] {
				anomalies = append(anomalies, Anomaly{time.Now(), "change stream", fmt.Sprintf("the consumer has %s=%d, the database %d", k, st[k], v)})
			}
		}
		if len(lost)+len(anomalies) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	s.mu.Lock()
	anomalies = append(anomalies, slices.Clone(s.problems)...)
	s.mu.Unlock()
	return lost, anomalies
}

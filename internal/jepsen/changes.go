package jepsen

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/cortado-db/cortado/client"
	"github.com/cortado-db/cortado/internal/clustertest"
)

// Consumer follows database d's change stream through the routers, as a
// downstream system (a search index, a cache) would, for as long as the
// run lasts: from the beginning of every partition's log, leaving after a
// random number of events and resuming from the last token (on the other
// router), undoing what a rollback event names and starting a partition
// over at a snapshot (clustertest.ChangeLog, which also notes every
// change that comes out of commit order or twice). CheckChanges then
// holds what it built against what clients were told and what the
// database holds.
type Consumer struct {
	background // Stop stops the consumer and waits for it
	urls       []string
	rng        *rand.Rand

	mu sync.Mutex
	*clustertest.ChangeLog
	events, resumes int
	lastErr         string
}

// StartConsumer starts following c's change stream.
func StartConsumer(c *Cluster, seed uint64) *Consumer {
	s := &Consumer{urls: c.routerURLs(), rng: rand.New(rand.NewPCG(seed, 7)), ChangeLog: clustertest.NewChangeLog("beginning")}
	s.start(s.run)
	return s
}

func (s *Consumer) run(ctx context.Context) {
	for i := 0; ctx.Err() == nil; i++ {
		n := 1 + s.rng.IntN(20000)
		s.mu.Lock()
		since := s.Token
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
			s.mu.Lock()
			s.events++
			s.Apply(e)
			s.mu.Unlock()
			if n--; n == 0 {
				break
			}
		}
	}
}

// state replays what the consumer applied: table/key → value.
func (s *Consumer) state() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int64{}
	for k, doc := range s.State() {
		out[k], _ = readValue(doc)
	}
	return out
}

// Stats says how the consumer went: events, resumes, rollbacks and
// snapshots, and the last error it met.
func (s *Consumer) Stats() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("%d events, %d resumes, %d rollbacks, %d snapshots; last error %q", s.events, s.resumes, len(s.Rollbacks), s.Snapshots, s.lastErr)
}

// CheckChanges waits (up to two minutes) until the consumer holds every
// acknowledged unique-key write with its value, every counter, and, for
// every other document it holds, what the database holds; then stops it.
// An acknowledged write it never got is lost to the change stream's
// readers; a document it holds that the database does not (a change that
// was undone without a rollback event, or a refused write that took
// effect) is an anomaly, as is a change out of commit order or repeated,
// and any rollback: the stream sends only acknowledged changes, which no
// failover undoes.
func CheckChanges(c *Cluster, h *History, s *Consumer) (lost, anomalies []Anomaly) {
	defer s.Stop()
	acked := map[string]Op{}
	for _, op := range h.ops {
		if op.Kind == "put" && op.Outcome == Ok {
			acked["U/"+op.Key] = op
		}
	}
	hc := newHTTP(c.routerURLs()...)
	// What the database holds is final once the workload stopped: each
	// document is read once, found or not.
	type held struct {
		v     int64
		found bool
	}
	db := map[string]held{}
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
			d, ok := db[k]
			if !ok {
				v, found, err := readWith(hc, "/d/"+k)
				if err != nil {
					anomalies = append(anomalies, Anomaly{time.Now(), "unreadable", err.Error()})
					continue
				}
				d = held{v, found}
				db[k] = d
			}
			switch {
			case !d.found:
				anomalies = append(anomalies, Anomaly{time.Now(), "change stream", fmt.Sprintf("the consumer has %s=%d, the database has no such document", k, st[k])})
			case d.v != st[k]:
				anomalies = append(anomalies, Anomaly{time.Now(), "change stream", fmt.Sprintf("the consumer has %s=%d, the database %d", k, st[k], d.v)})
			}
		}
		if len(lost)+len(anomalies) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	s.mu.Lock()
	for _, p := range s.Problems {
		anomalies = append(anomalies, Anomaly{time.Now(), "change stream", p})
	}
	// The stream sends only acknowledged changes, which no failover
	// discards: it never has one to take back.
	for _, r := range s.Rollbacks {
		anomalies = append(anomalies, Anomaly{time.Now(), "change stream", fmt.Sprintf("a rollback (%s): the stream had sent a change a failover discarded", r)})
	}
	s.mu.Unlock()
	return lost, anomalies
}

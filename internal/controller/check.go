package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/storage"
	"github.com/cortado-db/cortado/internal/topo"
)

// Results of comparing one slave with its master.
const (
	CheckEqual       = "equal"       // same rows at the same SCN
	CheckDiffers     = "differs"     // same SCN, different rows: divergence
	CheckUnsettled   = "unsettled"   // never at the master's SCN while asked
	CheckUnreachable = "unreachable" // the master or the slave did not answer
	// CheckAlarm: the slave refused to truncate commits that were
	// acknowledged to clients (its master's timeline lacks them): an
	// acknowledged write is missing from the master.
	CheckAlarm = "alarm"
)

// PartitionCheck is the consistency check of one partition: its master's
// checksum at an SCN, and each slave's at that same SCN.
type PartitionCheck struct {
	DB        string         `json:"db"`
	Partition int            `json:"partition"`
	Master    string         `json:"master"`
	SCN       storage.SCN    `json:"scn"`
	Sum       string         `json:"sum"`
	Replicas  []ReplicaCheck `json:"replicas"`
}

// ReplicaCheck is one slave's result.
type ReplicaCheck struct {
	Node   string `json:"node"`
	Result string `json:"result"`
	Sum    string `json:"sum,omitempty"`
	Error  string `json:"error,omitempty"`
	// Tables are the tables whose key ranges differ, when it differs.
	Tables []string `json:"tables,omitempty"`
}

// ErrNoDatabase is Check's error for a database that has no routing
// table (it does not exist, or no controller has placed it yet).
var ErrNoDatabase = errors.New("no such database")

// Check compares every partition's slaves with its master (of database
// db, or of all with db ""): the master checksums its rows now, at SCN s;
// each slave checksums its rows when it reaches exactly s (the slaves
// apply commits one at a time, so it stops there). A slave already past s
// means the master moved on; the partition is tried again, up to three
// times, under load.
func Check(ctx context.Context, cli *clientv3.Client, prefix, db string) ([]PartitionCheck, error) {
	tables, err := topo.RoutingTables(ctx, cli, prefix)
	if err != nil {
		return nil, err
	}
	type job struct {
		t *topo.RoutingTable
		p int
	}
	var jobs []job
	found := false
	for _, t := range tables {
		if db != "" && t.DB != db {
			continue
		}
		found = true
		for p := range t.Partitions {
			jobs = append(jobs, job{t, p})
		}
	}
	if db != "" && !found {
		// Not an empty result: a misspelt name would pass the check.
		return nil, fmt.Errorf("database %q: %w", db, ErrNoDatabase)
	}
	out := make([]PartitionCheck, len(jobs))
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i, j := range jobs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[i] = checkPartition(ctx, j.t, j.p)
		})
	}
	wg.Wait()
	return out, nil
}

func mergeKeys(a, b map[string]uint64) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

func checkPartition(ctx context.Context, t *topo.RoutingTable, p int) PartitionCheck {
	route := t.Partitions[p]
	pc := PartitionCheck{DB: t.DB, Partition: p}
	if len(route.Replicas) == 0 {
		return pc
	}
	pc.Master = route.Replicas[0]
	master := admin.Get(t.Nodes[pc.Master])
	for attempt := 0; ; attempt++ {
		pc.Replicas = pc.Replicas[:0]
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ref, err := master.Checksum(rctx, node.ChecksumRequest{DB: t.DB, Partition: p})
		cancel()
		if err != nil {
			for _, id := range route.Replicas[1:] {
				pc.Replicas = append(pc.Replicas, ReplicaCheck{Node: id, Result: CheckUnreachable, Error: "master: " + err.Error()})
			}
			return pc
		}
		pc.SCN, pc.Sum = ref.SCN, fmt.Sprintf("%016x", ref.Sum)
		retry := false
		for _, id := range route.Replicas[1:] {
			rc := ReplicaCheck{Node: id}
			url, ok := t.Nodes[id]
			if !ok {
				rc.Result, rc.Error = CheckUnreachable, "not a live node"
				pc.Replicas = append(pc.Replicas, rc)
				continue
			}
			rctx, cancel := context.WithTimeout(ctx, 6*time.Second)
			got, err := admin.Get(url).Checksum(rctx, node.ChecksumRequest{DB: t.DB, Partition: p, At: ref.SCN, Wait: 5 * time.Second})
			cancel()
			switch {
			case errors.Is(err, storage.ErrTruncateAcknowledged):
				rc.Result, rc.Error = CheckAlarm, err.Error()
			case errors.Is(err, storage.ErrPassed):
				rc.Result, rc.Error = CheckUnsettled, err.Error()
				retry = true
			case errors.Is(err, node.ErrUnavailable):
				rc.Result, rc.Error = CheckUnreachable, err.Error()
			case err != nil:
				rc.Result, rc.Error = CheckUnsettled, err.Error()
			case got.Sum == ref.Sum && !indexDiffers(ref.Tables, got.Tables):
				rc.Result, rc.Sum = CheckEqual, fmt.Sprintf("%016x", got.Sum)
			default:
				rc.Result, rc.Sum = CheckDiffers, fmt.Sprintf("%016x", got.Sum)
				for t := range mergeKeys(ref.Tables, got.Tables) {
					if ref.Tables[t] != got.Tables[t] {
						rc.Tables = append(rc.Tables, t)
					}
				}
				slices.Sort(rc.Tables)
			}
			pc.Replicas = append(pc.Replicas, rc)
		}
		if !retry || attempt == 2 {
			return pc
		}
	}
}

// indexDiffers reports whether two replicas' index digests differ, where
// both sent one (a node of a version before the digest sends none).
func indexDiffers(ref, got map[string]uint64) bool {
	a, inRef := ref[storage.IndexSum]
	b, inGot := got[storage.IndexSum]
	return inRef && inGot && a != b
}

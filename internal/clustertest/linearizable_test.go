package clustertest

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// registerInput is one single-key operation: a read, or a write of value.
type registerInput struct {
	key   string
	write bool
	value string
}

// registerModel is a map of independent registers ("" = absent), checked
// key by key.
var registerModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(registerInput).key
			byKey[k] = append(byKey[k], op)
		}
		var out [][]porcupine.Operation
		for _, ops := range byKey {
			out = append(out, ops)
		}
		return out
	},
	Init: func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		in := input.(registerInput)
		if in.write {
			return true, in.value
		}
		return output.(string) == state.(string), state
	},
	DescribeOperation: func(input, output any) string {
		in := input.(registerInput)
		if in.write {
			return fmt.Sprintf("put %s=%s", in.key, in.value)
		}
		return fmt.Sprintf("get %s → %q", in.key, output)
	},
}

// TestLinearizableAcrossFailover has clients read and write a few keys
// through the router while the busiest master is killed -9 and its
// partitions fail over, then checks the history with porcupine. A write
// refused by a non-master or never delivered did not happen; any other failed write has an
// unknown outcome (it may have been committed): it is entered as never
// returning, so it may take effect at any later point or not at all. A
// failed read is left out.
func TestLinearizableAcrossFailover(t *testing.T) {
	c := startProcCluster(t, 3, 4)
	keys := []string{"a", "b", "c", "d", "e"}
	var (
		mu      sync.Mutex
		history []porcupine.Operation
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		start   = time.Now()
	)
	now := func() int64 { return int64(time.Since(start)) }
	hc := &http.Client{Timeout: 5 * time.Second}
	for client := range 6 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(client), 7))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				in := registerInput{key: keys[rng.IntN(len(keys))], write: rng.IntN(2) == 0}
				op := porcupine.Operation{ClientId: client, Input: in, Call: now()}
				var req *http.Request
				if in.write {
					in.value = fmt.Sprintf("c%d-%d", client, i)
					op.Input = in
					req, _ = http.NewRequest("PUT", c.router.URL+"/d/T/"+in.key, strings.NewReader(`{"v":"`+in.value+`"}`))
					req.Header.Set("Content-Type", "application/json")
				} else {
					req, _ = http.NewRequest("GET", c.router.URL+"/d/T/"+in.key, nil)
				}
				resp, err := hc.Do(req)
				var body []byte
				status := 0
				if err == nil {
					body, _ = io.ReadAll(resp.Body)
					resp.Body.Close()
					status = resp.StatusCode
				}
				op.Return = now()
				switch {
				case in.write && status >= 200 && status < 300:
					op.Output = ""
				case in.write && status == 503 && (strings.Contains(string(body), `"title":"Partition unavailable"`) ||
					strings.Contains(string(body), `"title":"Storage unreachable"`)):
					// Refused by a node that is not (or no longer) master,
					// or never delivered: it did not happen.
					time.Sleep(10 * time.Millisecond)
					continue
				case in.write:
					op.Output, op.Return = "", math.MaxInt64 // outcome unknown
					time.Sleep(10 * time.Millisecond)
				case status == 200:
					op.Output = strings.TrimSuffix(strings.TrimPrefix(string(body), `{"v":"`), `"}`)
				case status == 404:
					op.Output = ""
				default:
					time.Sleep(10 * time.Millisecond)
					continue // a failed read tells nothing
				}
				mu.Lock()
				history = append(history, op)
				mu.Unlock()
			}
		})
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(history) }
	await(t, 30*time.Second, "operations before the failure", func() bool { return count() >= 300 })
	victim := c.busiestMaster()
	c.storage[victim].Kill()
	c.awaitMastersOff(victim)
	n := count()
	await(t, 30*time.Second, "operations after the failover", func() bool { return count() >= n+300 })
	close(stop)
	wg.Wait()
	uncertain := 0
	for _, op := range history {
		if op.Return == math.MaxInt64 {
			uncertain++
		}
	}
	t.Logf("%d operations, %d writes of unknown outcome", len(history), uncertain)
	res, info := porcupine.CheckOperationsVerbose(registerModel, history, 20*time.Second)
	switch res {
	case porcupine.Illegal:
		path := t.TempDir() + "/history.html"
		porcupine.VisualizePath(registerModel, info, path)
		t.Fatalf("history of %d operations is not linearizable (visualization: %s)", len(history), path)
	case porcupine.Unknown:
		t.Fatalf("linearizability check of %d operations timed out", len(history))
	}
	t.Logf("%d operations linearizable across the failover of %s", len(history), victim)
}

// TestRegisterModel checks the checker: a read that misses a write which
// had returned before it began is caught, while one overlapping an
// unknown-outcome write may see it or not.
func TestRegisterModel(t *testing.T) {
	w := registerInput{key: "a", write: true, value: "1"}
	r := registerInput{key: "a"}
	stale := []porcupine.Operation{
		{ClientId: 0, Input: w, Call: 0, Output: "", Return: 10},
		{ClientId: 1, Input: r, Call: 20, Output: "", Return: 30},
	}
	if porcupine.CheckOperations(registerModel, stale) {
		t.Fatal("a stale read passed the check")
	}
	unknown := []porcupine.Operation{
		{ClientId: 0, Input: w, Call: 0, Output: "", Return: math.MaxInt64},
		{ClientId: 1, Input: r, Call: 20, Output: "", Return: 30},
		{ClientId: 2, Input: r, Call: 40, Output: "1", Return: 50},
	}
	if !porcupine.CheckOperations(registerModel, unknown) {
		t.Fatal("a write of unknown outcome may take effect late")
	}
}

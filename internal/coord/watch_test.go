package coord

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// next receives the watcher's next change, failing after 20 s.
func next(t *testing.T, w *Watcher) Change {
	t.Helper()
	select {
	case c := <-w.Changes():
		return c
	case <-time.After(20 * time.Second):
		t.Fatal("no change within 20 s")
		return Change{}
	}
}

// keysOf lists a change's keys: every key of a Reset, or the changed ones.
func keysOf(c Change) []string {
	var out []string
	for _, kv := range c.KVs {
		out = append(out, string(kv.Key))
	}
	for _, ev := range c.Events {
		out = append(out, string(ev.Kv.Key))
	}
	return out
}

// TestWatcherOutlivesEtcd follows a prefix across an etcd restart and a
// compaction: a watch that breaks resumes (or lists again), so nothing
// put while or after etcd was down is missed, and the watcher stops only
// when its context ends.
func TestWatcherOutlivesEtcd(t *testing.T) {
	dir := t.TempDir()
	e, err := StartLoopback(filepath.Join(dir, "etcd"))
	if err != nil {
		t.Fatal(err)
	}
	opts := e.Options
	ctx := context.Background()
	cli, err := Connect(ctx, []string{e.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	put := func(k string) {
		t.Helper()
		pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if _, err := cli.Put(pctx, k, "v"); err != nil {
			t.Fatal(err)
		}
	}
	put("/p/a")
	put("/other")
	wctx, cancel := context.WithCancel(ctx)
	w := Watch(wctx, cli, "/p/")
	if c := next(t, w); !c.Reset || len(c.KVs) != 1 || string(c.KVs[0].Key) != "/p/a" {
		t.Fatalf("first change: reset %v keys %v, want a Reset of /p/a", c.Reset, keysOf(c))
	}
	put("/p/b")
	if c := next(t, w); c.Reset || len(c.Events) != 1 || string(c.Events[0].Kv.Key) != "/p/b" {
		t.Fatalf("after a put: reset %v keys %v", c.Reset, keysOf(c))
	}

	e.Close()
	if e, err = StartEmbedded(opts); err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	put("/p/c")
	// A resumed watch passes on /p/c; a re-listed one lists it.
	seen := map[string]bool{}
	for !seen["/p/c"] {
		for _, k := range keysOf(next(t, w)) {
			seen[k] = true
		}
	}

	// Compact everything, then put: whatever the watch missed is gone,
	// and the watcher either still follows (it missed nothing) or lists
	// again; either way it sees /p/d.
	resp, err := cli.Put(ctx, "/p/d", "v")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	for seen = map[string]bool{}; !seen["/p/d"]; {
		for _, k := range keysOf(next(t, w)) {
			seen[k] = true
		}
	}
	cancel()
	select {
	case <-w.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher did not stop when its context ended")
	}
}

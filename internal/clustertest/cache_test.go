package clustertest

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/cortado-db/cortado/internal/keycache"
	"github.com/cortado-db/cortado/internal/router"
	"github.com/cortado-db/cortado/internal/wire"
)

// TestHotKeyCache: a router answers a read that accepts staleness
// (max-stale) of a document it read lately from its hot-key cache,
// without a storage node, exactly as the node would have answered (body,
// entity tag, schema version, in any version, projection or encoding),
// never older than the read accepts, never a read that does not accept
// staleness, and never a value older than a write that went through it.
func TestHotKeyCache(t *testing.T) {
	var gets atomic.Int64 // reads by key the storage node executed
	count := grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if info.FullMethod == wire.Node_Get_FullMethodName {
			gets.Add(1)
		}
		return h(ctx, req)
	})
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	c := startClusterWith(t, clusterOptions{nodes: 1, partitions: 2, replicas: 1, lastServer: []grpc.ServerOption{count},
		router: router.Options{Cache: keycache.Options{MaxAge: 30 * time.Second, Now: clock}}})
	c.put("a", "one")

	// read reads path with headers (pairs of name and value; empty
	// values left out) and counts the node's reads meanwhile.
	read := func(path string, headers ...string) (response, int64) {
		t.Helper()
		h := http.Header{}
		for i := 0; i+1 < len(headers); i += 2 {
			if headers[i+1] != "" {
				h.Set(headers[i], headers[i+1])
			}
		}
		before := gets.Load()
		r := c.getWith(path, h)
		return r, gets.Load() - before
	}
	get := func(path, cacheControl, accept string) (response, int64) {
		t.Helper()
		return read(path, "Cache-Control", cacheControl, "Accept", accept)
	}
	hit := func(r response) bool { return r.Header.Get(router.HeaderCache) == "hit" }

	r, calls := get("a", "max-stale=10", "")
	if r.StatusCode != 200 || r.body != `{"v":"one"}` || calls != 1 || hit(r) {
		t.Fatalf("first read: %d %s, %d node reads, cache %q", r.StatusCode, r.body, calls, r.Header.Get(router.HeaderCache))
	}
	now.Add(int64(4 * time.Second))
	r, calls = get("a", "max-stale=10", "")
	if r.StatusCode != 200 || r.body != `{"v":"one"}` || calls != 0 || !hit(r) || r.Header.Get("Age") != "4" {
		t.Fatalf("second read: %d %s, %d node reads, cache %q, Age %q", r.StatusCode, r.body, calls, r.Header.Get(router.HeaderCache), r.Header.Get("Age"))
	}
	// Never a read that does not accept staleness, nor an answer older
	// than the read accepts.
	if r, calls = get("a", "", ""); calls != 1 || hit(r) || r.Header.Get("Age") != "" {
		t.Fatalf("a read without max-stale: %d node reads, cache %q", calls, r.Header.Get(router.HeaderCache))
	}
	if r, calls = get("a", "max-stale=3", ""); calls != 1 || hit(r) {
		t.Fatalf("a read accepting 3 s of an entry 4 s old: %d node reads, cache %q", calls, r.Header.Get(router.HeaderCache))
	}

	// A write through the router: the next read finds it.
	c.put("a", "two")
	if r, _ = get("a", "max-stale=10", ""); r.body != `{"v":"two"}` {
		t.Fatalf("a read after a write through the router: %s", r.body)
	}
	if r, calls = get("a", "max-stale=10", ""); r.body != `{"v":"two"}` || calls != 0 {
		t.Fatalf("the written value was not kept: %s, %d node reads", r.body, calls)
	}

	// A second schema version: whatever a read asks for, the cache's
	// answer is the node's, byte for byte, with its headers.
	if _, _, err := c.reg.RegisterVersion(c.ctx, "d", "T", nil, `{"type":"record","name":"T","fields":[{"name":"v","type":"string"},{"name":"w","type":"int","default":7}]}`); err != nil {
		t.Fatal(err)
	}
	for _, form := range []struct{ path, accept string }{
		{"a", ""}, {"a?fields=w", ""}, {"a?fields=v", ""},
		{"a", "avro/binary"}, {"a", "avro/binary; version=2"}, {"a?fields=v", "avro/binary; version=2"},
	} {
		fresh, _ := get(form.path, "", form.accept)
		cached, calls := get(form.path, "max-stale=10", form.accept)
		if fresh.StatusCode != 200 || !hit(cached) || calls != 0 {
			t.Fatalf("%s as %q: fresh %d %s; cached read %d node reads, cache %q", form.path, form.accept, fresh.StatusCode, fresh.body, calls, cached.Header.Get(router.HeaderCache))
		}
		for _, h := range []string{"Etag", "Content-Type", "X-Cortado-Schema-Version", "X-Cortado-Scn", "Last-Modified"} {
			if fresh.Header.Get(h) != cached.Header.Get(h) {
				t.Fatalf("%s as %q: %s %q fresh, %q from the cache", form.path, form.accept, h, fresh.Header.Get(h), cached.Header.Get(h))
			}
		}
		if fresh.body != cached.body {
			t.Fatalf("%s as %q: %q fresh, %q from the cache", form.path, form.accept, fresh.body, cached.body)
		}
	}

	// Revalidation (If-None-Match, If-Modified-Since) is answered from
	// the cache too, 304 or 200 as the node answers it, with the node's
	// headers; If-Match goes to the node.
	hits, misses, _, _, _ := c.router.CacheStats()
	if hits != 8 || misses != 3 {
		t.Fatalf("cache hits %d, misses %d; want 8 and 3", hits, misses)
	}
	condGet := func(path, accept, header, value, cacheControl string) (response, int64) {
		t.Helper()
		return read(path, header, value, "Accept", accept, "Cache-Control", cacheControl)
	}
	cached := 0
	for _, form := range []struct{ path, accept string }{
		{"a", ""}, {"a?fields=w", ""}, {"a", "avro/binary; version=2"}, {"a?fields=v", "avro/binary; version=2"},
	} {
		plain, _ := get(form.path, "", form.accept)
		tag, lastMod := plain.Header.Get("Etag"), plain.Header.Get("Last-Modified")
		for _, cond := range []struct{ header, value string }{
			{"If-None-Match", tag}, {"If-None-Match", "W/" + tag}, {"If-None-Match", `"other", ` + tag},
			{"If-None-Match", `"other"`}, {"If-Modified-Since", lastMod},
			{"If-Modified-Since", "Mon, 02 Jan 2006 15:04:05 GMT"},
		} {
			fresh, _ := condGet(form.path, form.accept, cond.header, cond.value, "")
			fromCache, calls := condGet(form.path, form.accept, cond.header, cond.value, "max-stale=10")
			cached++
			if calls != 0 || !hit(fromCache) || fromCache.Header.Get("Age") == "" {
				t.Fatalf("%s as %q, %s: %s: %d node reads, cache %q, Age %q", form.path, form.accept, cond.header, cond.value, calls, fromCache.Header.Get(router.HeaderCache), fromCache.Header.Get("Age"))
			}
			if fresh.StatusCode != fromCache.StatusCode || fresh.body != fromCache.body {
				t.Fatalf("%s as %q, %s: %s: %d %q from the node, %d %q from the cache", form.path, form.accept, cond.header, cond.value, fresh.StatusCode, fresh.body, fromCache.StatusCode, fromCache.body)
			}
			for _, h := range []string{"Etag", "X-Cortado-Scn", "Last-Modified"} {
				if fresh.Header.Get(h) != fromCache.Header.Get(h) {
					t.Fatalf("%s as %q, %s: %s: %s %q from the node, %q from the cache", form.path, form.accept, cond.header, cond.value, h, fresh.Header.Get(h), fromCache.Header.Get(h))
				}
			}
		}
		// The node's own answers differ by condition: a matching tag is
		// 304, another is 200.
		if r, _ := condGet(form.path, form.accept, "If-None-Match", tag, "max-stale=10"); r.StatusCode != 304 {
			t.Fatalf("%s as %q with its own tag: %d", form.path, form.accept, r.StatusCode)
		}
		if r, calls := condGet(form.path, form.accept, "If-Match", tag, "max-stale=10"); r.StatusCode != 200 || calls != 1 || hit(r) {
			t.Fatalf("%s as %q with If-Match: %d, %d node reads, cache %q", form.path, form.accept, r.StatusCode, calls, r.Header.Get(router.HeaderCache))
		}
	}
	if h, m, _, _, _ := c.router.CacheStats(); h-hits != uint64(cached)+4 || m != misses {
		t.Fatalf("conditional reads: %d hits, %d misses; want %d and 0", h-hits, m-misses, cached+4)
	}

	// Past the cache's MaxAge, a read accepting any staleness goes to
	// the node; a deleted document is not found.
	now.Add(int64(31 * time.Second))
	if r, calls = get("a", "max-stale", ""); calls != 1 || hit(r) {
		t.Fatalf("an entry past MaxAge answered: %d node reads, cache %q", calls, r.Header.Get(router.HeaderCache))
	}
	req, _ := http.NewRequest("DELETE", c.url+"/d/T/a", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode >= 300 {
		t.Fatalf("delete: %v %v", resp, err)
	}
	if r, _ = get("a", "max-stale=10", ""); r.StatusCode != 404 {
		t.Fatalf("a read after a delete through the router: %d %s", r.StatusCode, r.body)
	}
	if h, m, _, _, _ := c.router.CacheStats(); h-hits != uint64(cached)+4 || m-misses != 2 {
		t.Fatalf("after the conditional reads, cache hits %d, misses %d; want 0 and 2", h-hits-uint64(cached)-4, m-misses)
	}
}

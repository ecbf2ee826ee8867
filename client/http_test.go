package client

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestRequestCarriesDeadlineAndName: the context's deadline goes with
// every request as Request-Timeout (what is left of it), and the name
// given by WithClientID as X-Cortado-Client; a request without a deadline
// carries none, and leaves the router's default.
func TestRequestCarriesDeadlineAndName(t *testing.T) {
	got := make(chan http.Header, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	c := New(srv.URL, WithClientID("nightly-export"))
	defer c.Close()

	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	if _, err := c.Put(ctx, "d", "T", Key{"k"}, []byte(`{}`), nil); err != nil {
		t.Fatal(err)
	}
	h := <-got
	d, err := time.ParseDuration(h.Get("Request-Timeout"))
	if err != nil || d <= 0 || d > 1500*time.Millisecond {
		t.Fatalf("Request-Timeout %q: want what is left of 1.5 s", h.Get("Request-Timeout"))
	}
	if h.Get("X-Cortado-Client") != "nightly-export" {
		t.Fatalf("X-Cortado-Client %q", h.Get("X-Cortado-Client"))
	}

	if _, err := New(srv.URL).Get(t.Context(), "d", "T", Key{"k"}, nil); err != nil && !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	h = <-got
	if v, ok := h["Request-Timeout"]; ok {
		t.Fatalf("no deadline, yet Request-Timeout %q", v)
	}
	if v, ok := h["X-Cortado-Client"]; ok {
		t.Fatalf("no name, yet X-Cortado-Client %q", v)
	}
}

// TestRetryAfter reads both forms of Retry-After (RFC 9110) and ignores
// what is not one.
func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"":                              0,
		"1":                             time.Second,
		"120":                           2 * time.Minute,
		"-1":                            0,
		"soon":                          0,
		"1.5":                           0,
		"Fri, 27 Nov 2026 10:00:30 GMT": 30 * time.Second,
		"Fri, 27 Nov 2026 09:59:00 GMT": 0, // past
		"99999999999999999999":          0,
	} {
		if got := retryAfter(v, now); got != want {
			t.Errorf("Retry-After %q: %v, want %v", v, got, want)
		}
	}
	if got := requestTimeout(300 * time.Microsecond); got != "1ms" {
		t.Errorf("a deadline under a millisecond away: %q, want 1ms", got)
	}
	if got := requestTimeout(2500 * time.Millisecond); got != "2500ms" {
		t.Errorf("2.5 s: %q", got)
	}
}

// FuzzRetryAfter: whatever a server sends as Retry-After, the client
// reads a wait that is never negative, and never panics.
func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{"", "1", "120", "-1", "1.5", "Fri, 27 Nov 2026 10:00:30 GMT", "99999999999999999999", "Mon, 01 Jan 3000 00:00:00 GMT"} {
		f.Add(s)
	}
	now := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		if d := retryAfter(v, now); d < 0 {
			t.Fatalf("Retry-After %q: %v", v, d)
		}
	})
}

// TestMaxStale: ReadOptions.MaxStale goes as Cache-Control: max-stale, in
// whole seconds rounded up (without a value when negative: any), and a
// read's Age, X-Cortado-Replica and X-Cortado-Cache come back on its
// Document.
func TestMaxStale(t *testing.T) {
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Cache-Control")
		w.Header().Set("Age", "3")
		w.Header().Set("X-Cortado-Replica", "slave")
		w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	c := New(srv.URL)
	defer c.Close()
	for _, tc := range []struct {
		stale time.Duration
		want  string
	}{{0, ""}, {1500 * time.Millisecond, "max-stale=2"}, {5 * time.Second, "max-stale=5"}, {-1, "max-stale"}} {
		d, err := c.Get(t.Context(), "d", "T", Key{"k"}, &ReadOptions{MaxStale: tc.stale})
		if err != nil {
			t.Fatal(err)
		}
		if h := <-got; h != tc.want {
			t.Fatalf("MaxStale %v: Cache-Control %q, want %q", tc.stale, h, tc.want)
		}
		if d.Age != 3*time.Second || d.FromReplica != "slave" || d.Cache != "" {
			t.Fatalf("Age %v, FromReplica %q, Cache %q", d.Age, d.FromReplica, d.Cache)
		}
	}
}

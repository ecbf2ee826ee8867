package bench

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestOpenLoop: every request of the schedule is sent once and counted
// once (answered, or failed), PUT bodies are the mix's documents, and a
// server that hangs up fails what it left unanswered without losing
// count.
func TestOpenLoop(t *testing.T) {
	var gets, puts, hangups atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/b/Doc/") {
			t.Errorf("path %q", r.URL.Path)
		}
		switch r.Method {
		case http.MethodGet:
			if gets.Add(1)%50 == 0 {
				hangups.Add(1)
				panic(http.ErrAbortHandler) // the connection is cut
			}
			w.Write([]byte(`{}`))
		case http.MethodPut:
			puts.Add(1)
			var doc struct {
				N       int
				Payload string
			}
			b, _ := io.ReadAll(r.Body)
			if err := json.Unmarshal(b, &doc); err != nil || len(doc.Payload) != 100 || !strings.HasSuffix(r.URL.Path, "/"+strconv.Itoa(doc.N)) {
				t.Errorf("PUT %s: %s (%v)", r.URL.Path, b, err)
			}
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	defer srv.Close()
	o := Options{DB: "b", Keys: 100, DocBytes: 100}
	const rate, d = 2000, 500 * time.Millisecond
	lat, failed, err := openLoop(t.Context(), o, srv.URL, rate, d, time.Second, 8)
	if err != nil {
		t.Fatal(err)
	}
	n := int(rate * d.Seconds())
	if len(lat)+failed != n {
		t.Fatalf("%d answered + %d failed, want the %d requests of the schedule", len(lat), failed, n)
	}
	if int(gets.Load()+puts.Load()) < len(lat) || puts.Load() == 0 {
		t.Fatalf("server saw %d GETs %d PUTs, client counted %d answered", gets.Load(), puts.Load(), len(lat))
	}
	if hangups.Load() == 0 || failed < int(hangups.Load()) {
		t.Fatalf("%d hang-ups, %d failed: each hang-up fails at least its request", hangups.Load(), failed)
	}
}

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
// once (answered, or failed), PUT bodies are the mix's documents, a
// server that hangs up fails that request only, and a request the server
// holds past the timeout fails without holding back the others.
func TestOpenLoop(t *testing.T) {
	var gets, puts, hangups, held atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/b/Doc/") {
			t.Errorf("path %q", r.URL.Path)
		}
		switch r.Method {
		case http.MethodGet:
			switch gets.Add(1) % 50 {
			case 0:
				hangups.Add(1)
				panic(http.ErrAbortHandler) // the connection is cut
			case 25:
				held.Add(1)
				<-r.Context().Done() // answered never: the client gives up
				return
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
	lat, failed, err := openLoop(t.Context(), o, srv.URL, rate, d, 300*time.Millisecond)
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
	if lost := int(hangups.Load() + held.Load()); hangups.Load() == 0 || held.Load() == 0 || failed < lost {
		t.Fatalf("%d hang-ups and %d held, %d failed: each fails its request", hangups.Load(), held.Load(), failed)
	}
	if len(lat) < n/2 {
		t.Fatalf("%d of %d answered: requests held by the server held back others", len(lat), n)
	}
}

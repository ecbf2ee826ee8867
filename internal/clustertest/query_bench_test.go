package clustertest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkQueryEveryCollection queries the demo's Message table without
// a partition key: every partition runs the query over each of its
// mailboxes (the index is local to a document group), 5,000 of one
// message each, one in a hundred from bob. Reading a field's postings
// with a new Pebble iterator for each mailbox was about half of such a
// query's time (docs/performance.md).
//
//	go test ./internal/clustertest -run '^$' -bench QueryEveryCollection
func BenchmarkQueryEveryCollection(b *testing.B) {
	s := openServer(b)
	if err := s.DemoDatabase(context.Background()); err != nil {
		b.Fatal(err)
	}
	h := s.Handler()
	for i := range 5000 {
		from := fmt.Sprintf("u%d", i%1000)
		if i%100 == 0 {
			from = "bob"
		}
		body := fmt.Sprintf(`{"from":%q,"subject":"hello number %d"}`, from, i)
		r := httptest.NewRequest("PUT", fmt.Sprintf("/demo/Message/mb%06d/1", i), strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			b.Fatalf("PUT: %d %s", w.Code, w.Body)
		}
	}
	for _, q := range []struct{ name, query string }{
		{"attribute", "from:bob"},
		{"word", "hello"},
		{"phrase", `"hello number"`},
	} {
		b.Run(q.name, func(b *testing.B) {
			path := "/demo/Message?limit=10&query=" + strings.ReplaceAll(strings.ReplaceAll(q.query, " ", "%20"), `"`, "%22")
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
				if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"documents":[{`) {
					b.Fatalf("query %s: %d %s", q.query, w.Code, w.Body)
				}
			}
		})
	}
}

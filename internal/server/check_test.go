package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/cortado-db/cortado/internal/problem"
)

// TestOneClusterCheckAtATime: while a consistency check runs in the
// process (each reads every replica it checks), another is refused with
// 503 overloaded and a Retry-After, before it reads anything.
func TestOneClusterCheckAtATime(t *testing.T) {
	s := &Server{checking: make(chan struct{}, 1)}
	s.checking <- struct{}{} // one runs
	w := httptest.NewRecorder()
	s.serveClusterCheck(w, httptest.NewRequest("POST", "/_cluster/check", nil))
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || w.Code != http.StatusServiceUnavailable ||
		p.Type != problem.TypeOverloaded || w.Header().Get("Retry-After") != "5" {
		t.Fatalf("a second check: %d %s (Retry-After %q), %v", w.Code, w.Body, w.Header().Get("Retry-After"), err)
	}
}

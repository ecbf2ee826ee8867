package router

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/problem"
	"github.com/cortado-db/cortado/internal/registry"
)

// TestRegistryLimitProblem: a database, table or version past the
// registry's limits is 409 limit-exceeded, its detail saying which.
func TestRegistryLimitProblem(t *testing.T) {
	err := fmt.Errorf("table V: database a holds 1024 tables, the most it takes: %w", registry.ErrLimit)
	p := Problem(err)
	if p.Status != http.StatusConflict || p.Type != problem.TypeLimitExceeded || p.Detail != err.Error() {
		t.Fatalf("%+v", p)
	}
}

// TestReadNotReplicatedProblem: a read that waited in vain for replicas
// to hold what it returns is 503 not-replicated, as a write left
// unconfirmed is, with Retry-After; but its problem speaks of a read to
// retry, not of a write whose outcome is unknown.
func TestReadNotReplicatedProblem(t *testing.T) {
	base := fmt.Errorf("commit 1:5: 1 replica(s) did not confirm it within 5s: %w", node.ErrNotReplicated)
	write := Problem(base)
	err := error(base)
	readFailed(&err)
	read := Problem(err)
	for _, p := range []*problem.Problem{write, read} {
		if p.Status != http.StatusServiceUnavailable || p.Type != problem.TypeNotReplicated || p.RetryAfter != 1 {
			t.Fatalf("%+v", p)
		}
	}
	if !strings.Contains(write.Title, "Write") || !strings.Contains(write.Detail, "may or may not survive") ||
		!strings.Contains(read.Title, "Read") || strings.Contains(read.Detail, "may or may not survive") || !strings.Contains(read.Detail, "retry it") {
		t.Fatalf("a write's problem %+v, a read's %+v", write, read)
	}
	// Other errors of a read are left as they are.
	other := error(node.ErrNotFound)
	if readFailed(&other); other != node.ErrNotFound {
		t.Fatalf("readFailed changed %v", other)
	}
}

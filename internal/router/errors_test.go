package router

import (
	"fmt"
	"net/http"
	"testing"

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

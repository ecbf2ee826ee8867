package clustertest

import "github.com/cortado-db/cortado/internal/problem"

// RefusedNothingDone says whether a write's 503 says nothing was done
// (docs/api.md): no master where it went (`Partition unavailable`), never
// delivered (`Storage unreachable`), too few live replicas, or refused by
// an admission. Any other 503 (not replicated, a deadline, storage
// unavailable or failed while the write was under way) leaves the
// write's outcome unknown. The fault run's checker and the tests that
// hold the database to refusals share it.
func RefusedNothingDone(p problem.Problem) bool {
	return p.Title == "Partition unavailable" || p.Title == "Storage unreachable" ||
		p.Type == problem.TypeNotEnoughReplicas || p.Type == problem.TypeOverloaded
}

package server

import (
	"os"
	"runtime"
	"sync/atomic"
)

// DefaultProcsPerCPU is how many Go processors (GOMAXPROCS) a Cortado
// process runs per CPU the runtime found (Options.ProcsPerCPU).
const DefaultProcsPerCPU = 2

// procsTuned is set while a server of this process has set GOMAXPROCS.
var procsTuned atomic.Bool

// tuneProcs sets GOMAXPROCS to perCPU times what the runtime chose (the
// CPUs the process may use) until the server stops.
//
// Storage spends much of its time in blocking file system calls (the
// WAL's fdatasync, reads of table blocks), and a goroutine in one holds
// its processor until the runtime's monitor takes the processor back
// (golang/go#18236): on two CPUs one fsync in progress halved what the
// process could run, and every hand-off (a gRPC reply, a waiting write
// woken) waited behind it. `serve --nodes 3` under a PUT load used 1.1 of
// its 2 cores, 17 % of the machine idle and 19 % waiting on the disk,
// each replication hop 10–30 ms; with twice the processors, 1.7 cores and
// 1.8× the writes a second (docs/performance.md).
//
// Set once: the runtime then no longer follows a container's CPU limit
// that changes while the process runs.
//
// It leaves GOMAXPROCS alone when perCPU is below 2, when the GOMAXPROCS
// environment variable is set (the operator chose), and when another
// server of this process set it already.
func (s *Server) tuneProcs(perCPU int) {
	if perCPU < 2 || os.Getenv("GOMAXPROCS") != "" || !procsTuned.CompareAndSwap(false, true) {
		return
	}
	base := runtime.GOMAXPROCS(0)
	runtime.GOMAXPROCS(base * perCPU)
	s.stop = append(s.stop, func() {
		runtime.GOMAXPROCS(base)
		procsTuned.Store(false)
	})
}

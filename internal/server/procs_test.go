package server

import (
	"os"
	"runtime"
	"testing"
)

func TestTuneProcs(t *testing.T) {
	if os.Getenv("GOMAXPROCS") != "" {
		t.Skip("GOMAXPROCS is set: the server leaves it alone")
	}
	base := runtime.GOMAXPROCS(0)
	s := &Server{}
	s.tuneProcs(2)
	if got := runtime.GOMAXPROCS(0); got != 2*base {
		t.Fatalf("GOMAXPROCS %d with 2 per CPU, want %d", got, 2*base)
	}
	other := &Server{}
	other.tuneProcs(3)
	if got := runtime.GOMAXPROCS(0); got != 2*base || len(other.stop) != 0 {
		t.Fatalf("a second server of the process changed GOMAXPROCS to %d", got)
	}
	for _, stop := range s.stop {
		stop()
	}
	if got := runtime.GOMAXPROCS(0); got != base {
		t.Fatalf("GOMAXPROCS %d after the server stopped, want %d back", got, base)
	}
	for _, perCPU := range []int{1, -1} {
		(&Server{}).tuneProcs(perCPU)
		if got := runtime.GOMAXPROCS(0); got != base {
			t.Fatalf("%d per CPU set GOMAXPROCS to %d", perCPU, got)
		}
	}
	t.Setenv("GOMAXPROCS", "1")
	s = &Server{}
	s.tuneProcs(2)
	if got := runtime.GOMAXPROCS(0); got != base || len(s.stop) != 0 {
		t.Fatalf("with GOMAXPROCS set in the environment the server set it to %d", got)
	}
}

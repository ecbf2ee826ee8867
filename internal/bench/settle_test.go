package bench

import (
	"runtime"
	"testing"
	"time"
)

// cpuTimes reads the machine's CPU time: busy within total, both growing.
func TestCPUTimes(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc/stat is Linux's")
	}
	busy0, total0, ok := cpuTimes()
	if !ok || busy0 > total0 || total0 == 0 {
		t.Fatalf("cpuTimes: busy %d, total %d, %v", busy0, total0, ok)
	}
	// Spin until the kernel's tick counts this process's time.
	deadline := time.Now().Add(5 * time.Second)
	for {
		busy1, total1, _ := cpuTimes()
		if busy1 > busy0 && total1 > total0 {
			if busy1-busy0 > total1-total0 {
				t.Fatalf("busy grew by %d ticks, more than the total's %d", busy1-busy0, total1-total0)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no busy tick counted in 5 s of spinning: busy %d→%d, total %d→%d", busy0, busy1, total0, total1)
		}
	}
}

package bench

import (
	"context"
	"os"
	"strconv"
	"strings"
	"time"
)

// settleMost and settleIdle bound settle: it waits at most settleMost for
// the machine's cores to be settleIdle idle (or waiting on the disk) over
// a second.
const (
	settleMost = 30 * time.Second
	settleIdle = 0.9
)

// settle waits, at most settleMost, until the machine's cores were
// settleIdle idle over a second, and returns how long it waited: what
// one run leaves behind (a server draining the queues an overload built,
// flushes and compactions, a collection) must not land in the next run.
// The bench-peers script waits the same way. Where /proc/stat cannot be
// read it does not wait.
func settle(ctx context.Context) time.Duration {
	start := time.Now()
	for time.Since(start) < settleMost {
		busy0, total0, ok := cpuTimes()
		if !ok {
			return 0
		}
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return time.Since(start)
		case <-t.C:
		}
		busy1, total1, ok := cpuTimes()
		if !ok || total1 <= total0 {
			return 0
		}
		if 1-float64(busy1-busy0)/float64(total1-total0) >= settleIdle {
			break
		}
	}
	return time.Since(start) - time.Second
}

// cpuTimes reads the machine's busy and total CPU time (in clock ticks)
// from /proc/stat; idle and iowait are not busy.
func cpuTimes() (busy, total uint64, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, false
	}
	for i, s := range f[1:] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total, true
}

package server

import "testing"

// TestGCPercent: the heap goal a GOGC gives, live×(1+GOGC/100), reaches
// the floor and no further, never below the process's own GOGC, and is
// bounded when the live heap is tiny.
func TestGCPercent(t *testing.T) {
	const mb = 1 << 20
	for _, c := range []struct {
		live, floor uint64
		base, want  int
	}{
		{live: 4 * mb, floor: 64 * mb, base: 100, want: 1500},     // goal 64 MB
		{live: 32 * mb, floor: 64 * mb, base: 100, want: 100},     // 2×live is the floor
		{live: 40 * mb, floor: 64 * mb, base: 100, want: 100},     // past floor/2: GOGC as it was
		{live: 200 * mb, floor: 64 * mb, base: 100, want: 100},    // past the floor
		{live: 4 * mb, floor: 64 * mb, base: 3000, want: 3000},    // the process asked for more
		{live: 0, floor: 64 * mb, base: 100, want: 100},           // before the first collection: not known yet
		{live: 1 * mb, floor: 1 << 40, base: 100, want: 10000},    // bounded
		{live: 100 << 10, floor: 64 * mb, base: 100, want: 10000}, // a tiny heap: bounded too
	} {
		got := gcPercent(c.live, c.floor, c.base)
		if got != c.want {
			t.Errorf("gcPercent(live %d MB, floor %d MB, base %d) = %d, want %d", c.live/mb, c.floor/mb, c.base, got, c.want)
		}
		if goal := c.live * uint64(100+got) / 100; got > c.base && got < 10000 && c.live > 0 && (goal < c.floor || goal > c.floor+c.live/100+1) {
			t.Errorf("live %d MB, GOGC %d: goal %d bytes, floor %d", c.live/mb, got, goal, c.floor)
		}
	}
}

package routing

import (
	"testing"
	"time"
)

// A node whose reads stay far slower than its peers' is an outlier once
// that has lasted SlowOutlierFor; a machine that slows every node alike,
// or a slow moment, is not.
func TestSlowNodeDetection(t *testing.T) {
	var s slowness
	now := time.Unix(1000, 0)
	read := func(id string, d time.Duration) bool { return s.observe(id, d, now) }
	for range slowSamples {
		read("a", 2*time.Millisecond)
		read("b", 3*time.Millisecond)
	}
	// c is slow: an outlier from its first full window, reported only
	// after SlowOutlierFor.
	for range slowSamples {
		if read("c", 400*time.Millisecond) {
			t.Fatal("reported at once")
		}
	}
	now = now.Add(SlowOutlierFor / 2)
	if read("c", 400*time.Millisecond) {
		t.Fatal("reported before SlowOutlierFor")
	}
	now = now.Add(SlowOutlierFor / 2)
	if !read("c", 400*time.Millisecond) {
		t.Fatal("not reported after SlowOutlierFor")
	}
	// Recovered: fast again, no longer an outlier.
	for range slowSamples {
		read("c", 2*time.Millisecond)
	}
	now = now.Add(2 * SlowOutlierFor)
	if read("c", 2*time.Millisecond) {
		t.Fatal("a recovered node reported")
	}
	// Everyone slow alike (a loaded machine): no outlier.
	var all slowness
	for i := range 10 * slowSamples {
		for _, id := range []string{"a", "b", "c"} {
			if all.observe(id, 500*time.Millisecond, now.Add(time.Duration(i)*time.Second)) {
				t.Fatalf("%s reported while every node is equally slow", id)
			}
		}
	}
	// Slow but under SlowOutlierMin: not reported, however long.
	var mild slowness
	for i := range 10 * slowSamples {
		mild.observe("a", time.Millisecond, now)
		if mild.observe("b", 100*time.Millisecond, now.Add(time.Duration(i)*time.Second)) {
			t.Fatal("a node under SlowOutlierMin reported")
		}
	}
}

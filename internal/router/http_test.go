package router

import (
	"math/rand/v2"
	"net/http"
	"testing"
	"time"
)

// TestHTTPDate: Last-Modified reads as time.Format(http.TimeFormat) would
// write it, for any instant and zone, and parses back to the second.
func TestHTTPDate(t *testing.T) {
	zones := []*time.Location{time.UTC, time.FixedZone("east", 14*3600), time.FixedZone("west", -12*3600)}
	times := []time.Time{time.Unix(0, 0), time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC), time.Date(2026, 2, 28, 23, 59, 59, 999, time.UTC)}
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		times = append(times, time.Unix(r.Int64N(253402300799), r.Int64N(1e9)))
	}
	times = append(times, time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC))
	for _, tm := range times {
		for _, z := range zones {
			tz := tm.In(z)
			want := tz.UTC().Format(http.TimeFormat)
			if got := httpDate(tz); got != want {
				t.Fatalf("httpDate(%v) = %q, want %q", tz, got, want)
			}
		}
	}
}

package router

import (
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
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

// TestChangesRequestParameters: a change-stream request names each
// single-valued parameter at most once (two "since" would leave which
// position the stream starts from to the parser), lists may repeat, and
// an unknown parameter is refused.
func TestChangesRequestParameters(t *testing.T) {
	for query, wantErr := range map[string]string{
		"since=now&since=beginning": `"since" is given 2 times`,
		"before=true&before=false":  `"before" is given 2 times`,
		"heartbeat=1s&heartbeat=2s": `"heartbeat" is given 2 times`,
		"sinse=now":                 `unknown parameter "sinse"`,
		"partitions=1&partitions=2": "",
		"since=now&before=true":     "",
	} {
		q, _ := url.ParseQuery(query)
		req, err := changesRequest(q, "", "d", 4)
		switch {
		case wantErr == "" && err != nil:
			t.Errorf("%s: %v", query, err)
		case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
			t.Errorf("%s: error %v, want one saying %s", query, err, wantErr)
		case query == "partitions=1&partitions=2" && !slices.Equal(req.Partitions, []int{1, 2}):
			t.Errorf("%s: partitions %v, want both", query, req.Partitions)
		}
	}
}

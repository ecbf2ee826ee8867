package router

import (
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
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

// TestAcceptNegotiation: a read answers the most preferred representation
// the caller accepts (RFC 9110 §12.5.1), never one it refused (q=0) nor
// JSON in a charset it did not ask for.
func TestAcceptNegotiation(t *testing.T) {
	const json, avro, lines, none = "json", "avro", "lines", "406"
	for _, tc := range []struct {
		accept, want string
		version      int
	}{
		{"", json, 0},
		{"*/*", json, 0},
		{"application/json", json, 0},
		{"application/json; version=2", json, 2},
		{"avro/binary; version=1", avro, 1},
		{"application/x-ndjson", lines, 0},
		{"application/json;q=0", none, 0},
		{"avro/binary;version=1;q=0, application/json", json, 0},
		{"*/*;q=0.1, avro/binary;version=1", avro, 1},
		{"application/json;q=0.5, avro/binary;version=3;q=0.9", avro, 3},
		{"text/html, application/json;q=0.5", json, 0},
		{"*/*, application/json;q=0", none, 0},
		{"application/*", json, 0},
		{"application/json; charset=latin1", none, 0},
		{"application/json; charset=latin1, avro/binary; version=2", avro, 2},
		{"application/json; charset=UTF-8", json, 0},
		{"application/json;q=2", none, 0}, // a malformed q: the range is left out
		{"text/html", none, 0},
	} {
		req := httptest.NewRequest("GET", "/demo/Profile/1", nil)
		if tc.accept != "" {
			req.Header.Set("Accept", tc.accept)
		}
		f, err := readFormat(req, nil)
		got := json
		switch {
		case err != nil:
			got = none
		case f.Avro:
			got = avro
		case f.Lines:
			got = lines
		}
		if got != tc.want || err == nil && f.Version != tc.version {
			t.Errorf("Accept %q: %s version %d (%v), want %s version %d", tc.accept, got, f.Version, err, tc.want, tc.version)
		}
	}
}

// AgeSeconds rounds up to whole seconds, and stays within 0 and a year
// whatever staleness a node reported.
func TestAgeSeconds(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int
	}{
		{0, 0}, {time.Nanosecond, 1}, {time.Second, 1}, {time.Second + 1, 2},
		{-time.Hour, 0}, {math.MinInt64, 0},
		{math.MaxInt64, int(AnyStaleness / time.Second)},
	} {
		if got := AgeSeconds(c.d); got != c.want {
			t.Errorf("AgeSeconds(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

package server

import (
	"bytes"
	"fmt"
	"html/template"
	"maps"
	"math"
	"net/http"
	"slices"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/cortado-db/cortado/internal/controller"
)

// adminPage is the operators' page: the cluster as /_cluster reports it,
// and what this process's caches and replicas measured.
var adminPage = template.Must(template.New("admin").Funcs(template.FuncMap{
	"lag": func(l *uint64) string {
		if l == nil {
			return "?"
		}
		return fmt.Sprint(*l)
	},
}).Parse(`<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="5">
<title>Cortado</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222 }
table { border-collapse: collapse; margin: .5em 0 1.5em }
th, td { border: 1px solid #ccc; padding: .2em .6em; text-align: left }
th { background: #f4f4f4 }
.bad { color: #b00; font-weight: bold }
.num { text-align: right }
</style></head>
<body>
<h1>Cortado</h1>
<p>As of {{.Now}}; this page reloads every 5 s. <a href="/_cluster">/_cluster</a> (JSON) · <a href="/metrics">/metrics</a></p>
{{if .Err}}<p class="bad">The cluster's state could not be read: {{.Err}}</p>{{end}}
{{with .Status}}{{if .Single}}
<p>One storage node, not a cluster: <code>cortado serve</code> without <code>--nodes</code> masters every partition itself.</p>
{{else}}
<h2>Storage nodes</h2>
<p>Leading controller: {{if .Controller}}{{.Controller}}{{else}}<span class="bad">none</span>{{end}}</p>
<table><tr><th>node</th><th>live</th><th>masters</th><th>slaves</th><th>rack</th><th>build</th><th>protocol</th><th>URL</th></tr>
{{range .Nodes}}<tr><td>{{.ID}}</td><td>{{if .Live}}yes{{else}}<span class="bad">no</span>{{end}}</td><td class="num">{{.Masters}}</td><td class="num">{{.Slaves}}</td><td>{{.Rack}}</td><td>{{or .Build "?"}}</td><td class="num">{{or .Protocol "?"}}</td><td>{{.URL}}{{if .Error}} <span class="bad">{{.Error}}</span>{{end}}</td></tr>
{{end}}</table>
{{if .Processes}}{{$leader := .Controller}}
<h2>Other processes</h2>
<table><tr><th>process</th><th>role</th><th>build</th><th>protocol</th><th>URL</th></tr>
{{range .Processes}}<tr><td>{{.ID}}</td><td>{{.Role}}{{if and (eq .Role "controller") (eq .ID $leader)}} (leader){{end}}</td><td>{{or .Build "?"}}</td><td class="num">{{or .Protocol "?"}}</td><td>{{.URL}}</td></tr>
{{end}}</table>
{{end}}
{{range .Databases}}
<h2>Database {{.Name}}</h2>
<p>Routing table version {{.Version}}.</p>
<table><tr><th>partition</th><th>generation</th><th>master</th><th>SCN</th><th>slaves (SCN, lag in commits)</th></tr>
{{range .Partitions}}<tr><td class="num">{{.Partition}}</td><td class="num">{{.Generation}}</td>
{{- if .Replicas}}{{with index .Replicas 0}}<td>{{.Node}} {{if ne .Role "MASTER"}}<span class="bad">{{.Role}}</span>{{end}}</td><td>{{.SCN}}</td>{{end}}
<td>{{range $i, $r := .Replicas}}{{if $i}}{{$r.Node}} {{$r.SCN}} (<span{{if or (not $r.Lag) (ne $r.Role "SLAVE")}} class="bad"{{end}}>{{lag $r.Lag}}{{if ne $r.Role "SLAVE"}} {{$r.Role}}{{end}}</span>) {{end}}{{end}}</td>
{{- else}}<td class="bad">none</td><td></td><td></td>{{end}}</tr>
{{end}}</table>
{{end}}
{{end}}{{end}}
<h2>This process</h2>
<table><tr><th>measure</th><th>value</th></tr>
{{range .Measures}}<tr><td>{{.Name}}</td><td class="num">{{.Value}}</td></tr>
{{else}}<tr><td colspan="2">nothing measured yet</td></tr>
{{end}}</table>
</body></html>
`))

// measure is one line of the page's measures.
type measure struct{ Name, Value string }

// serveAdminPage answers GET /_admin.
func (s *Server) serveAdminPage(w http.ResponseWriter, r *http.Request) {
	data := struct {
		Now      string
		Status   *controller.Status
		Err      string
		Measures []measure
	}{Now: time.Now().UTC().Format(time.RFC3339)}
	st, err := s.clusterStatus(r.Context())
	if err != nil {
		data.Err = err.Error()
	}
	data.Status = st
	data.Measures = s.measures()
	var b bytes.Buffer
	if err := adminPage.Execute(&b, data); err != nil {
		unavailable(w, "rendering the page: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(b.Bytes())
}

// measures reads this process's metrics: the caches' hit rates and the
// replication lag its slaves observed.
func (s *Server) measures() []measure {
	families, err := s.Metrics.Registry.Gather()
	if err != nil && len(families) == 0 {
		return []measure{{"metrics", "unreadable: " + err.Error()}}
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range families {
		byName[f.GetName()] = f
	}
	var out []measure
	// hitRate sums a counter family by its label's value.
	hitRate := func(name, title, label, hit string) {
		f := byName[name]
		if f == nil {
			return
		}
		var hits, all float64
		for _, m := range f.Metric {
			v := m.GetCounter().GetValue()
			all += v
			for _, l := range m.Label {
				if l.GetName() == label && l.GetValue() == hit {
					hits += v
				}
			}
		}
		out = append(out, measure{title, rate(hits, all)})
	}
	hitRate("cortado_router_cache_reads_total", "router hot-key cache: reads answered (of those accepting staleness)", "result", "hit")
	hitRate("cortado_cache_tier_reads_total", "Redis cache tier: reads answered (of those asked of it)", "result", "hit")
	if hits, misses := byName["cortado_row_cache_hits_total"], byName["cortado_row_cache_misses_total"]; hits != nil && misses != nil {
		h, m := perNode(hits), perNode(misses)
		for _, n := range slices.Sorted(maps.Keys(h)) {
			out = append(out, measure{"row cache of node " + n + ": reads by key answered", rate(h[n], h[n]+m[n])})
		}
	}
	if f := byName["cortado_replication_lag_seconds"]; f != nil {
		var hist []*dto.Histogram
		for _, m := range f.Metric {
			hist = append(hist, m.GetHistogram())
		}
		if n, p99, mean := quantile(hist, 0.99); n > 0 {
			out = append(out, measure{"replication lag, commit → a slave's apply (this process's slaves)",
				fmt.Sprintf("mean %s, p99 ≤ %s, %d commits", mean.Round(10*time.Microsecond), p99, n)})
		}
	}
	return out
}

func rate(hits, all float64) string {
	if all == 0 {
		return "no reads yet"
	}
	return fmt.Sprintf("%.1f%% of %.0f", 100*hits/all, all)
}

// perNode sums a counter family by its node label.
func perNode(f *dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	for _, m := range f.Metric {
		node := ""
		for _, l := range m.Label {
			if l.GetName() == "node" {
				node = l.GetValue()
			}
		}
		out[node] += m.GetCounter().GetValue()
	}
	return out
}

// quantile merges histograms of the same buckets and returns their
// count, the upper bound of the bucket holding quantile q, and the mean.
func quantile(hs []*dto.Histogram, q float64) (uint64, string, time.Duration) {
	var n uint64
	var sum float64
	counts := map[float64]uint64{}
	for _, h := range hs {
		n += h.GetSampleCount()
		sum += h.GetSampleSum()
		for _, b := range h.Bucket {
			counts[b.GetUpperBound()] += b.GetCumulativeCount()
		}
	}
	if n == 0 {
		return 0, "", 0
	}
	p := "+Inf"
	for _, b := range slices.Sorted(maps.Keys(counts)) {
		if float64(counts[b]) >= q*float64(n) {
			if !math.IsInf(b, 1) {
				p = time.Duration(b * float64(time.Second)).Round(10 * time.Microsecond).String()
			}
			break
		}
	}
	return n, p, time.Duration(sum / float64(n) * float64(time.Second))
}

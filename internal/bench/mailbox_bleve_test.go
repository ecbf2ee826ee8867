//go:build bleve

package bench

// The Espresso paper's Figure 7 on this machine: a mailbox workload on
// Cortado's local secondary index (through the embedded client: the router
// and the storage node in-process, no HTTP) and on bleve v2 (scorch, one
// index per mailbox, the Lucene-like peer), side by side in one run,
// interleaved, several rounds. scripts/bench-index runs it:
//
//	go test -tags bleve -run '^TestFigure7$' -v ./internal/bench/ -timeout 60m
//
// Environment: FIG7_SMALL (mailboxes of 100 messages, default 200),
// FIG7_LARGE (of 5,000, default 4), FIG7_DURATION (per mix, system and
// round, default 10s), FIG7_ROUNDS (default 3), FIG7_WORKERS (default 4).

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/blevesearch/bleve/v2"
	blevemapping "github.com/blevesearch/bleve/v2/mapping"
	"github.com/blevesearch/bleve/v2/search/query"

	"github.com/cortado-db/cortado/client"
	"github.com/cortado-db/cortado/client/embedded"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// The message schema: 39 fields, 4 indexed (body as text; isInbox,
// createdOn, from as attributes).
func fig7Schema() string {
	var b strings.Builder
	b.WriteString(`{"type":"record","name":"Message","fields":[
	 {"name":"from","type":"string","index":"attribute"},
	 {"name":"subject","type":"string"},
	 {"name":"body","type":"string","index":"text"},
	 {"name":"isInbox","type":"boolean","index":"attribute"},
	 {"name":"createdOn","type":"long","index":"attribute"}`)
	for i := range 34 {
		if i%2 == 0 {
			fmt.Fprintf(&b, `,{"name":"f%d","type":"string"}`, i)
		} else {
			fmt.Fprintf(&b, `,{"name":"f%d","type":"long"}`, i)
		}
	}
	b.WriteString("]}")
	return b.String()
}

var fig7Words = func() []string {
	rng := rand.New(rand.NewPCG(1, 1))
	out := make([]string, 2000)
	for i := range out {
		n := 3 + rng.IntN(6)
		w := make([]byte, n)
		for j := range w {
			w[j] = byte('a' + rng.IntN(26))
		}
		out[i] = string(w)
	}
	return out
}()

// zipfWord picks words with a skewed frequency, as in mail.
func zipfWord(z *rand.Zipf) string { return fig7Words[z.Uint64()] }

func fig7Message(rng *rand.Rand, z *rand.Zipf, created int64) map[string]any {
	words := func(n int) string {
		ws := make([]string, n)
		for i := range ws {
			ws[i] = zipfWord(z)
		}
		return strings.Join(ws, " ")
	}
	m := map[string]any{
		"from": fmt.Sprintf("user%d@example.com", rng.IntN(500)), "subject": words(6), "body": words(40),
		"isInbox": rng.IntN(4) > 0, "createdOn": created,
	}
	for i := range 34 {
		if i%2 == 0 {
			m[fmt.Sprintf("f%d", i)] = fmt.Sprintf("value-%d-%d", i, rng.IntN(1000))
		} else {
			m[fmt.Sprintf("f%d", i)] = rng.Int64N(1 << 40)
		}
	}
	return m
}

// A system under test: both take the same operations.
type mailStore interface {
	name() string
	insert(box string, id int64, m map[string]any) error
	inbox(box string) (int, error)        // isInbox, newest first, 20
	search(box, word string) (int, error) // a word of the body, best first, 20
	prefix(box, p string) (int, error)    // words of the body that start with p, 20
	close() error
}

type cortadoMail struct {
	c    *client.Client
	next sync.Map // box → *atomic.Int64
}

func (c *cortadoMail) name() string { return "cortado" }
func (c *cortadoMail) insert(box string, id int64, m map[string]any) error {
	_, err := c.c.Put(context.Background(), "mail", "Message", client.Key{box, id}, m, nil)
	return err
}
func (c *cortadoMail) inbox(box string) (int, error) {
	p, err := c.c.Query(context.Background(), "mail", "Message", client.Key{box}, client.Query{Where: "isInbox:true", Sort: "-createdOn", Limit: 20}, nil)
	if err != nil {
		return 0, err
	}
	return len(p.Documents), nil
}
func (c *cortadoMail) search(box, word string) (int, error) {
	p, err := c.c.Query(context.Background(), "mail", "Message", client.Key{box}, client.Query{Where: "body:" + word, Limit: 20}, nil)
	if err != nil {
		return 0, err
	}
	return len(p.Documents), nil
}
func (c *cortadoMail) prefix(box, p string) (int, error) {
	pg, err := c.c.Query(context.Background(), "mail", "Message", client.Key{box}, client.Query{Where: "body:" + p + "*", Limit: 20}, nil)
	if err != nil {
		return 0, err
	}
	return len(pg.Documents), nil
}
func (c *cortadoMail) close() error { return c.c.Close() }

type bleveMail struct {
	dir     string
	mu      sync.Mutex
	indexes map[string]bleve.Index
	mapping *blevemapping.IndexMappingImpl
}

func newBleveMail(dir string) *bleveMail {
	m := bleve.NewIndexMapping()
	doc := bleve.NewDocumentStaticMapping()
	doc.AddFieldMappingsAt("body", bleve.NewTextFieldMapping())
	doc.AddFieldMappingsAt("from", bleve.NewKeywordFieldMapping())
	doc.AddFieldMappingsAt("isInbox", bleve.NewBooleanFieldMapping())
	doc.AddFieldMappingsAt("createdOn", bleve.NewNumericFieldMapping())
	// The whole message, stored (not indexed), so a hit is a document as
	// Cortado's are.
	src := bleve.NewTextFieldMapping()
	src.Index, src.Store, src.IncludeInAll, src.IncludeTermVectors = false, true, false, false
	doc.AddFieldMappingsAt("_source", src)
	m.DefaultMapping = doc
	return &bleveMail{dir: dir, indexes: map[string]bleve.Index{}, mapping: m}
}

func (b *bleveMail) name() string { return "bleve" }
func (b *bleveMail) index(box string) (bleve.Index, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ix, ok := b.indexes[box]; ok {
		return ix, nil
	}
	ix, err := bleve.New(filepath.Join(b.dir, box), b.mapping)
	if err != nil {
		return nil, err
	}
	b.indexes[box] = ix
	return ix, nil
}
func (b *bleveMail) insert(box string, id int64, m map[string]any) error {
	ix, err := b.index(box)
	if err != nil {
		return err
	}
	src, _ := json.Marshal(m)
	d := map[string]any{"body": m["body"], "from": m["from"], "isInbox": m["isInbox"], "createdOn": m["createdOn"], "_source": string(src)}
	return ix.Index(strconv.FormatInt(id, 10), d)
}
func (b *bleveMail) run(box string, q query.Query, sort []string) (int, error) {
	ix, err := b.index(box)
	if err != nil {
		return 0, err
	}
	req := bleve.NewSearchRequestOptions(q, 20, 0, false)
	req.Fields = []string{"_source"}
	if sort != nil {
		req.SortBy(sort)
	}
	res, err := ix.Search(req)
	if err != nil {
		return 0, err
	}
	return len(res.Hits), nil
}
func (b *bleveMail) inbox(box string) (int, error) {
	q := bleve.NewBoolFieldQuery(true)
	q.SetField("isInbox")
	return b.run(box, q, []string{"-createdOn"})
}
func (b *bleveMail) search(box, word string) (int, error) {
	q := bleve.NewMatchQuery(word)
	q.SetField("body")
	return b.run(box, q, nil)
}
func (b *bleveMail) prefix(box, p string) (int, error) {
	q := bleve.NewPrefixQuery(p)
	q.SetField("body")
	return b.run(box, q, nil)
}
func (b *bleveMail) close() error {
	for _, ix := range b.indexes {
		ix.Close()
	}
	return nil
}

// writeBytes is this process's bytes written to storage so far.
func writeBytes() int64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "write_bytes: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

func dirBytes(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

type mailboxSet struct {
	boxes []string
	sizes map[string]int
	next  map[string]*atomic.Int64
}

// loadMail inserts every mailbox's messages with 8 writers.
func loadMail(t *testing.T, s mailStore, mb *mailboxSet) time.Duration {
	start := time.Now()
	var wg sync.WaitGroup
	work := make(chan string)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 99))
			z := rand.NewZipf(rng, 1.1, 1, uint64(len(fig7Words)-1))
			for box := range work {
				for i := range mb.sizes[box] {
					if err := s.insert(box, int64(i), fig7Message(rng, z, int64(i))); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	for _, b := range mb.boxes {
		work <- b
	}
	close(work)
	wg.Wait()
	return time.Since(start)
}

type mixResult struct {
	ops            int
	perSec         float64
	mean, p99      time.Duration
	readP99, wrP99 time.Duration
}

// runMix runs a closed loop of reads (half the inbox query, half a text
// search) and inserts at readFrac for d with workers; with prefixes, every
// operation is a query of the body's words that start with the first two
// letters of a word.
func runMix(t *testing.T, s mailStore, mb *mailboxSet, readFrac float64, prefixes bool, d time.Duration, workers int, seed uint64) mixResult {
	var mu sync.Mutex
	var all, reads, writes []time.Duration
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			z := rand.NewZipf(rng, 1.1, 1, uint64(len(fig7Words)-1))
			var mine, r, wr []time.Duration
			for time.Now().Before(deadline) {
				box := mb.boxes[rng.IntN(len(mb.boxes))]
				t0 := time.Now()
				var err error
				isRead := rng.Float64() < readFrac
				switch {
				case prefixes:
					_, err = s.prefix(box, zipfWord(z)[:2])
				case isRead && rng.IntN(2) == 0:
					_, err = s.inbox(box)
				case isRead:
					_, err = s.search(box, zipfWord(z))
				default:
					id := mb.next[box].Add(1)
					err = s.insert(box, id, fig7Message(rng, z, id))
				}
				if err != nil {
					t.Error(err)
					return
				}
				el := time.Since(t0)
				mine = append(mine, el)
				if isRead {
					r = append(r, el)
				} else {
					wr = append(wr, el)
				}
			}
			mu.Lock()
			all, reads, writes = append(all, mine...), append(reads, r...), append(writes, wr...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	pct := func(ls []time.Duration, p float64) time.Duration {
		if len(ls) == 0 {
			return 0
		}
		slices.Sort(ls)
		return ls[int(float64(len(ls)-1)*p)]
	}
	var sum time.Duration
	for _, l := range all {
		sum += l
	}
	res := mixResult{ops: len(all), perSec: float64(len(all)) / d.Seconds(), p99: pct(all, 0.99), readP99: pct(reads, 0.99), wrP99: pct(writes, 0.99)}
	if len(all) > 0 {
		res.mean = sum / time.Duration(len(all))
	}
	return res
}

func TestFigure7(t *testing.T) {
	small, large := envInt("FIG7_SMALL", 200), envInt("FIG7_LARGE", 4)
	d := time.Duration(envInt("FIG7_DURATION", 10)) * time.Second
	rounds, workers := envInt("FIG7_ROUNDS", 3), envInt("FIG7_WORKERS", 4)
	dir := t.TempDir()
	ctx := context.Background()

	newSet := func() *mailboxSet {
		mb := &mailboxSet{sizes: map[string]int{}, next: map[string]*atomic.Int64{}}
		for i := range small {
			mb.boxes = append(mb.boxes, fmt.Sprintf("s%04d", i))
		}
		for i := range large {
			mb.boxes = append(mb.boxes, fmt.Sprintf("L%02d", i))
		}
		for _, b := range mb.boxes {
			n := 100
			if b[0] == 'L' {
				n = 5000
			}
			mb.sizes[b] = n
			mb.next[b] = &atomic.Int64{}
			mb.next[b].Store(int64(n))
		}
		return mb
	}

	c, err := embedded.Open(ctx, filepath.Join(dir, "cortado"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CreateDatabase(ctx, "mail", client.Database{Partitions: 8}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RegisterSchema(ctx, "mail", "Message", client.TableSchema{Key: []client.KeyPart{{Name: "box"}, {Name: "id", Type: "long"}}, Schema: json.RawMessage(fig7Schema())}); err != nil {
		t.Fatal(err)
	}
	systems := []mailStore{&cortadoMail{c: c}, newBleveMail(filepath.Join(dir, "bleve"))}
	sets := map[string]*mailboxSet{}
	docs := small*100 + large*5000
	for _, s := range systems {
		sets[s.name()] = newSet()
		wb := writeBytes()
		took := loadMail(t, s, sets[s.name()])
		wrote := writeBytes() - wb
		// Cortado's directory also holds its embedded etcd (whose WAL
		// preallocates 64 MiB): only the storage engine's files count.
		size := dirBytes(filepath.Join(dir, s.name())) - dirBytes(filepath.Join(dir, s.name(), "etcd"))
		t.Logf("load %-7s %d messages in %v (%.0f/s); written %.0f bytes/message, on disk %.0f bytes/message",
			s.name(), docs, took.Round(time.Millisecond), float64(docs)/took.Seconds(), float64(wrote)/float64(docs), float64(size)/float64(docs))
	}
	defer func() {
		for _, s := range systems {
			s.close()
		}
	}()

	mixes := []struct {
		name     string
		read     float64
		prefixes bool
	}{{"90/10", 0.9, false}, {"50/50", 0.5, false}, {"10/90", 0.1, false}, {"prefix (ab*)", 1, true}}
	results := map[string]map[string][]mixResult{}
	for _, m := range mixes {
		results[m.name] = map[string][]mixResult{}
	}
	for round := range rounds {
		for _, m := range mixes {
			order := systems
			if round%2 == 1 {
				order = []mailStore{systems[1], systems[0]}
			}
			for _, s := range order {
				r := runMix(t, s, sets[s.name()], m.read, m.prefixes, d, workers, uint64(round*10+1))
				results[m.name][s.name()] = append(results[m.name][s.name()], r)
				t.Logf("round %d mix %s %-7s %8.0f ops/s  mean %-10v p99 %-10v (reads p99 %v, writes p99 %v)",
					round+1, m.name, s.name(), r.perSec, r.mean.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.readP99.Round(time.Microsecond), r.wrP99.Round(time.Microsecond))
			}
		}
	}
	med := func(rs []mixResult, f func(mixResult) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	var out strings.Builder
	fmt.Fprintf(&out, "\n| mix (reads/writes) | Cortado ops/s | bleve ops/s | ratio | Cortado mean / p99 | bleve mean / p99 |\n|---|---:|---:|---:|---|---|\n")
	for _, m := range mixes {
		co, bl := results[m.name]["cortado"], results[m.name]["bleve"]
		cops, bops := med(co, func(r mixResult) float64 { return r.perSec }), med(bl, func(r mixResult) float64 { return r.perSec })
		ms := func(f float64) string { return time.Duration(f).Round(10 * time.Microsecond).String() }
		fmt.Fprintf(&out, "| %s | %.0f | %.0f | %.2f× | %s / %s | %s / %s |\n", m.name, cops, bops, cops/bops,
			ms(med(co, func(r mixResult) float64 { return float64(r.mean) })), ms(med(co, func(r mixResult) float64 { return float64(r.p99) })),
			ms(med(bl, func(r mixResult) float64 { return float64(r.mean) })), ms(med(bl, func(r mixResult) float64 { return float64(r.p99) })))
	}
	t.Log(out.String())
}

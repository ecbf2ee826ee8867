package index

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
)

// testdata/parse: a query in, its parse (or the error) out.
func TestParse(t *testing.T) {
	datadriven.RunTest(t, "testdata/parse", func(t *testing.T, d *datadriven.TestData) string {
		e, err := Parse(strings.TrimSuffix(d.Input, "\n"))
		if err != nil {
			return "error: " + err.Error() + "\n"
		}
		return e.String() + "\n"
	})
}

// testdata/plan: a query over a mailbox table, with posting counts given
// as est=field:value=count,…, in; the plan (or the error) out.
func TestPlan(t *testing.T) {
	v1, err := schema.NewVersion(1, `{"type":"record","name":"M","fields":[
		{"name":"subject","type":"string","index":"text"},
		{"name":"body","type":"string","index":"text"},
		{"name":"createdOn","type":"long","index":"attribute"},
		{"name":"isInbox","type":"boolean","index":"attribute"},
		{"name":"labels","type":{"type":"array","items":"string"},"index":"attribute"},
		{"name":"score","type":"double","index":"attribute"},
		{"name":"from","type":"string","index":"attribute"},
		{"name":"size","type":"long"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	v2, err := schema.NewVersion(2, strings.Replace(v1.Text, `{"name":"size","type":"long"}`, `{"name":"size","type":"long","index":"attribute"}`, 1))
	if err != nil {
		t.Fatal(err)
	}
	tb := &schema.Table{Name: "M", Versions: []*schema.Version{v1, v2}}
	datadriven.RunTest(t, "testdata/plan", func(t *testing.T, d *datadriven.TestData) string {
		counts := map[string]int{}
		var docs map[int]uint64 // documents per schema version (counts=1:5,2:3)
		for _, a := range d.CmdArgs {
			if a.Key == "counts" {
				docs = map[int]uint64{}
				for _, v := range strings.Split(strings.Join(a.Vals, ","), ",") {
					ver, n, _ := strings.Cut(v, ":")
					vi, _ := strconv.Atoi(ver)
					ni, _ := strconv.Atoi(n)
					docs[vi] = uint64(ni)
				}
				continue
			}
			if a.Key != "est" {
				continue
			}
			for _, v := range strings.Split(strings.Join(a.Vals, ","), ",") {
				i := strings.LastIndex(v, "=")
				n, _ := strconv.Atoi(v[i+1:])
				counts[v[:i]] = n
			}
		}
		est := func(field string, lo, hi []byte) int {
			if lo != nil && hi != nil && len(hi) == len(lo)+1 && string(hi[:len(lo)]) == string(lo) {
				if n, ok := counts[field+":"+DecodeTerm(lo)]; ok {
					return n
				}
			}
			if n, ok := counts[field]; ok {
				return n
			}
			return 10
		}
		q, err := Parse(strings.TrimSuffix(d.Input, "\n"))
		if err != nil {
			return "error: " + err.Error() + "\n"
		}
		p, err := NewPlan(q, TableMetadata(tb, docs), est)
		if err != nil {
			return fmt.Sprintf("error: %v\n", err)
		}
		return String(p) + "\n"
	})
}

func TestWords(t *testing.T) {
	got := strings.Join(Words("Hello, World! It's naïve-café 2024 ÜBER"), "|")
	if want := "hello|world|it|s|naïve|café|2024|über"; got != want {
		t.Fatalf("words %q, want %q", got, want)
	}
}

func TestTermOrder(t *testing.T) {
	for _, c := range []struct {
		typ  schema.TermType
		vals []string
	}{
		{schema.TermLong, []string{"-9223372036854775808", "-5", "0", "3", "9223372036854775807"}},
		{schema.TermDouble, []string{"-1e300", "-2.5", "-0", "1e-300", "2.5", "1e300"}},
		{schema.TermString, []string{"", "a", "a\x00", "ab", "b"}},
		{schema.TermBool, []string{"false", "true"}},
	} {
		var prev []byte
		for _, v := range c.vals {
			term, ok := ParseTerm(c.typ, v)
			if !ok {
				t.Fatalf("%s %q: not a term", c.typ, v)
			}
			if prev != nil && string(prev) >= string(term) {
				t.Fatalf("%s: %q does not sort after the value before it", c.typ, v)
			}
			if n, err := storage.TermLength(append(term, 0x10, 'x')); err != nil || n != len(term) {
				t.Fatalf("%s %q: term length %d, %v", c.typ, v, n, err)
			}
			prev = term
		}
	}
}

// textEntriesByMap is how textEntries worked before it gathered positions
// by word id: the reference its entries must equal.
func textEntriesByMap(field string, vals []any, stopWords bool) []storage.IndexEntry {
	positions := map[string][]uint32{}
	var order []string
	pos := uint32(0)
	for _, v := range vals {
		s, ok := v.(string)
		if !ok {
			continue
		}
		for _, w := range Words(s) {
			if stopWords && IsStopWord(w) {
				pos++
				continue
			}
			if _, ok := positions[w]; !ok {
				order = append(order, w)
			}
			positions[w] = append(positions[w], pos)
			pos++
		}
		pos += 8
	}
	length := uint32(0)
	for _, w := range order {
		length += uint32(len(positions[w]))
	}
	var out []storage.IndexEntry
	for _, w := range order {
		pl := binary.AppendUvarint(nil, uint64(length))
		out = append(out, storage.IndexEntry{Field: field, Term: appendStringTerm(nil, w), Payload: appendPositions(pl, positions[w]), Length: length})
	}
	return out
}

func TestTextEntries(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	vocabulary := []string{"the", "a", "Word", "word", "of", "naïve", "x", "ÜBER", "über", "state", "art", "and", "2024"}
	text := func() string {
		var b strings.Builder
		for range rng.IntN(40) {
			b.WriteString(vocabulary[rng.IntN(len(vocabulary))])
			b.WriteString([]string{" ", ", ", "-", "\n"}[rng.IntN(4)])
		}
		return b.String()
	}
	for i := range 500 {
		vals := []any{text()}
		if i%3 == 0 {
			vals = []any{text(), 7, text(), text()} // an array, a non-string among its elements
		}
		stop := i%2 == 0
		got, want := textEntries("f", vals, stop), textEntriesByMap("f", vals, stop)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%q (stop words %v):\n got %v\nwant %v", vals, stop, got, want)
		}
	}
}

// BenchmarkTextEntries indexes a text of 250,000 distinct words (1.9
// MB), and BenchmarkTextEntriesByMap the same as it was indexed before.
func BenchmarkTextEntries(b *testing.B)      { benchmarkText(b, textEntries) }
func BenchmarkTextEntriesByMap(b *testing.B) { benchmarkText(b, textEntriesByMap) }

func benchmarkText(b *testing.B, entries func(string, []any, bool) []storage.IndexEntry) {
	var sb strings.Builder
	for i := range 250000 {
		fmt.Fprintf(&sb, "w%d ", i)
	}
	vals := []any{sb.String()}
	b.ReportAllocs()
	for b.Loop() {
		entries("body", vals, false)
	}
}

// TestBest: the heap of a page keeps what a sort of every hit would put
// first, ties (equal scores) in key order, whatever the page's size.
func TestBest(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	cmp := compare(Order{Relevance: true})
	for round := range 300 {
		var all []Hit
		for i := range rng.IntN(200) {
			all = append(all, Hit{Key: []byte(fmt.Sprintf("k%04d", i)), Score: float64(rng.IntN(5))})
		}
		rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		n := 1 + rng.IntN(50)
		b := best{cmp: cmp, n: n}
		for _, h := range all {
			b.add(h)
		}
		slices.SortFunc(b.hits, cmp)
		want := slices.Clone(all)
		slices.SortFunc(want, cmp)
		want = want[:min(n, len(want))]
		if fmt.Sprint(b.hits) != fmt.Sprint(want) {
			t.Fatalf("round %d, %d hits, page of %d:\n got %v\nwant %v", round, len(all), n, b.hits, want)
		}
	}
}

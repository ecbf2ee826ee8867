package clustertest

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cortado-db/cortado/client"
	"github.com/cortado-db/cortado/client/embedded"
	"github.com/cortado-db/cortado/internal/index"
)

// The query property test: random schemas (which fields are indexed),
// random documents, updates and deletes, and random queries; every
// query's pages, followed to the end, must equal a brute-force filter and
// sort of the documents acknowledged.

// msg is the model of one document.
type msg struct {
	ID        int64    `json:"-"`
	Subject   string   `json:"subject"`
	From      string   `json:"from"`
	CreatedOn int64    `json:"createdOn"`
	IsInbox   bool     `json:"isInbox"`
	Labels    []string `json:"labels"`
	Score     *float64 `json:"score"`
	Body      string   `json:"body"`
}

var (
	qWords  = []string{"alpha", "beta", "gamma", "delta", "news", "big"}
	qFrom   = []string{"ann", "bob", "cyd", "dee"}
	qLabels = []string{"work", "home", "spam", "later"}
)

func randMsg(rng *rand.Rand, id int64) msg {
	m := msg{ID: id, From: qFrom[rng.IntN(len(qFrom))], CreatedOn: rng.Int64N(50) - 10, IsInbox: rng.IntN(3) > 0, Body: "not indexed"}
	words := make([]string, 1+rng.IntN(6))
	for i := range words {
		words[i] = qWords[rng.IntN(len(qWords))]
		if rng.IntN(5) == 0 {
			words[i] = strings.ToUpper(words[i])
		}
	}
	m.Subject = strings.Join(words, " ")
	if rng.IntN(4) == 0 {
		m.Subject += "!"
	}
	m.Labels = []string{}
	for _, l := range qLabels {
		if rng.IntN(3) == 0 {
			m.Labels = append(m.Labels, l)
		}
	}
	if rng.IntN(4) > 0 {
		s := float64(rng.IntN(20)-5) / 2
		m.Score = &s
	}
	return m
}

// fieldsOf the table: the text field subject is always indexed, the
// attribute fields each by chance.
type qTable struct {
	name    string
	indexed map[string]bool
}

func (qt qTable) schema() string {
	ix := func(f, kind string) string {
		if qt.indexed[f] {
			return fmt.Sprintf(`,"index":%q`, kind)
		}
		return ""
	}
	return fmt.Sprintf(`{"type":"record","name":%q,"fields":[
		{"name":"subject","type":"string","index":"text"},
		{"name":"from","type":"string"%s},
		{"name":"createdOn","type":"long"%s},
		{"name":"isInbox","type":"boolean"%s},
		{"name":"labels","type":{"type":"array","items":"string"}%s},
		{"name":"score","type":["null","double"],"default":null%s},
		{"name":"body","type":"string"}]}`, qt.name,
		ix("from", "attribute"), ix("createdOn", "attribute"), ix("isInbox", "attribute"), ix("labels", "attribute"), ix("score", "attribute"))
}

// A generated query: its text and a brute-force predicate.
type genQuery struct {
	text  string
	match func(m msg) bool
}

func genQ(rng *rand.Rand, qt qTable, depth int) genQuery {
	var attrs []string
	for f, ok := range qt.indexed {
		if ok {
			attrs = append(attrs, f)
		}
	}
	slices.Sort(attrs)
	if depth < 2 && rng.IntN(3) == 0 {
		a, b := genQ(rng, qt, depth+1), genQ(rng, qt, depth+1)
		switch rng.IntN(4) {
		case 0:
			return genQuery{"(" + a.text + " OR " + b.text + ")", func(m msg) bool { return a.match(m) || b.match(m) }}
		case 1:
			return genQuery{"(" + a.text + " -(" + b.text + "))", func(m msg) bool { return a.match(m) && !b.match(m) }}
		case 2:
			return genQuery{"(NOT (" + a.text + "))", func(m msg) bool { return !a.match(m) }}
		default:
			return genQuery{"(" + a.text + " AND " + b.text + ")", func(m msg) bool { return a.match(m) && b.match(m) }}
		}
	}
	kind := rng.IntN(3 + len(attrs))
	switch {
	case kind == 0: // a word of the text field, bare or named
		w := qWords[rng.IntN(len(qWords))]
		text := w
		if rng.IntN(2) == 0 {
			text = "subject:" + strings.ToUpper(w[:1]) + w[1:]
		}
		return genQuery{text, func(m msg) bool { return slices.Contains(index.Words(m.Subject), w) }}
	case kind == 1: // a two-word phrase
		a, b := qWords[rng.IntN(len(qWords))], qWords[rng.IntN(len(qWords))]
		return genQuery{fmt.Sprintf(`"%s %s"`, a, b), func(m msg) bool {
			ws := index.Words(m.Subject)
			for i := 0; i+1 < len(ws); i++ {
				if ws[i] == a && ws[i+1] == b {
					return true
				}
			}
			return false
		}}
	case kind == 2 && len(attrs) == 0, kind == 2:
		w := qWords[rng.IntN(len(qWords))]
		if rng.IntN(2) == 0 { // a prefix: the words that start with it
			p := w[:1+rng.IntN(len(w))]
			text := p + "*"
			if rng.IntN(2) == 0 {
				text = "subject:" + strings.ToUpper(p[:1]) + p[1:] + "*"
			}
			return genQuery{text, func(m msg) bool {
				return slices.ContainsFunc(index.Words(m.Subject), func(x string) bool { return strings.HasPrefix(x, p) })
			}}
		}
		return genQuery{"subject:" + w, func(m msg) bool { return slices.Contains(index.Words(m.Subject), w) }}
	}
	switch f := attrs[kind-3]; f {
	case "from":
		v := qFrom[rng.IntN(len(qFrom))]
		if rng.IntN(3) == 0 { // a prefix of the attribute, as stored
			p := v[:rng.IntN(len(v))+1]
			return genQuery{"from:" + p + "*", func(m msg) bool { return strings.HasPrefix(m.From, p) }}
		}
		return genQuery{"from:" + v, func(m msg) bool { return m.From == v }}
	case "isInbox":
		v := rng.IntN(2) == 0
		return genQuery{"isInbox:" + strconv.FormatBool(v), func(m msg) bool { return m.IsInbox == v }}
	case "labels":
		v := qLabels[rng.IntN(len(qLabels))]
		if rng.IntN(3) == 0 {
			p := v[:rng.IntN(len(v))+1]
			return genQuery{"labels:" + p + "*", func(m msg) bool {
				return slices.ContainsFunc(m.Labels, func(l string) bool { return strings.HasPrefix(l, p) })
			}}
		}
		return genQuery{"labels:" + v, func(m msg) bool { return slices.Contains(m.Labels, v) }}
	case "createdOn":
		lo, hi := rng.Int64N(50)-10, rng.Int64N(50)-10
		il, ih := rng.IntN(2) == 0, rng.IntN(2) == 0
		b := map[bool]string{true: "[", false: "{"}[il] + strconv.FormatInt(lo, 10) + " TO " + strconv.FormatInt(hi, 10) + map[bool]string{true: "]", false: "}"}[ih]
		return genQuery{"createdOn:" + b, func(m msg) bool {
			return (m.CreatedOn > lo || il && m.CreatedOn == lo) && (m.CreatedOn < hi || ih && m.CreatedOn == hi)
		}}
	default: // score
		v := float64(rng.IntN(20)-5) / 2
		op := []string{">=", ">", "<=", "<"}[rng.IntN(4)]
		return genQuery{"score:" + op + strconv.FormatFloat(v, 'g', -1, 64), func(m msg) bool {
			if m.Score == nil {
				return false
			}
			s := *m.Score
			switch op {
			case ">=":
				return s >= v
			case ">":
				return s > v
			case "<=":
				return s <= v
			}
			return s < v
		}}
	}
}

// TestQueryProperty: three tables with random index choices on one
// embedded node, random puts, deletes and now and then a whole mailbox's
// delete, and random queries (with and without a partition key, sorted,
// paged): every query's pages equal a brute-force filter and sort of the
// model. QUERY_SEED picks another seed.
func TestQueryProperty(t *testing.T) {
	ctx := context.Background()
	c, err := embedded.Open(ctx, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.CreateDatabase(ctx, "q", client.Database{Partitions: 4}); err != nil {
		t.Fatal(err)
	}
	seed := uint64(20261123)
	if s := os.Getenv("QUERY_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	for round := range 3 {
		qt := qTable{name: fmt.Sprintf("M%d", round), indexed: map[string]bool{}}
		for _, f := range []string{"from", "createdOn", "isInbox", "labels", "score"} {
			qt.indexed[f] = rng.IntN(10) < 7
		}
		if _, err := c.RegisterSchema(ctx, "q", qt.name, client.TableSchema{
			Key:    []client.KeyPart{{Name: "box"}, {Name: "id", Type: "long"}},
			Schema: json.RawMessage(qt.schema()),
		}); err != nil {
			t.Fatal(err)
		}
		boxes := []string{"b1", "b2", "b3"}
		model := map[string]map[int64]msg{}
		for _, b := range boxes {
			model[b] = map[int64]msg{}
		}
		check := func(stage string) {
			for range 25 {
				box := boxes[rng.IntN(len(boxes))]
				q := genQ(rng, qt, 0)
				sortField := ""
				var sortables []string
				for _, f := range []string{"from", "createdOn", "isInbox", "score"} {
					if qt.indexed[f] {
						sortables = append(sortables, f)
					}
				}
				if len(sortables) > 0 && rng.IntN(2) == 0 {
					sortField = sortables[rng.IntN(len(sortables))]
					if rng.IntN(2) == 0 {
						sortField = "-" + sortField
					}
				}
				want := expected(model[box], q.match, sortField)
				got, relevance := queryAll(t, c, "q", qt.name, box, q.text, sortField, 1+rng.IntN(8))
				if rng.IntN(3) == 0 {
					// Without a partition key: every box, merged across
					// the partitions; ids are box*1000+id.
					box = ""
					want = expectedAll(model, boxes, q.match, sortField)
					got, relevance = queryAll(t, c, "q", qt.name, box, q.text, sortField, 1+rng.IntN(8))
				}
				if relevance {
					slices.Sort(got)
					slices.Sort(want)
				}
				if !slices.Equal(got, want) {
					for _, id := range want {
						t.Logf("%d: %+v", id, model[box][id])
					}
					t.Fatalf("%s, table %s %v, box %s, query %q sort %q:\n got  %v\n want %v", stage, qt.name, qt.indexed, box, q.text, sortField, got, want)
				}
			}
		}
		for i := range 240 {
			box := boxes[rng.IntN(len(boxes))]
			id := rng.Int64N(30)
			if rng.IntN(80) == 0 {
				// A whole box, its index entries by range.
				if _, err := c.Delete(ctx, "q", qt.name, client.Key{box}, nil); err != nil {
					t.Fatal(err)
				}
				model[box] = map[int64]msg{}
			} else if _, ok := model[box][id]; ok && rng.IntN(4) == 0 {
				if _, err := c.Delete(ctx, "q", qt.name, client.Key{box, id}, nil); err != nil {
					t.Fatal(err)
				}
				delete(model[box], id)
			} else {
				m := randMsg(rng, id)
				if _, err := c.Put(ctx, "q", qt.name, client.Key{box, id}, m, nil); err != nil {
					t.Fatal(err)
				}
				model[box][id] = m
			}
			if i%60 == 59 {
				check(fmt.Sprintf("after %d writes", i+1))
			}
		}
	}
}

// expectedAll is expected over every box: documents of one box keep
// their order, boxes merge by the sort field, then by key (box, id).
func expectedAll(model map[string]map[int64]msg, boxes []string, match func(msg) bool, sort string) []int64 {
	type boxed struct {
		box int
		m   msg
	}
	var all []boxed
	for bi, b := range boxes {
		for _, m := range model[b] {
			if match(m) {
				all = append(all, boxed{bi, m})
			}
		}
	}
	slices.SortFunc(all, func(a, b boxed) int {
		if c := bySortField(a.m, b.m, sort); c != 0 {
			return c
		}
		if c := cmp.Compare(a.box, b.box); c != 0 {
			return c
		}
		return cmp.Compare(a.m.ID, b.m.ID)
	})
	out := []int64{}
	for _, b := range all {
		out = append(out, boxNumber(boxes[b.box])*1000+b.m.ID)
	}
	return out
}

// boxNumber is N of box "bN": a document of a query over every box is
// known by N*1000+id.
func boxNumber(box string) int64 {
	n, _ := strconv.ParseInt(strings.TrimPrefix(box, "b"), 10, 64)
	return n
}

// expected filters and sorts the model as a query must.
func expected(docs map[int64]msg, match func(msg) bool, sort string) []int64 {
	var ms []msg
	for _, m := range docs {
		if match(m) {
			ms = append(ms, m)
		}
	}
	slices.SortFunc(ms, func(a, b msg) int {
		if c := bySortField(a, b, sort); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	out := []int64{}
	for _, m := range ms {
		out = append(out, m.ID)
	}
	return out
}

// bySortField orders two documents as sort (field, -field or "") does,
// documents without a value last; 0 when it does not tell them apart.
func bySortField(a, b msg, sort string) int {
	field, desc := strings.TrimPrefix(sort, "-"), strings.HasPrefix(sort, "-")
	if field == "" {
		return 0
	}
	va, oka := sortValue(a, field)
	vb, okb := sortValue(b, field)
	if oka != okb {
		if oka {
			return -1
		}
		return 1
	}
	if desc {
		return cmp.Compare(vb, va)
	}
	return cmp.Compare(va, vb)
}

// sortValue is a comparable form of a field (false: the document has
// none). Strings are compared as strings, numbers as numbers.
func sortValue(m msg, field string) (string, bool) {
	num := func(f float64) string { return fmt.Sprintf("%+025.6f", f+1e12) }
	switch field {
	case "from":
		return m.From, true
	case "createdOn":
		return num(float64(m.CreatedOn)), true
	case "isInbox":
		return strconv.FormatBool(m.IsInbox), true
	case "score":
		if m.Score == nil {
			return "", false
		}
		return num(*m.Score), true
	}
	return "", false
}

// queryAll follows a query's pages to the end and returns the ids, and
// whether the order is by relevance.
func queryAll(t *testing.T, c *client.Client, db, table, box, q, sort string, limit int) ([]int64, bool) {
	t.Helper()
	out := []int64{}
	next := ""
	for pages := 0; ; pages++ {
		prefix := client.Key{box}
		if box == "" {
			prefix = nil
		}
		p, err := c.Query(context.Background(), db, table, prefix, client.Query{Where: q, Sort: sort, Limit: limit, Next: next}, nil)
		if err != nil {
			t.Fatalf("query %q sort %q: %v", q, sort, err)
		}
		for _, d := range p.Documents {
			id := d.Key[1].(int64)
			if box == "" {
				id += boxNumber(d.Key[0].(string)) * 1000
			}
			out = append(out, id)
		}
		if p.Next == "" {
			break
		}
		if pages > 1000 {
			t.Fatalf("query %q: pages do not end", q)
		}
		next = p.Next
	}
	e, err := index.Parse(q)
	if err != nil {
		t.Fatal(err)
	}
	return out, sort == "" && hasWords(e)
}

// hasWords reports whether a query searches the text field (its hits
// then come by relevance).
func hasWords(e index.Expr) bool {
	switch e := e.(type) {
	case *index.Match:
		return e.Field == "" || e.Field == "subject"
	case *index.And:
		return slices.ContainsFunc(e.Items, hasWords)
	case *index.Or:
		return slices.ContainsFunc(e.Items, hasWords)
	}
	return false
}

// TestQueryErrors: a bad query is refused with a problem naming the
// position or the field, on both transports, and changes nothing.
func TestQueryErrors(t *testing.T) {
	ctx := context.Background()
	s := StartServe(t, ServeOptions{})
	hc := client.New(s.URL)
	defer hc.Close()
	ec, err := embedded.Open(ctx, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ec.Close()
	for _, c := range []*client.Client{hc, ec} {
		if err := c.CreateDatabase(ctx, "e", client.Database{Partitions: 2}); err != nil {
			t.Fatal(err)
		}
		v1 := `{"type":"record","name":"M","fields":[{"name":"subject","type":"string","index":"text"},{"name":"n","type":"long","index":"attribute"},{"name":"tags","type":{"type":"array","items":"string"},"index":"attribute"},{"name":"later","type":"string","default":""}]}`
		if _, err := c.RegisterSchema(ctx, "e", "M", client.TableSchema{Key: []client.KeyPart{{Name: "box"}, {Name: "id", Type: "long"}}, Schema: json.RawMessage(v1)}); err != nil {
			t.Fatal(err)
		}
		// Version 2 indexes a field version 1 did not.
		v2 := strings.Replace(v1, `"default":""}`, `"default":"","index":"attribute"}`, 1)
		if _, err := c.RegisterSchema(ctx, "e", "M", client.TableSchema{Schema: json.RawMessage(v2)}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Put(ctx, "e", "M", client.Key{"b", 1}, map[string]any{"subject": "hi there", "n": 5, "tags": []string{"x"}, "later": "y"}, nil); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			where, sort string
			status      int
			typ         string
			field       string
			position    int
		}{
			{where: "n:[1 TO", status: 400, typ: "invalid-query", position: 7},
			{where: "n:1 OR (", status: 400, typ: "invalid-query", position: 8},
			{where: "nope:1", status: 400, typ: "invalid-query", field: "nope", position: 0},
			{where: "hi AND n:abc", status: 400, typ: "invalid-query", field: "n", position: 7},
			{where: "subject:[a TO b]", status: 400, typ: "invalid-query", field: "subject", position: 0},
			{where: "hi", sort: "subject", status: 400, typ: "invalid-query"},
			{where: "hi", sort: "tags", status: 400, typ: "invalid-query"},
		} {
			_, err := c.Query(ctx, "e", "M", client.Key{"b"}, client.Query{Where: tc.where, Sort: tc.sort}, nil)
			var ce *client.Error
			if !errors.As(err, &ce) || ce.Status != tc.status || ce.Type != "urn:cortado:problem:"+tc.typ || ce.Field != tc.field ||
				tc.typ == "invalid-query" && tc.sort == "" && (ce.Position == nil || *ce.Position != tc.position) {
				pos := -1
				if ce != nil && ce.Position != nil {
					pos = *ce.Position
				}
				t.Fatalf("query %q sort %q: %v (field %q position %d), want %d %s field %q position %d", tc.where, tc.sort, err, ce.Field, pos, tc.status, tc.typ, tc.field, tc.position)
			}
		}
		p, err := c.Query(ctx, "e", "M", client.Key{"b"}, client.Query{Where: "n:>=5 AND tags:x AND hi"}, nil)
		if err != nil || len(p.Documents) != 1 {
			t.Fatalf("after the refused queries: %v %v", p, err)
		}
		if _, err := c.Query(ctx, "e", "M", client.Key{"b"}, client.Query{Where: "hi", Next: "AAAA"}, nil); err == nil {
			t.Fatal("a made-up continuation token was accepted")
		}
		// A page's token resumes its own query only: in another group,
		// order or query it resumed at a place of another order (pages
		// skipped or repeated, or an empty page taken for the end).
		for i, k := range []client.Key{{"b", 2}, {"b", 3}, {"c", 1}, {"c", 2}} {
			if _, err := c.Put(ctx, "e", "M", k, map[string]any{"subject": "hi", "n": i, "tags": []string{}}, nil); err != nil {
				t.Fatal(err)
			}
		}
		first, err := c.Query(ctx, "e", "M", client.Key{"b"}, client.Query{Where: "n:>=0", Sort: "n", Limit: 1}, nil)
		if err != nil || first.Next == "" {
			t.Fatalf("a first page: %v %+v", err, first)
		}
		for _, other := range []struct {
			group client.Key
			q     client.Query
		}{
			{client.Key{"c"}, client.Query{Where: "n:>=0", Sort: "n"}},
			{client.Key{"b"}, client.Query{Where: "n:>=0", Sort: "-n"}},
			{client.Key{"b"}, client.Query{Where: "n:>=1", Sort: "n"}},
			{nil, client.Query{Where: "n:>=0", Sort: "n"}},
		} {
			other.q.Next, other.q.Limit = first.Next, 1
			var ce *client.Error
			if _, err := c.Query(ctx, "e", "M", other.group, other.q, nil); !errors.As(err, &ce) || ce.Status != 400 {
				t.Fatalf("the token of group b's n:>=0 by n, resuming %v %q by %q: %v, want a 400", other.group, other.q.Where, other.q.Sort, err)
			}
		}
		second, err := c.Query(ctx, "e", "M", client.Key{"b"}, client.Query{Where: "n:>=0", Sort: "n", Limit: 1, Next: first.Next}, nil)
		if err != nil || len(second.Documents) != 1 || fmt.Sprint(second.Documents[0].Key) == fmt.Sprint(first.Documents[0].Key) {
			t.Fatalf("the second page of the same query: %v %+v", err, second)
		}
	}
}

// TestStopWords: a text field with "stopWords": true leaves common words
// out of its index; a phrase skips them where the document had them, and
// a query of stop words only is refused.
func TestStopWords(t *testing.T) {
	ctx := context.Background()
	c, err := embedded.Open(ctx, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.CreateDatabase(ctx, "s", client.Database{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	schema := `{"type":"record","name":"N","fields":[{"name":"notes","type":"string","index":"text","stopWords":true}]}`
	if _, err := c.RegisterSchema(ctx, "s", "N", client.TableSchema{Key: []client.KeyPart{{Name: "box"}, {Name: "id", Type: "long"}}, Schema: json.RawMessage(schema)}); err != nil {
		t.Fatal(err)
	}
	for i, text := range []string{"The state of the art", "state art", "art of the state"} {
		if _, err := c.Put(ctx, "s", "N", client.Key{"b", int64(i)}, map[string]any{"notes": text}, nil); err != nil {
			t.Fatal(err)
		}
	}
	for q, want := range map[string][]int64{
		`"state of the art"`: {0},       // the phrase, its stop words skipped where they were
		`"state art"`:        {1},       // adjacent only in document 1
		`state AND art`:      nil,       // all three: checked as a set below
		`notes:"the state"`:  {0, 1, 2}, // "the" left out: the phrase is the word "state"
	} {
		got, _ := queryAll(t, c, "s", "N", "b", q, "", 10)
		if want == nil {
			if len(got) != 3 {
				t.Fatalf("%s: %v", q, got)
			}
			continue
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("%s: %v, want %v", q, got, want)
		}
	}
	_, err = c.Query(ctx, "s", "N", client.Key{"b"}, client.Query{Where: `notes:"of the"`}, nil)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != 400 || !strings.Contains(ce.Detail, "only stop words") {
		t.Fatalf("a query of stop words only: %v", err)
	}
	if _, err := c.RegisterSchema(ctx, "s", "M", client.TableSchema{Key: []client.KeyPart{{Name: "k"}}, Schema: json.RawMessage(`{"type":"record","name":"M","fields":[{"name":"n","type":"string","index":"attribute","stopWords":true}]}`)}); err == nil {
		t.Fatal("stopWords on an attribute index was accepted")
	}
}

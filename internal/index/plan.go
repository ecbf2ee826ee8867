package index

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
)

// The planner is pure: a parsed query, the table's index metadata and
// posting-count estimates in; a plan out. It resolves every clause to
// the posting lists it reads, orders an AND's lists from the most
// selective, and marks a list much larger than the candidates it must
// meet to be probed per candidate rather than read whole.

// Plan is a query plan: *Leaf, *PlanAnd, *PlanOr or *PlanNot.
type Plan interface{ planString(b *strings.Builder) }

// Leaf reads the postings of one field: a term, a range of terms, or
// a phrase (Words, in order, at consecutive positions).
type Leaf struct {
	Field string
	// Lo and Hi bound the terms read, Hi excluded (nil: unbounded).
	Lo, Hi []byte
	// Term is set for an exact term (Lo = Term, Hi just after it).
	Term []byte
	// Words are a phrase's terms; the leaf then matches documents with
	// every word, word i at Offsets[i] positions after the first
	// (consecutive, unless stop words were left out between them).
	Words   [][]byte
	Offsets []uint32
	// Scored leaves (words and phrases of text fields) add BM25 scores.
	Scored bool
	// Estimate is the planner's idea of how many documents match:
	// counted (est) only where it orders an AND's lists, since counting
	// reads a list as far as EstimateCap; a phrase's always, for its
	// score.
	Estimate int
	est      Estimator
	// Probe: check each candidate's posting instead of reading the list.
	Probe bool
	// Prefix: Lo is the start every term read begins with (hel*).
	Prefix bool
}

// PlanAnd is the documents every Items plan matches and no Not plan does.
type PlanAnd struct {
	Items []Plan
	Not   []Plan
}

// PlanOr is the documents any item matches.
type PlanOr struct{ Items []Plan }

// PlanNot is the collection's documents its item does not match.
type PlanNot struct{ Item Plan }

// QueryError is a query naming a field it cannot use, or a value that
// does not fit the field; Pos is where it is in the query.
type QueryError struct {
	Pos   int
	Field string
	Msg   string
}

func (e *QueryError) Error() string {
	return fmt.Sprintf("query at position %d: %s", e.Pos, e.Msg)
}

// BuildingError is a query on a field whose index does not hold every
// document yet; Remaining is how many it lacks (0: unknown).
type BuildingError struct {
	Field     string
	Remaining uint64
}

func (e *BuildingError) Error() string {
	if e.Remaining > 0 {
		return fmt.Sprintf("the index on %s is being built: %d document(s) written with a schema version that does not index it are still to be rewritten in the latest version", e.Field, e.Remaining)
	}
	return fmt.Sprintf("the index on %s does not cover documents written with a schema version that does not index it; they are being rewritten in the latest version", e.Field)
}

// Metadata is what the planner knows of the table: the index on a field
// (an error for an unindexed field; how many documents it lacks), and the
// text-indexed fields bare words search.
type Metadata struct {
	Index      func(field string) (ix *schema.Index, remaining uint64, err error)
	TextFields []string
	// Counted: remaining counts documents (else it only says "some").
	Counted bool
}

// TableMetadata is the Metadata of a table's latest version in a
// partition holding counts[v] documents of each version v (nil: any
// version may have some, so a field some version does not index is
// building).
func TableMetadata(t *schema.Table, counts map[int]uint64) Metadata {
	m := Metadata{Index: func(f string) (*schema.Index, uint64, error) { return t.IndexStateFor(f, counts) }, Counted: counts != nil}
	for _, ix := range t.Latest().Indexes {
		if ix.Kind == schema.IndexText {
			m.TextFields = append(m.TextFields, ix.Field)
		}
	}
	return m
}

// Estimator returns about how many documents have a term of field in
// [lo, hi); it may stop counting at a cap.
type Estimator func(field string, lo, hi []byte) int

// probeRatio: a list this many times larger than the candidates it is
// intersected with is probed per candidate instead.
const probeRatio = 8

// NewPlan plans q.
func NewPlan(q Expr, m Metadata, est Estimator) (Plan, error) {
	p, err := planExpr(q, m, est)
	if err != nil {
		return nil, err
	}
	return p, nil
}

func planExpr(q Expr, m Metadata, est Estimator) (Plan, error) {
	switch q := q.(type) {
	case *And:
		and := &PlanAnd{}
		for _, it := range q.Items {
			if n, ok := it.(*Not); ok {
				p, err := planExpr(n.Item, m, est)
				if err != nil {
					return nil, err
				}
				and.Not = append(and.Not, p)
				continue
			}
			p, err := planExpr(it, m, est)
			if err != nil {
				return nil, err
			}
			and.Items = append(and.Items, p)
		}
		if len(and.Items) == 0 {
			// Only negations: of the whole collection.
			return &PlanNot{Item: &PlanOr{Items: and.Not}}, nil
		}
		if len(and.Items) == 1 && len(and.Not) == 0 {
			return and.Items[0], nil
		}
		if len(and.Items) > 1 {
			slices.SortStableFunc(and.Items, func(a, b Plan) int { return estimate(a) - estimate(b) })
			first := estimate(and.Items[0])
			for _, it := range and.Items[1:] {
				if l, ok := it.(*Leaf); ok && l.Term != nil && !l.Scored && estimate(l) > probeRatio*first {
					l.Probe = true
				}
			}
		}
		return and, nil
	case *Or:
		or := &PlanOr{}
		for _, it := range q.Items {
			p, err := planExpr(it, m, est)
			if err != nil {
				return nil, err
			}
			or.Items = append(or.Items, p)
		}
		return or, nil
	case *Not:
		p, err := planExpr(q.Item, m, est)
		if err != nil {
			return nil, err
		}
		return &PlanNot{Item: p}, nil
	case *Match:
		if q.Field == "" {
			if len(m.TextFields) == 0 {
				return nil, &QueryError{Pos: q.Pos, Msg: fmt.Sprintf("%s names no field, and the table has no text-indexed field to search", q)}
			}
			var or PlanOr
			for _, f := range m.TextFields {
				p, err := planMatch(&Match{Field: f, Value: q.Value, Quoted: q.Quoted, Prefix: q.Prefix, Pos: q.Pos}, m, est)
				if err != nil {
					return nil, err
				}
				or.Items = append(or.Items, p)
			}
			if len(or.Items) == 1 {
				return or.Items[0], nil
			}
			return &or, nil
		}
		return planMatch(q, m, est)
	case *Range:
		ix, err := index(m, q.Field, q.Pos)
		if err != nil {
			return nil, err
		}
		if ix.Kind != schema.IndexAttribute {
			return nil, &QueryError{Pos: q.Pos, Field: q.Field, Msg: fmt.Sprintf("a range needs an attribute index; %s has a text index", q.Field)}
		}
		l := &Leaf{Field: q.Field}
		if q.Lo != nil {
			t, ok := ParseTerm(ix.Type, *q.Lo)
			if !ok {
				return nil, badValue(q.Pos, q.Field, *q.Lo, ix.Type)
			}
			l.Lo = t
			if !q.IncLo {
				l.Lo = append(t, 0xFF)
			}
		}
		if q.Hi != nil {
			t, ok := ParseTerm(ix.Type, *q.Hi)
			if !ok {
				return nil, badValue(q.Pos, q.Field, *q.Hi, ix.Type)
			}
			l.Hi = t
			if q.IncHi {
				l.Hi = append(t, 0xFF)
			}
		}
		l.Estimate, l.est = unestimated, est
		return l, nil
	}
	return nil, fmt.Errorf("index: cannot plan %T", q)
}

func index(m Metadata, field string, pos int) (*schema.Index, error) {
	ix, remaining, err := m.Index(field)
	if err != nil {
		msg := err.Error()
		var fe *schema.FieldError
		if errors.As(err, &fe) {
			msg = fe.Reason
		}
		return nil, &QueryError{Pos: pos, Field: field, Msg: msg}
	}
	if remaining > 0 {
		if !m.Counted {
			remaining = 0
		}
		return nil, &BuildingError{Field: field, Remaining: remaining}
	}
	return ix, nil
}

func badValue(pos int, field, v string, t schema.TermType) error {
	return &QueryError{Pos: pos, Field: field, Msg: fmt.Sprintf("%q is not a %s value, which field %s holds", v, t, field)}
}

// planPrefix plans hel*: the terms of a string attribute, or the words
// of a text field, that start with the value (as analysed: one word,
// lower-cased). Its leaf reads every such term's postings, as a range
// does, and does not score: a word's BM25 needs its document frequency,
// and a prefix stands for many words (Lucene scores prefix queries as a
// constant too). A query of prefixes alone comes in key order.
func planPrefix(q *Match, ix *schema.Index, est Estimator) (Plan, error) {
	v := q.Value
	if ix.Kind == schema.IndexAttribute {
		if ix.Type != schema.TermString {
			return nil, &QueryError{Pos: q.Pos, Field: q.Field, Msg: fmt.Sprintf("%s*: a prefix applies to string and text fields; %s holds %s values", v, q.Field, ix.Type)}
		}
	} else {
		words := Words(v)
		if len(words) != 1 || strings.ContainsFunc(v, func(r rune) bool { return !wordChar(r) }) {
			return nil, &QueryError{Pos: q.Pos, Field: q.Field, Msg: fmt.Sprintf("%q: a prefix is the start of one word (letters and digits), as in hel*", v+"*")}
		}
		v = words[0]
	}
	t := appendStringTerm(nil, v)
	lo := t[:len(t)-2] // without the terminator: every term that starts with v
	l := &Leaf{Field: q.Field, Lo: lo, Hi: append(lo[:len(lo):len(lo)], 0xFF), Prefix: true}
	l.Estimate, l.est = unestimated, est
	return l, nil
}

func planMatch(q *Match, m Metadata, est Estimator) (Plan, error) {
	ix, err := index(m, q.Field, q.Pos)
	if err != nil {
		return nil, err
	}
	if q.Prefix {
		return planPrefix(q, ix, est)
	}
	if ix.Kind == schema.IndexAttribute {
		t, ok := ParseTerm(ix.Type, q.Value)
		if !ok {
			return nil, badValue(q.Pos, q.Field, q.Value, ix.Type)
		}
		l := &Leaf{Field: q.Field, Term: t, Lo: t, Hi: append(t[:len(t):len(t)], 0xFF)}
		l.Estimate, l.est = unestimated, est
		return l, nil
	}
	all := Words(q.Value)
	var words []string
	var offsets []uint32
	for i, w := range all {
		if ix.StopWords && IsStopWord(w) {
			continue
		}
		words, offsets = append(words, w), append(offsets, uint32(i))
	}
	if len(words) == 0 {
		msg := fmt.Sprintf("%q has no word to search for", q.Value)
		if len(all) > 0 {
			msg = fmt.Sprintf("%q has only stop words, which field %s does not index", q.Value, q.Field)
		}
		return nil, &QueryError{Pos: q.Pos, Field: q.Field, Msg: msg}
	}
	if len(words) == 1 {
		t := appendStringTerm(nil, words[0])
		l := &Leaf{Field: q.Field, Term: t, Lo: t, Hi: append(t[:len(t):len(t)], 0xFF), Scored: true}
		l.Estimate, l.est = unestimated, est
		return l, nil
	}
	l := &Leaf{Field: q.Field, Scored: true, Estimate: unestimated}
	for i, w := range words {
		t := appendStringTerm(nil, w)
		l.Words = append(l.Words, t)
		l.Offsets = append(l.Offsets, offsets[i]-offsets[0])
		if e := est(q.Field, t, append(t[:len(t):len(t)], 0xFF)); l.Estimate < 0 || e < l.Estimate {
			l.Estimate = e
		}
	}
	return l, nil
}

// unestimated is a leaf's Estimate not counted yet.
const unestimated = -1

// estimate is a plan's expected size: a leaf's estimate (counted the
// first time it is asked for); the smallest item of an AND; the sum of
// an OR's (a NOT is taken as large).
func estimate(p Plan) int {
	switch p := p.(type) {
	case *Leaf:
		if p.Estimate == unestimated {
			p.Estimate = p.est(p.Field, p.Lo, p.Hi)
		}
		return p.Estimate
	case *PlanAnd:
		return estimate(p.Items[0])
	case *PlanOr:
		n := 0
		for _, it := range p.Items {
			n += estimate(it)
		}
		return n
	}
	return 1 << 30
}

// String renders a plan, for tests and EXPLAIN-like debugging.
func String(p Plan) string {
	var b strings.Builder
	p.planString(&b)
	return b.String()
}

func (l *Leaf) planString(b *strings.Builder) {
	switch {
	case l.Words != nil:
		ws := make([]string, len(l.Words))
		for i, w := range l.Words {
			ws[i] = DecodeTerm(w)
		}
		fmt.Fprintf(b, "phrase(%s %q)", l.Field, strings.Join(ws, " "))
	case l.Term != nil:
		fmt.Fprintf(b, "term(%s=%s)", l.Field, DecodeTerm(l.Term))
	case l.Prefix:
		fmt.Fprintf(b, "prefix(%s=%s*)", l.Field, DecodeTerm(append(l.Lo[:len(l.Lo):len(l.Lo)], 0, 1)))
	default:
		lo, hi := "*", "*"
		if l.Lo != nil {
			lo = boundString(l.Lo, "[", "{")
		} else {
			lo = "[*"
		}
		if l.Hi != nil {
			hi = boundString(l.Hi, "]", "}")
		} else {
			hi = "*]"
		}
		if l.Lo != nil {
			fmt.Fprintf(b, "range(%s %s TO ", l.Field, lo)
		} else {
			fmt.Fprintf(b, "range(%s %s TO ", l.Field, lo)
		}
		fmt.Fprintf(b, "%s)", hi)
	}
	if l.Estimate != unestimated {
		fmt.Fprintf(b, "~%d", l.Estimate)
	}
	if l.Probe {
		b.WriteString(" probe")
	}
}

// boundString renders a range bound: a term followed by 0xFF is the
// other side of that term.
func boundString(t []byte, plain, after string) string {
	if n, err := storage.TermLength(t); err == nil && n == len(t)-1 && t[n] == 0xFF {
		v := DecodeTerm(t[:len(t)-1])
		if plain == "[" {
			return after + v // lower bound after the term: excluded
		}
		return v + plain // upper bound after the term: included
	}
	v := DecodeTerm(t)
	if plain == "[" {
		return plain + v
	}
	return v + after
}

func (a *PlanAnd) planString(b *strings.Builder) {
	b.WriteString("(and")
	for _, it := range a.Items {
		b.WriteByte(' ')
		it.planString(b)
	}
	for _, it := range a.Not {
		b.WriteString(" not ")
		it.planString(b)
	}
	b.WriteByte(')')
}

func (o *PlanOr) planString(b *strings.Builder) {
	b.WriteString("(or")
	for _, it := range o.Items {
		b.WriteByte(' ')
		it.planString(b)
	}
	b.WriteByte(')')
}

func (n *PlanNot) planString(b *strings.Builder) {
	b.WriteString("(not ")
	n.Item.planString(b)
	b.WriteByte(')')
}

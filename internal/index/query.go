package index

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits of a query's text: a query is client input.
const (
	MaxQueryBytes = 4096
	MaxQueryDepth = 32
	MaxQueryTerms = 64
)

// Expr is a parsed query: And, Or, Not, Match or Range.
type Expr interface{ String() string }

// And matches documents every item matches.
type And struct{ Items []Expr }

// Or matches documents any item matches.
type Or struct{ Items []Expr }

// Not matches documents its item does not match.
type Not struct{ Item Expr }

// Match is field:value, field:"a phrase", or a bare word or phrase (Field
// empty: the text-indexed fields).
type Match struct {
	Field  string
	Value  string
	Quoted bool
	// Prefix: the value ended in * (hel*), and matches the words (or
	// string attributes) that start with it.
	Prefix bool
	Pos    int // byte offset of the match in the query
}

// Range is field:[lo TO hi], field:{lo TO hi} (bounds excluded), or a
// comparison field:>=x, field:>x, field:<=x, field:<x. A nil bound is open.
type Range struct {
	Field        string
	Lo, Hi       *string
	IncLo, IncHi bool
	Pos          int
}

func (e *And) String() string { return "(AND " + join(e.Items) + ")" }
func (e *Or) String() string  { return "(OR " + join(e.Items) + ")" }
func (e *Not) String() string { return "(NOT " + e.Item.String() + ")" }
func (e *Match) String() string {
	v := e.Value
	if e.Quoted {
		v = fmt.Sprintf("%q", v)
	}
	if e.Prefix {
		v += "*"
	}
	if e.Field == "" {
		return v
	}
	return e.Field + ":" + v
}
func (e *Range) String() string {
	lo, hi, l, h := "*", "*", "{", "}"
	if e.Lo != nil {
		lo = *e.Lo
	}
	if e.Hi != nil {
		hi = *e.Hi
	}
	if e.IncLo {
		l = "["
	}
	if e.IncHi {
		h = "]"
	}
	return fmt.Sprintf("%s:%s%s TO %s%s", e.Field, l, lo, hi, h)
}

func join(es []Expr) string {
	s := make([]string, len(es))
	for i, e := range es {
		s[i] = e.String()
	}
	return strings.Join(s, " ")
}

// SyntaxError is a query that does not parse; Pos is the byte offset of
// the offending character.
type SyntaxError struct {
	Pos int
	Msg string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("query syntax error at position %d: %s", e.Pos, e.Msg)
}

// Parse parses a query in the Lucene-like syntax of docs/api.md:
// field:value, field:"phrase", field:[a TO b], field:{a TO b},
// field:>=x (and >, <=, <), bare words and "phrases" (the text fields),
// AND, OR, NOT (also a leading -), parentheses; adjacent clauses are
// ANDed. AND binds tighter than OR.
func Parse(q string) (Expr, error) {
	if len(q) > MaxQueryBytes {
		return nil, &SyntaxError{MaxQueryBytes, fmt.Sprintf("a query is at most %d bytes", MaxQueryBytes)}
	}
	if !utf8.ValidString(q) {
		return nil, &SyntaxError{0, "a query is UTF-8 text"}
	}
	p := &parser{s: q}
	p.next()
	if p.tok.kind == tEOF {
		return nil, &SyntaxError{0, "empty query"}
	}
	e, err := p.or(0)
	if err != nil {
		return nil, err
	}
	if p.tok.kind != tEOF {
		return nil, p.errf("unexpected %s", p.tok)
	}
	return e, nil
}

type tokKind int

const (
	tEOF tokKind = iota
	tWord
	tPhrase
	tLParen
	tRParen
	tLBracket // [
	tRBracket // ]
	tLBrace   // {
	tRBrace   // }
	tColon
	tMinus
	tCmp // >=, >, <=, <
)

type token struct {
	kind tokKind
	text string
	pos  int
}

func (t token) String() string {
	switch t.kind {
	case tEOF:
		return "end of query"
	case tPhrase:
		return fmt.Sprintf("%q", t.text)
	}
	return fmt.Sprintf("%q", t.text)
}

type parser struct {
	s     string
	i     int
	tok   token
	terms int
	err   error
}

func (p *parser) errf(format string, a ...any) error {
	return &SyntaxError{p.tok.pos, fmt.Sprintf(format, a...)}
}

// notOperators are the characters other query languages (Lucene's,
// bleve's) give a meaning in a word: * and ? wildcards, ~ fuzzy and
// proximity matches, ^ boosts. Text analysis would drop them, and an
// attribute would take them as part of its value, so "he?lo" would
// silently search for "he" and "lo": an unquoted word holding one is
// refused, but for a * that ends it (a prefix).
const notOperators = "*?~^"

// wordRune is a rune of an unquoted word.
func wordRune(r rune) bool {
	switch r {
	case '(', ')', '[', ']', '{', '}', ':', '"', '\\':
		return false
	}
	return !unicode.IsSpace(r) && unicode.IsPrint(r)
}

func (p *parser) next() {
	for p.i < len(p.s) {
		r, n := utf8.DecodeRuneInString(p.s[p.i:])
		if !unicode.IsSpace(r) {
			break
		}
		p.i += n
	}
	start := p.i
	if p.i >= len(p.s) {
		p.tok = token{tEOF, "", start}
		return
	}
	single := map[byte]tokKind{'(': tLParen, ')': tRParen, '[': tLBracket, ']': tRBracket, '{': tLBrace, '}': tRBrace, ':': tColon}
	c := p.s[p.i]
	if k, ok := single[c]; ok {
		p.i++
		p.tok = token{k, string(c), start}
		return
	}
	switch c {
	case '"':
		var b strings.Builder
		p.i++
		for {
			if p.i >= len(p.s) {
				p.tok = token{tPhrase, b.String(), start}
				p.err = &SyntaxError{start, "unterminated quote"}
				return
			}
			c := p.s[p.i]
			if c == '\\' && p.i+1 < len(p.s) {
				b.WriteByte(p.s[p.i+1])
				p.i += 2
				continue
			}
			p.i++
			if c == '"' {
				break
			}
			b.WriteByte(c)
		}
		p.tok = token{tPhrase, b.String(), start}
		return
	case '>', '<':
		p.i++
		if p.i < len(p.s) && p.s[p.i] == '=' {
			p.i++
		}
		p.tok = token{tCmp, p.s[start:p.i], start}
		return
	case '-':
		if p.i+1 >= len(p.s) || !isDigitOrDot(p.s[p.i+1]) {
			p.i++
			p.tok = token{tMinus, "-", start}
			return
		}
	}
	for p.i < len(p.s) {
		r, n := utf8.DecodeRuneInString(p.s[p.i:])
		if !wordRune(r) {
			break
		}
		p.i += n
	}
	if p.i == start {
		r, _ := utf8.DecodeRuneInString(p.s[p.i:])
		p.tok = token{tWord, string(r), start}
		p.err = &SyntaxError{start, fmt.Sprintf("unexpected character %q", r)}
		return
	}
	p.tok = token{tWord, p.s[start:p.i], start}
}

func isDigitOrDot(c byte) bool { return c >= '0' && c <= '9' || c == '.' }

func (p *parser) check() error {
	if p.err != nil {
		return p.err
	}
	return nil
}

func (p *parser) or(depth int) (Expr, error) {
	if depth > MaxQueryDepth {
		return nil, p.errf("a query nests at most %d levels", MaxQueryDepth)
	}
	first, err := p.and(depth)
	if err != nil {
		return nil, err
	}
	items := []Expr{first}
	for p.tok.kind == tWord && p.tok.text == "OR" {
		p.next()
		e, err := p.and(depth)
		if err != nil {
			return nil, err
		}
		items = append(items, e)
	}
	if len(items) == 1 {
		return first, nil
	}
	return &Or{items}, nil
}

func (p *parser) and(depth int) (Expr, error) {
	var items []Expr
	for {
		if err := p.check(); err != nil {
			return nil, err
		}
		switch {
		case p.tok.kind == tEOF || p.tok.kind == tRParen:
		case p.tok.kind == tWord && p.tok.text == "OR":
		default:
			if len(items) > 0 && p.tok.kind == tWord && p.tok.text == "AND" {
				p.next()
			}
			e, err := p.unary(depth)
			if err != nil {
				return nil, err
			}
			items = append(items, e)
			continue
		}
		break
	}
	switch len(items) {
	case 0:
		return nil, p.errf("expected a clause, found %s", p.tok)
	case 1:
		return items[0], nil
	}
	return &And{items}, nil
}

func (p *parser) unary(depth int) (Expr, error) {
	if p.tok.kind == tMinus || p.tok.kind == tWord && p.tok.text == "NOT" {
		p.next()
		if depth+1 > MaxQueryDepth {
			return nil, p.errf("a query nests at most %d levels", MaxQueryDepth)
		}
		e, err := p.unary(depth + 1)
		if err != nil {
			return nil, err
		}
		return &Not{e}, nil
	}
	return p.primary(depth)
}

func (p *parser) primary(depth int) (Expr, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	switch p.tok.kind {
	case tLParen:
		p.next()
		e, err := p.or(depth + 1)
		if err != nil {
			return nil, err
		}
		if p.tok.kind != tRParen {
			return nil, p.errf("expected ), found %s", p.tok)
		}
		p.next()
		return e, nil
	case tPhrase:
		t := p.tok
		p.next()
		return p.match("", t)
	case tWord:
		if p.tok.text == "AND" || p.tok.text == "OR" || p.tok.text == "TO" {
			return nil, p.errf("expected a clause, found %s", p.tok)
		}
		t := p.tok
		p.next()
		if p.tok.kind != tColon {
			return p.match("", t)
		}
		p.next()
		return p.fieldValue(t)
	}
	return nil, p.errf("expected a clause, found %s", p.tok)
}

func (p *parser) match(field string, t token) (Expr, error) {
	value, prefix := t.text, false
	if t.kind == tWord {
		if len(value) > 1 && strings.IndexAny(value, notOperators) == len(value)-1 && value[len(value)-1] == '*' {
			value, prefix = value[:len(value)-1], true
		} else if i := strings.IndexAny(value, notOperators); i >= 0 {
			return nil, &SyntaxError{t.pos + i, fmt.Sprintf("%q: %c is not an operator here (a * ends a prefix, as in hel*; there are no other wildcards, fuzzy or proximity matches, or boosts); quote the value to search for it as written", value, value[i])}
		}
	}
	p.terms++
	if p.terms > MaxQueryTerms {
		return nil, &SyntaxError{t.pos, fmt.Sprintf("a query has at most %d terms", MaxQueryTerms)}
	}
	return &Match{Field: field, Value: value, Quoted: t.kind == tPhrase, Prefix: prefix, Pos: t.pos}, nil
}

func (p *parser) fieldValue(field token) (Expr, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	switch p.tok.kind {
	case tWord, tPhrase:
		t := p.tok
		p.next()
		m, err := p.match(field.text, t)
		if err == nil {
			m.(*Match).Pos = field.pos
		}
		return m, err
	case tCmp:
		op := p.tok.text
		p.next()
		if err := p.check(); err != nil {
			return nil, err
		}
		if p.tok.kind != tWord && p.tok.kind != tPhrase {
			return nil, p.errf("expected a value after %s, found %s", op, p.tok)
		}
		v := p.tok.text
		p.next()
		r := &Range{Field: field.text, Pos: field.pos}
		switch op {
		case ">=":
			r.Lo, r.IncLo = &v, true
		case ">":
			r.Lo = &v
		case "<=":
			r.Hi, r.IncHi = &v, true
		case "<":
			r.Hi = &v
		}
		p.terms++
		return r, nil
	case tLBracket, tLBrace:
		r := &Range{Field: field.text, Pos: field.pos, IncLo: p.tok.kind == tLBracket}
		p.next()
		lo, err := p.bound()
		if err != nil {
			return nil, err
		}
		if p.tok.kind != tWord || p.tok.text != "TO" {
			return nil, p.errf("expected TO, found %s", p.tok)
		}
		p.next()
		hi, err := p.bound()
		if err != nil {
			return nil, err
		}
		switch p.tok.kind {
		case tRBracket:
			r.IncHi = true
		case tRBrace:
		default:
			return nil, p.errf("expected ] or }, found %s", p.tok)
		}
		p.next()
		r.Lo, r.Hi = lo, hi
		if lo == nil {
			r.IncLo = false
		}
		if hi == nil {
			r.IncHi = false
		}
		p.terms++
		return r, nil
	}
	return nil, p.errf("expected a value for field %s, found %s", field.text, p.tok)
}

// bound reads a range bound: a value, or * for an open end.
func (p *parser) bound() (*string, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	if p.tok.kind != tWord && p.tok.kind != tPhrase || p.tok.kind == tWord && p.tok.text == "TO" {
		return nil, p.errf("expected a range bound, found %s", p.tok)
	}
	v := p.tok.text
	open := p.tok.kind == tWord && v == "*"
	p.next()
	if open {
		return nil, nil
	}
	return &v, nil
}

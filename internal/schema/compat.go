package schema

import (
	"fmt"
	"slices"
	"strings"

	"github.com/hamba/avro/v2"
)

// Compatibility is a table's schema compatibility level, with the names
// the Avro ecosystem uses (Confluent Schema Registry). BACKWARD: the new
// version reads documents of the previous one; FORWARD: the previous one
// reads documents of the new; FULL: both (the default); the _TRANSITIVE
// variants check against every earlier version; NONE checks nothing.
type Compatibility string

// Compatibility levels.
const (
	Backward           Compatibility = "BACKWARD"
	BackwardTransitive Compatibility = "BACKWARD_TRANSITIVE"
	Forward            Compatibility = "FORWARD"
	ForwardTransitive  Compatibility = "FORWARD_TRANSITIVE"
	Full               Compatibility = "FULL"
	FullTransitive     Compatibility = "FULL_TRANSITIVE"
	None               Compatibility = "NONE"
)

// Levels lists every compatibility level.
var Levels = []Compatibility{Backward, BackwardTransitive, Forward, ForwardTransitive, Full, FullTransitive, None}

// Valid reports whether c names a level ("" is FULL).
func (c Compatibility) Valid() bool { return c == "" || slices.Contains(Levels, c) }

// Or returns c, or FULL when c is "".
func (c Compatibility) Or() Compatibility {
	if c == "" {
		return Full
	}
	return c
}

// CheckLevel decides whether next may follow the versions prev (oldest
// first) under level c. The error is a *FieldError saying which version
// cannot read which, and at which field.
func CheckLevel(c Compatibility, prev []*Version, next *Version) error {
	c = c.Or()
	if c == None || len(prev) == 0 {
		return nil
	}
	against := prev[len(prev)-1:]
	if strings.HasSuffix(string(c), "_TRANSITIVE") {
		against = prev
	}
	back := c == Backward || c == BackwardTransitive || c == Full || c == FullTransitive
	fwd := c == Forward || c == ForwardTransitive || c == Full || c == FullTransitive
	for i := len(against) - 1; i >= 0; i-- {
		old := against[i]
		if back {
			if err := Compatible(next.Schema, old.Schema); err != nil {
				fe := err.(*FieldError)
				return &FieldError{Path: fe.Path, Reason: fmt.Sprintf("%s: version %d cannot read documents of version %d: %s", c, next.Number, old.Number, fe.Reason)}
			}
		}
		if fwd {
			// A numeric promotion is allowed: read back by narrowing
			// each value (see Plan).
			if err := compatible(old.Schema, next.Schema, true); err != nil {
				fe := err.(*FieldError)
				return &FieldError{Path: fe.Path, Reason: fmt.Sprintf("%s: version %d cannot read documents of version %d: %s", c, old.Number, next.Number, fe.Reason)}
			}
		}
	}
	return nil
}

// Compatible reports whether data written with writer can be read with
// reader under Avro's rules, as a *FieldError naming the field that cannot
// be resolved.
func Compatible(reader, writer avro.Schema) error {
	return compatible(reader, writer, false)
}

func compatible(reader, writer avro.Schema, narrowing bool) error {
	c := compatChecker{seen: map[[2]string]bool{}, narrowing: narrowing}
	if fe := c.check(reader, writer, ""); fe != nil {
		return fe
	}
	return nil
}

type compatChecker struct {
	// seen breaks recursion through named types: a pair under check is
	// assumed compatible, as Avro's own algorithm does.
	seen map[[2]string]bool
	// narrowing also accepts a reader numeric type that the writer's
	// type was promoted from (long written, int read).
	narrowing bool
}

// narrowable reports whether values of writer numeric type w can be read as
// the narrower r when each value fits.
func narrowable(w, r avro.Type) bool {
	return promotable(r, w) && w != avro.String && w != avro.Bytes
}

func promotable(w, r avro.Type) bool {
	switch w {
	case avro.Int:
		return r == avro.Long || r == avro.Float || r == avro.Double
	case avro.Long:
		return r == avro.Float || r == avro.Double
	case avro.Float:
		return r == avro.Double
	case avro.String:
		return r == avro.Bytes
	case avro.Bytes:
		return r == avro.String
	}
	return false
}

func namesMatch(r, w avro.NamedSchema) bool {
	return r.FullName() == w.FullName() || r.Name() == w.Name() ||
		slices.Contains(r.Aliases(), w.FullName()) || slices.Contains(r.Aliases(), w.Name())
}

func (c *compatChecker) check(reader, writer avro.Schema, path string) *FieldError {
	reader, writer = deref(reader), deref(writer)
	if wu, ok := writer.(*avro.UnionSchema); ok {
		// Every branch the writer may have chosen must be readable.
		for _, b := range wu.Types() {
			if fe := c.check(reader, b, path); fe != nil {
				if _, inner := deref(reader).(*avro.UnionSchema); !inner && len(wu.Types()) > 1 {
					fe = &FieldError{Path: fe.Path, Reason: fmt.Sprintf("a value written as the union's %s branch: %s", branchName(b), fe.Reason), cause: fe.cause}
				}
				return fe
			}
		}
		return nil
	}
	if ru, ok := reader.(*avro.UnionSchema); ok {
		i := unionBranchFor(ru, writer)
		if i < 0 && c.narrowing {
			i = narrowingBranchFor(ru, writer)
		}
		if i < 0 {
			return fieldErr(path, "a %s value has no branch to go to in union %s", branchName(writer), ru.String())
		}
		return c.check(ru.Types()[i], writer, path)
	}
	if reader.Type() != writer.Type() {
		if promotable(writer.Type(), reader.Type()) || (c.narrowing && narrowable(writer.Type(), reader.Type())) {
			return nil
		}
		return fieldErr(path, "a %s value cannot be read as %s", writer.Type(), reader.Type())
	}
	switch r := reader.(type) {
	case *avro.ArraySchema:
		return c.check(r.Items(), writer.(*avro.ArraySchema).Items(), path)
	case *avro.MapSchema:
		return c.check(r.Values(), writer.(*avro.MapSchema).Values(), path)
	case *avro.FixedSchema:
		w := writer.(*avro.FixedSchema)
		if !namesMatch(r, w) {
			return fieldErr(path, "fixed %s renamed to %s without alias", w.FullName(), r.FullName())
		}
		if r.Size() != w.Size() {
			return fieldErr(path, "fixed size changed from %d to %d", w.Size(), r.Size())
		}
	case *avro.EnumSchema:
		w := writer.(*avro.EnumSchema)
		if !namesMatch(r, w) {
			return fieldErr(path, "enum %s renamed to %s without alias", w.FullName(), r.FullName())
		}
		if r.HasDefault() {
			return nil
		}
		for _, sym := range w.Symbols() {
			if !slices.Contains(r.Symbols(), sym) {
				return fieldErr(path, "enum symbol %s removed and the enum has no default", sym)
			}
		}
	case *avro.RecordSchema:
		w := writer.(*avro.RecordSchema)
		if !namesMatch(r, w) {
			return fieldErr(path, "record %s renamed to %s without alias", w.FullName(), r.FullName())
		}
		// Keyed by the pair of names only: a recursive type meets the
		// same pair again at every level of its (endless) paths.
		key := [2]string{r.FullName(), w.FullName()}
		if c.seen[key] {
			return nil
		}
		c.seen[key] = true
		for _, rf := range r.Fields() {
			wf := writerField(w, rf)
			if wf == nil {
				if !rf.HasDefault() {
					return fieldErr(join(path, rf.Name()), "the reading version has this field without a default, and the documents read do not have it")
				}
				continue
			}
			if fe := c.check(rf.Type(), wf.Type(), join(path, rf.Name())); fe != nil {
				return fe
			}
		}
	}
	return nil
}

// writerField finds the writer field a reader field reads: same name, or a
// writer field named by one of the reader field's aliases.
func writerField(w *avro.RecordSchema, rf *avro.Field) *avro.Field {
	for _, wf := range w.Fields() {
		if wf.Name() == rf.Name() {
			return wf
		}
	}
	for _, wf := range w.Fields() {
		if slices.Contains(rf.Aliases(), wf.Name()) {
			return wf
		}
	}
	return nil
}

// narrowingBranchFor picks, for a numeric writer type that a reader union
// has no exact or promoted branch for, a branch it narrows to (long to
// int), as a plain numeric field narrows. -1 if none.
func narrowingBranchFor(ru *avro.UnionSchema, writer avro.Schema) int {
	for i, b := range ru.Types() {
		if narrowable(deref(writer).Type(), deref(b).Type()) {
			return i
		}
	}
	return -1
}

// unionBranchFor picks the reader union branch that reads a (non-union)
// writer type: the first branch of the same type (and name, for named
// types), else the first branch the writer type promotes to. -1 if none.
func unionBranchFor(ru *avro.UnionSchema, writer avro.Schema) int {
	writer = deref(writer)
	for i, b := range ru.Types() {
		b = deref(b)
		if b.Type() != writer.Type() {
			continue
		}
		rn, rok := b.(avro.NamedSchema)
		wn, wok := writer.(avro.NamedSchema)
		if rok && wok && !namesMatch(rn, wn) {
			continue
		}
		return i
	}
	for i, b := range ru.Types() {
		if promotable(writer.Type(), deref(b).Type()) {
			return i
		}
	}
	return -1
}

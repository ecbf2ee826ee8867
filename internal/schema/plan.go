package schema

import (
	"errors"
	"fmt"
	"math"

	"github.com/hamba/avro/v2"
)

// Plan turns Avro binary written with one schema into Avro binary of another
// (a later or earlier version, or a projection). It is built once for a
// (writer, reader) pair and is safe for concurrent use.
//
// A plan never builds a generic record: it walks the writer's bytes, copies
// spans whose schema is unchanged, skips fields the reader does not have,
// writes defaults for fields the writer did not have, and converts promoted
// values in place.
type Plan struct {
	op       opFn
	identity bool
}

// opFn transcodes one value from d, appending the reader's encoding to dst.
type opFn func(d *decoder, dst []byte) ([]byte, error)

// skipFn steps over one value of a writer type.
type skipFn func(d *decoder) error

// Apply appends the reader-schema encoding of src to dst. An identity plan
// copies src without walking it: stored documents were validated when
// written and their CRC is checked when read.
func (p *Plan) Apply(dst, src []byte) ([]byte, error) {
	if p.identity {
		return append(dst, src...), nil
	}
	d := getDecoder(src)
	defer putDecoder(d)
	out, err := p.op(d, dst)
	if err != nil {
		return dst, err
	}
	if d.i != len(src) {
		return dst, fmt.Errorf("%d trailing bytes after document", len(src)-d.i)
	}
	return out, nil
}

// Identity reports whether the plan copies its input unchanged.
func (p *Plan) Identity() bool { return p.identity }

// NewPlan compiles the plan that reads data written with writer as reader.
// It fails, naming the field, when the schemas cannot be resolved.
//
// Beyond Avro's rules, a plan narrows numbers whose type a later version
// promoted (a long read as int, a double read as float or long): a value
// that does not fit fails the read with the field's path. This is what lets
// a client pinned to an old version read documents written after a
// promotion.
//
// As Avro specifies, some mismatches only fail the documents that meet
// them: a writer union branch the reader cannot read, and an enum symbol
// the reader lacks (with no default). Registration (CheckLevel, under FULL) refuses
// such pairs up front; a plan reads whatever it can.
func NewPlan(writer, reader avro.Schema) (*Plan, error) {
	c := planCompiler{ops: map[[2]avro.Schema]*opFn{}, skips: map[avro.Schema]*skipFn{}, walks: map[avro.Schema]*skipFn{}, same: newSameTypes(writer, reader)}
	op, err := c.op(writer, reader, "")
	if err != nil {
		return nil, err
	}
	return &Plan{op: op, identity: c.same.same(writer, reader)}, nil
}

type planCompiler struct {
	// ops and skips hold the functions compiled so far, by schema; a
	// recursive type refers to its own function through the pointer.
	ops   map[[2]avro.Schema]*opFn
	skips map[avro.Schema]*skipFn // for discarded values
	walks map[avro.Schema]*skipFn // for copied values
	same  *sameTypes
}

func (c *planCompiler) op(writer, reader avro.Schema, path string) (opFn, error) {
	writer, reader = deref(writer), deref(reader)
	key := [2]avro.Schema{writer, reader}
	if p, ok := c.ops[key]; ok {
		return func(d *decoder, dst []byte) ([]byte, error) { return (*p)(d, dst) }, nil
	}
	slot := new(opFn)
	c.ops[key] = slot
	fn, err := c.build(writer, reader, path)
	if err != nil {
		return nil, err
	}
	*slot = fn
	return fn, nil
}

func (c *planCompiler) build(writer, reader avro.Schema, path string) (opFn, error) {
	if c.same.same(writer, reader) {
		return c.copyOp(writer, path), nil
	}
	if wu, ok := writer.(*avro.UnionSchema); ok {
		return c.writerUnion(wu, reader, path)
	}
	if ru, ok := reader.(*avro.UnionSchema); ok {
		i := unionBranchFor(ru, writer)
		if i < 0 {
			i = narrowingBranchFor(ru, writer) // a promotion read back
		}
		if i < 0 {
			return nil, fieldErr(path, "union has no branch for %s", branchName(writer))
		}
		inner, err := c.op(writer, ru.Types()[i], path)
		if err != nil {
			return nil, err
		}
		return func(d *decoder, dst []byte) ([]byte, error) {
			return inner(d, appendLong(dst, int64(i)))
		}, nil
	}
	if writer.Type() != reader.Type() {
		return promotion(writer.Type(), reader.Type(), path)
	}
	if rn, ok := reader.(avro.NamedSchema); ok && !namesMatch(rn, writer.(avro.NamedSchema)) {
		return nil, fieldErr(path, "%s %s renamed to %s without alias", reader.Type(), writer.(avro.NamedSchema).FullName(), rn.FullName())
	}
	switch r := reader.(type) {
	case *avro.FixedSchema:
		if w := writer.(*avro.FixedSchema); w.Size() != r.Size() {
			return nil, fieldErr(path, "fixed size changed from %d to %d", w.Size(), r.Size())
		}
	case *avro.RecordSchema:
		op, err := c.record(writer.(*avro.RecordSchema), r, path)
		if err != nil {
			return nil, err
		}
		return nest(path, op), nil
	case *avro.ArraySchema:
		item, err := c.op(writer.(*avro.ArraySchema).Items(), r.Items(), path)
		if err != nil {
			return nil, err
		}
		return nest(path, blocks(item, false)), nil
	case *avro.MapSchema:
		val, err := c.op(writer.(*avro.MapSchema).Values(), r.Values(), path)
		if err != nil {
			return nil, err
		}
		return nest(path, blocks(val, true)), nil
	case *avro.EnumSchema:
		return enumOp(writer.(*avro.EnumSchema), r, path), nil
	}
	// Same primitive or same fixed: the bytes do not change.
	return c.copyOp(writer, path), nil
}

// copyOp copies one value's bytes unchanged.
func (c *planCompiler) copyOp(s avro.Schema, path string) opFn {
	skip := c.walk(s)
	return func(d *decoder, dst []byte) ([]byte, error) {
		start := d.i
		if err := skip(d); err != nil {
			return dst, fieldErr(path, "%v", err)
		}
		return append(dst, d.b[start:d.i]...), nil
	}
}

func (c *planCompiler) writerUnion(wu *avro.UnionSchema, reader avro.Schema, path string) (opFn, error) {
	branches := make([]opFn, len(wu.Types()))
	for i, b := range wu.Types() {
		op, err := c.op(b, reader, path)
		if err != nil {
			// The writer may never have chosen this branch; fail only
			// if a document did.
			msg := err.Error()
			op = func(*decoder, []byte) ([]byte, error) { return nil, errors.New(msg) }
		}
		branches[i] = op
	}
	return func(d *decoder, dst []byte) ([]byte, error) {
		idx, err := d.int()
		if err != nil {
			return dst, fieldErr(path, "%v", err)
		}
		if idx < 0 || idx >= int64(len(branches)) {
			return dst, fieldErr(path, "union branch %d out of range", idx)
		}
		return branches[idx](d, dst)
	}, nil
}

func promotion(w, r avro.Type, path string) (opFn, error) {
	switch {
	case (w == avro.Int && r == avro.Long) || (w == avro.String && r == avro.Bytes) || (w == avro.Bytes && r == avro.String):
		// Same encoding on both sides.
		if w == avro.Int {
			return func(d *decoder, dst []byte) ([]byte, error) {
				v, err := d.int()
				if err != nil {
					return dst, fieldErr(path, "%v", err)
				}
				return appendLong(dst, v), nil
			}, nil
		}
		return func(d *decoder, dst []byte) ([]byte, error) {
			b, err := d.bytes()
			if err != nil {
				return dst, fieldErr(path, "%v", err)
			}
			return appendBytes(dst, b), nil
		}, nil
	case (w == avro.Int || w == avro.Long) && r == avro.Float:
		read := readerOf(w)
		return func(d *decoder, dst []byte) ([]byte, error) {
			v, err := read(d)
			if err != nil {
				return dst, fieldErr(path, "%v", err)
			}
			return appendFloat(dst, float32(v)), nil
		}, nil
	case (w == avro.Int || w == avro.Long) && r == avro.Double:
		read := readerOf(w)
		return func(d *decoder, dst []byte) ([]byte, error) {
			v, err := read(d)
			if err != nil {
				return dst, fieldErr(path, "%v", err)
			}
			return appendDouble(dst, float64(v)), nil
		}, nil
	case narrowable(w, r):
		return narrowing(w, r, path), nil
	case w == avro.Float && r == avro.Double:
		return func(d *decoder, dst []byte) ([]byte, error) {
			v, err := d.float()
			if err != nil {
				return dst, fieldErr(path, "%v", err)
			}
			return appendDouble(dst, float64(v)), nil
		}, nil
	}
	return nil, fieldErr(path, "cannot read %s as %s", w, r)
}

// readerOf returns the varint reader for an int or long.
func readerOf(t avro.Type) func(*decoder) (int64, error) {
	if t == avro.Int {
		return (*decoder).int
	}
	return (*decoder).long
}

// narrowing reads a value of a promoted numeric type as the type it was
// promoted from, failing when the value does not fit.
func narrowing(w, r avro.Type, path string) opFn {
	return func(d *decoder, dst []byte) ([]byte, error) {
		var f float64
		switch w {
		case avro.Long:
			v, err := d.long()
			if err != nil {
				return dst, fieldErr(path, "%v", err)
			}
			if v < math.MinInt32 || v > math.MaxInt32 {
				return dst, fieldErr(path, "value %d does not fit the reader's int", v)
			}
			return appendLong(dst, v), nil
		case avro.Float:
			v, err := d.float()
			if err != nil {
				return dst, fieldErr(path, "%v", err)
			}
			f = float64(v)
		default:
			v, err := d.double()
			if err != nil {
				return dst, fieldErr(path, "%v", err)
			}
			f = v
		}
		switch r {
		case avro.Float:
			return appendFloat(dst, float32(f)), nil
		case avro.Int, avro.Long:
			lo, hi := float64(math.MinInt64), float64(math.MaxInt64)
			if r == avro.Int {
				lo, hi = math.MinInt32, math.MaxInt32
			}
			if f != math.Trunc(f) || f < lo || f >= hi {
				return dst, fieldErr(path, "value %v does not fit the reader's %s", f, r)
			}
			return appendLong(dst, int64(f)), nil
		}
		return dst, fieldErr(path, "cannot read %s as %s", w, r)
	}
}

// blocks transcodes an array or map, writing each writer block as one block
// with a positive count, and checking any byte size the writer recorded.
func blocks(item opFn, isMap bool) opFn {
	return func(d *decoder, dst []byte) ([]byte, error) {
		for {
			n, size, err := d.blockCount()
			if err != nil {
				return dst, err
			}
			dst = appendLong(dst, n)
			if n == 0 {
				return dst, nil
			}
			start := d.i
			for ; n > 0; n-- {
				if isMap {
					k, err := d.bytes()
					if err != nil {
						return dst, err
					}
					dst = appendBytes(dst, k)
				}
				if dst, err = item(d, dst); err != nil {
					return dst, err
				}
			}
			if size > 0 && int64(d.i-start) != size {
				return dst, errBlockSize
			}
		}
	}
}

func enumOp(w, r *avro.EnumSchema, path string) opFn {
	mapping := make([]int64, len(w.Symbols()))
	for i, sym := range w.Symbols() {
		mapping[i] = -1
		for j, rs := range r.Symbols() {
			if rs == sym {
				mapping[i] = int64(j)
			}
		}
		if mapping[i] < 0 && r.HasDefault() {
			for j, rs := range r.Symbols() {
				if rs == r.Default() {
					mapping[i] = int64(j)
				}
			}
		}
	}
	wsyms := w.Symbols()
	return func(d *decoder, dst []byte) ([]byte, error) {
		i, err := d.int()
		if err != nil {
			return dst, fieldErr(path, "%v", err)
		}
		if i < 0 || i >= int64(len(mapping)) {
			return dst, fieldErr(path, "enum index %d out of range", i)
		}
		if mapping[i] < 0 {
			return dst, fieldErr(path, "enum symbol %s unknown to the reader", wsyms[i])
		}
		return appendLong(dst, mapping[i]), nil
	}
}

// recordAction is one step of a streamed record: skip a writer field,
// transcode a writer field, or write a reader field's default.
type recordAction struct {
	skip skipFn
	op   opFn
	def  []byte
	path string
}

func (c *planCompiler) record(w, r *avro.RecordSchema, path string) (opFn, error) {
	src := make([]int, len(r.Fields())) // writer field index per reader field, -1 for default
	defs := make([][]byte, len(r.Fields()))
	ops := make([]opFn, len(r.Fields()))
	inOrder := true
	last := -1
	for i, rf := range r.Fields() {
		fpath := join(path, rf.Name())
		src[i] = -1
		wf := writerField(w, rf)
		if wf == nil {
			def, err := encodeDefault(rf)
			if err != nil {
				return nil, fieldErr(fpath, "default: %v", err)
			}
			defs[i] = def
			continue
		}
		for j, f := range w.Fields() {
			if f == wf {
				src[i] = j
			}
		}
		if src[i] < last {
			inOrder = false
		}
		last = src[i]
		op, err := c.op(wf.Type(), rf.Type(), fpath)
		if err != nil {
			return nil, err
		}
		ops[i] = op
	}
	if inOrder {
		return c.streamedRecord(w, r, src, ops, defs, path), nil
	}
	return c.bufferedRecord(w, src, ops, defs), nil
}

func (c *planCompiler) streamedRecord(w, r *avro.RecordSchema, src []int, ops []opFn, defs [][]byte, path string) opFn {
	var actions []recordAction
	next := 0 // next writer field not yet consumed
	for i := range r.Fields() {
		if src[i] < 0 {
			actions = append(actions, recordAction{def: defs[i]})
			continue
		}
		for ; next < src[i]; next++ {
			actions = append(actions, recordAction{skip: c.skip(w.Fields()[next].Type()), path: join(path, w.Fields()[next].Name())})
		}
		actions = append(actions, recordAction{op: ops[i]})
		next++
	}
	for ; next < len(w.Fields()); next++ {
		actions = append(actions, recordAction{skip: c.skip(w.Fields()[next].Type()), path: join(path, w.Fields()[next].Name())})
	}
	return func(d *decoder, dst []byte) ([]byte, error) {
		var err error
		for i := range actions {
			a := &actions[i]
			switch {
			case a.op != nil:
				if dst, err = a.op(d, dst); err != nil {
					return dst, err
				}
			case a.skip != nil:
				if err = a.skip(d); err != nil {
					return dst, fieldErr(a.path, "%v", err)
				}
			default:
				dst = append(dst, a.def...)
			}
		}
		return dst, nil
	}
}

// bufferedRecord handles readers whose fields come in another order than
// the writer's: each writer field is transcoded into its own buffer, then
// the buffers are written in reader order.
func (c *planCompiler) bufferedRecord(w *avro.RecordSchema, src []int, ops []opFn, defs [][]byte) opFn {
	readerOf := make([]int, len(w.Fields()))
	for j := range readerOf {
		readerOf[j] = -1
	}
	for i, j := range src {
		if j >= 0 {
			readerOf[j] = i
		}
	}
	skips := make([]skipFn, len(w.Fields()))
	for j, f := range w.Fields() {
		skips[j] = c.skip(f.Type())
	}
	return func(d *decoder, dst []byte) ([]byte, error) {
		bufs := make([][]byte, len(src))
		for j := range readerOf {
			i := readerOf[j]
			if i < 0 {
				if err := skips[j](d); err != nil {
					return dst, err
				}
				continue
			}
			var err error
			if bufs[i], err = ops[i](d, nil); err != nil {
				return dst, err
			}
		}
		for i := range src {
			if src[i] < 0 {
				dst = append(dst, defs[i]...)
			} else {
				dst = append(dst, bufs[i]...)
			}
		}
		return dst, nil
	}
}

// encodeDefault encodes a field's default value with the field's type.
func encodeDefault(f *avro.Field) ([]byte, error) {
	if !f.HasDefault() {
		return nil, errors.New("field has no default")
	}
	return avro.Marshal(f.Type(), f.Default())
}

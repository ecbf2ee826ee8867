package schema

import "github.com/hamba/avro/v2"

// skip returns the function that steps over one value of writer type s
// that is being discarded, without decoding it: array and map blocks that
// carry their byte size are jumped over.
func (c *planCompiler) skip(s avro.Schema) skipFn { return c.stepper(s, true) }

// walk returns the function that steps over one value whose bytes are
// kept (copied): it checks every item, and that each block's byte size
// agrees with its items, so corrupt sizes cannot make a copy misaligned.
func (c *planCompiler) walk(s avro.Schema) skipFn { return c.stepper(s, false) }

func (c *planCompiler) stepper(s avro.Schema, jump bool) skipFn {
	s = deref(s)
	memo := c.walks
	if jump {
		memo = c.skips
	}
	if p, ok := memo[s]; ok {
		return func(d *decoder) error { return (*p)(d) }
	}
	slot := new(skipFn)
	memo[s] = slot
	*slot = c.buildSkip(s, jump)
	return *slot
}

func (c *planCompiler) buildSkip(s avro.Schema, jump bool) skipFn {
	switch s := s.(type) {
	case *avro.RecordSchema:
		fields := make([]skipFn, len(s.Fields()))
		for i, f := range s.Fields() {
			fields[i] = c.stepper(f.Type(), jump)
		}
		return nestSkip(func(d *decoder) error {
			for _, f := range fields {
				if err := f(d); err != nil {
					return err
				}
			}
			return nil
		})
	case *avro.ArraySchema:
		return nestSkip(skipBlocks(c.stepper(s.Items(), jump), false, jump))
	case *avro.MapSchema:
		return nestSkip(skipBlocks(c.stepper(s.Values(), jump), true, jump))
	case *avro.UnionSchema:
		branches := make([]skipFn, len(s.Types()))
		for i, b := range s.Types() {
			branches[i] = c.stepper(b, jump)
		}
		return func(d *decoder) error {
			i, err := d.int()
			if err != nil {
				return err
			}
			if i < 0 || i >= int64(len(branches)) {
				return errLength
			}
			return branches[i](d)
		}
	case *avro.FixedSchema:
		n := s.Size()
		return func(d *decoder) error { _, err := d.fixed(n); return err }
	case *avro.EnumSchema:
		// A skipped value is discarded, so its index is not checked.
		return func(d *decoder) error { _, err := d.int(); return err }
	}
	switch s.Type() {
	case avro.Null:
		return func(*decoder) error { return nil }
	case avro.Boolean:
		return func(d *decoder) error { _, err := d.boolean(); return err }
	case avro.Int:
		return func(d *decoder) error { _, err := d.int(); return err }
	case avro.Long:
		return func(d *decoder) error { _, err := d.long(); return err }
	case avro.Float:
		return func(d *decoder) error { _, err := d.fixed(4); return err }
	case avro.Double:
		return func(d *decoder) error { _, err := d.fixed(8); return err }
	default: // string, bytes
		return func(d *decoder) error { _, err := d.bytes(); return err }
	}
}

// skipBlocks steps over an array or map. With jump it jumps over whole
// blocks whose byte size the writer recorded; without, it steps over every
// item and checks the recorded size.
func skipBlocks(item skipFn, isMap, jump bool) skipFn {
	return func(d *decoder) error {
		for {
			n, size, err := d.blockCount()
			if err != nil {
				return err
			}
			if n == 0 {
				return nil
			}
			if size > 0 && jump {
				if _, err := d.fixed(int(size)); err != nil {
					return err
				}
				continue
			}
			start := d.i
			for ; n > 0; n-- {
				if isMap {
					if _, err := d.bytes(); err != nil {
						return err
					}
				}
				if err := item(d); err != nil {
					return err
				}
			}
			if size > 0 && int64(d.i-start) != size {
				return errBlockSize
			}
		}
	}
}

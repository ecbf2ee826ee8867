package schema

import "github.com/hamba/avro/v2"

// skip returns the function that steps over one value of writer type s
// without decoding it.
func (c *planCompiler) skip(s avro.Schema) skipFn {
	s = deref(s)
	if p, ok := c.skips[s]; ok {
		return func(d *decoder) error { return (*p)(d) }
	}
	slot := new(skipFn)
	c.skips[s] = slot
	*slot = c.buildSkip(s)
	return *slot
}

func (c *planCompiler) buildSkip(s avro.Schema) skipFn {
	switch s := s.(type) {
	case *avro.RecordSchema:
		fields := make([]skipFn, len(s.Fields()))
		for i, f := range s.Fields() {
			fields[i] = c.skip(f.Type())
		}
		return func(d *decoder) error {
			for _, f := range fields {
				if err := f(d); err != nil {
					return err
				}
			}
			return nil
		}
	case *avro.ArraySchema:
		return skipBlocks(c.skip(s.Items()), false)
	case *avro.MapSchema:
		return skipBlocks(c.skip(s.Values()), true)
	case *avro.UnionSchema:
		branches := make([]skipFn, len(s.Types()))
		for i, b := range s.Types() {
			branches[i] = c.skip(b)
		}
		return func(d *decoder) error {
			i, err := d.long()
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
		return func(d *decoder) error { _, err := d.long(); return err }
	}
	switch s.Type() {
	case avro.Null:
		return func(*decoder) error { return nil }
	case avro.Boolean:
		return func(d *decoder) error { _, err := d.fixed(1); return err }
	case avro.Int, avro.Long:
		return func(d *decoder) error { _, err := d.long(); return err }
	case avro.Float:
		return func(d *decoder) error { _, err := d.fixed(4); return err }
	case avro.Double:
		return func(d *decoder) error { _, err := d.fixed(8); return err }
	default: // string, bytes
		return func(d *decoder) error { _, err := d.bytes(); return err }
	}
}

// skipBlocks skips an array or map, jumping over whole blocks when the
// writer recorded their byte size.
func skipBlocks(item skipFn, isMap bool) skipFn {
	return func(d *decoder) error {
		for {
			n, size, err := d.blockCount()
			if err != nil {
				return err
			}
			if n == 0 {
				return nil
			}
			if size > 0 {
				if _, err := d.fixed(int(size)); err != nil {
					return err
				}
				continue
			}
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
		}
	}
}

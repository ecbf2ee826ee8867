package schema

import (
	"fmt"
	"sync"
)

// Validator checks that bytes are exactly one well-formed Avro value of a
// schema (for documents that arrive as avro/binary): every length, int
// range, enum index and union index is checked, as a read would.
type Validator struct{ w *JSONWriter }

// validateBufs holds the buffers Validate renders into and throws away:
// a storage node validates every document it writes, and rendering each
// into a new buffer was a twelfth of what a PUT allocated.
var validateBufs = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledValidate is the largest buffer Validate gives back to the pool.
const maxPooledValidate = 64 << 10

// Validate returns an error unless b holds exactly one value.
func (v *Validator) Validate(b []byte) error {
	d := getDecoder(b)
	defer putDecoder(d)
	d.utf8 = true
	buf := validateBufs.Get().(*[]byte)
	out, err := v.w.write(d, (*buf)[:0])
	if cap(out) <= maxPooledValidate {
		*buf = out
		validateBufs.Put(buf)
	}
	if err != nil {
		return fmt.Errorf("malformed Avro binary: %w", err)
	}
	if d.i != len(b) {
		return &FieldError{Reason: fmt.Sprintf("malformed Avro binary: %d trailing bytes", len(b)-d.i)}
	}
	return nil
}

// Validate checks that b is exactly one well-formed value of this version,
// with the version's compiled writer (no compilation per call).
func (v *Version) Validate(b []byte) error { return (&Validator{w: v.JSON}).Validate(b) }

// Canonical checks that b is exactly one well-formed value of this
// version and returns the bytes a JSON body of the same document is
// stored as (map entries sorted, each key once), so that equal documents
// have equal bytes (and CRCs) whatever the form they arrived in.
func (v *Version) Canonical(b []byte) ([]byte, error) {
	if err := v.Validate(b); err != nil {
		return nil, err
	}
	js, err := v.JSON.Append(nil, b)
	if err != nil {
		return nil, err
	}
	tree, err := DecodeJSON(js)
	if err != nil {
		return nil, err
	}
	return EncodeJSON(nil, v.Schema, tree)
}

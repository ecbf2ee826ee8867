package schema

import "fmt"

// Validator checks that bytes are exactly one well-formed Avro value of a
// schema (for documents that arrive as avro/binary): every length, int
// range, enum index and union index is checked, as a read would.
type Validator struct{ w *JSONWriter }

// Validate returns an error unless b holds exactly one value.
func (v *Validator) Validate(b []byte) error {
	d := getDecoder(b)
	defer putDecoder(d)
	d.utf8 = true
	if _, err := v.w.write(d, nil); err != nil {
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

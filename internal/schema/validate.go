package schema

import (
	"fmt"

	"github.com/hamba/avro/v2"
)

// Validator checks that bytes are exactly one well-formed Avro value of a
// schema (for documents that arrive as avro/binary).
type Validator struct{ skip skipFn }

// NewValidator compiles the validator of s.
func NewValidator(s avro.Schema) *Validator {
	c := planCompiler{ops: map[[2]avro.Schema]*opFn{}, skips: map[avro.Schema]*skipFn{}}
	return &Validator{skip: c.skip(s)}
}

// Validate returns an error unless b holds exactly one value.
func (v *Validator) Validate(b []byte) error {
	d := decoder{b: b}
	if err := v.skip(&d); err != nil {
		return &FieldError{Reason: "malformed Avro binary: " + err.Error()}
	}
	if d.i != len(b) {
		return &FieldError{Reason: fmt.Sprintf("malformed Avro binary: %d trailing bytes", len(b)-d.i)}
	}
	return nil
}

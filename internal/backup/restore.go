package backup

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/schema"
)

// A restore's writes: each request commits at most MaxBatchOps operations
// and about MaxBatchBytes of documents (a commit also carries the
// documents a put replaces, so well under storage.MaxCommitBytes).
const (
	MaxBatchOps   = 1000
	MaxBatchBytes = 4 << 20
)

// ErrMalformed is a restore body line that is not a row or mark line of
// the backup format.
var ErrMalformed = errors.New("malformed restore line")

// LineError says which line of a restore body is wrong.
type LineError struct {
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }
func (e *LineError) Unwrap() error { return e.Err }

// RestoreRegistry is what a restore reads of the schema registry.
type RestoreRegistry interface {
	Database(name string) (*schema.Database, error)
	Table(db, name string) (*schema.Table, error)
}

// Plan is a restore body turned into writes.
type Plan struct {
	// Requests commit the body's lines: each is one partition's, and a
	// partition's come in the order of its lines.
	Requests []node.WriteRequest
	Rows     int
	Marks    int
}

// restoreLine is a row or mark line.
type restoreLine struct {
	Type    string `json:"type"`
	Table   string `json:"table"`
	RawKey  []any  `json:"key"`
	Version int    `json:"version"`
	// TSms is the document's time in the backed-up database: a restored
	// document's time is its restore's commit.
	TSms *int64 `json:"ts_ms"`
	Avro []byte `json:"avro"`
}

// Read checks a restore body — row and mark lines of a backup, NDJSON —
// against db's tables and turns it into write requests. Any line that is
// not a row of an existing table at a registered version with a document
// that version reads, or a mark of an auto-increment table, fails the
// whole body: nothing is written.
func Read(reg RestoreRegistry, db string, body []byte) (*Plan, error) {
	d, err := reg.Database(db)
	if err != nil {
		return nil, err
	}
	plan := &Plan{}
	open := map[int]int{} // partition → index of its request being filled
	var sizes []int       // each request's bytes of documents
	n := 0
	for len(body) > 0 {
		n++
		line := body
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			body = nil
		}
		op, part, size, err := readLine(reg, d, line)
		if err != nil {
			return nil, &LineError{Line: n, Err: err}
		}
		if op.Kind == node.OpKeepMark {
			plan.Marks++
		} else {
			plan.Rows++
		}
		i, ok := open[part]
		if !ok || len(plan.Requests[i].Ops) >= MaxBatchOps || sizes[i]+size > MaxBatchBytes {
			i = len(plan.Requests)
			plan.Requests = append(plan.Requests, node.WriteRequest{DB: db, Partition: part})
			sizes = append(sizes, 0)
			open[part] = i
		}
		plan.Requests[i].Ops = append(plan.Requests[i].Ops, op)
		sizes[i] += size
	}
	if n == 0 {
		return nil, &LineError{Line: 1, Err: fmt.Errorf("%w: the body holds no lines", ErrMalformed)}
	}
	return plan, nil
}

// readLine checks one line and returns its operation, partition and size.
func readLine(reg RestoreRegistry, d *schema.Database, line []byte) (node.Op, int, int, error) {
	l, err := parseLine(line)
	if err != nil {
		return node.Op{}, 0, 0, err
	}
	if l.Type != TypeRow && l.Type != TypeMark {
		return node.Op{}, 0, 0, fmt.Errorf("%w: a restore body holds %q and %q lines only (the other lines of a backup are the restoring client's)", ErrMalformed, TypeRow, TypeMark)
	}
	t, err := reg.Table(d.Name, l.Table)
	if err != nil {
		return node.Op{}, 0, 0, err
	}
	texts, err := schema.KeyTexts(l.RawKey)
	if err != nil {
		return node.Op{}, 0, 0, &KeyError{err}
	}
	key, err := t.ParseKey(texts)
	if err != nil {
		return node.Op{}, 0, 0, &KeyError{err}
	}
	if len(key) != len(t.Key) {
		return node.Op{}, 0, 0, &KeyError{fmt.Errorf("table %s has %d key parts, the line gives %d", t.Name, len(t.Key), len(key))}
	}
	op := node.Op{Table: t.Name, Key: key}
	switch l.Type {
	case TypeRow:
		v := t.Version(l.Version)
		if v == nil {
			return node.Op{}, 0, 0, fmt.Errorf("table %s version %d (register the backup's versions first): %w", t.Name, l.Version, registry.ErrNoVersion)
		}
		// As a PUT of the same Avro stores it: a backup's documents are
		// stored that way already, and keep their bytes.
		value, err := v.Canonical(l.Avro)
		if err != nil {
			return node.Op{}, 0, 0, err
		}
		op.Kind, op.Version, op.Value = node.OpPut, l.Version, value
	case TypeMark:
		if !t.AutoIncrement() {
			return node.Op{}, 0, 0, fmt.Errorf("%w: table %s has no auto-increment key part to mark", ErrMalformed, t.Name)
		}
		if l.Version != 0 || l.Avro != nil || l.TSms != nil {
			return node.Op{}, 0, 0, fmt.Errorf("%w: a mark line has a type, table and key only", ErrMalformed)
		}
		op.Kind = node.OpKeepMark
	}
	return op, d.PartitionOf(key[0]), len(l.Avro) + 64, nil
}

// KeyError is a line's key that does not fit its table.
type KeyError struct{ Err error }

func (e *KeyError) Error() string { return e.Err.Error() }
func (e *KeyError) Unwrap() error { return e.Err }

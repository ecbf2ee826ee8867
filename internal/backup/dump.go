package backup

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"strconv"
	"time"

	"github.com/cortado-db/cortado/internal/changes"
	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/node"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
)

// Format is the backup format's version, in its first line. A reader
// refuses a format it does not know.
const Format = 1

// Line types, in the order a backup holds them: one "backup" line, a
// "table" line per table (again, with every version, before the first row
// of a version registered while the backup ran), then per partition a
// "partition" line, its "row" and "mark" lines, and a "partition_end"
// line (or "partition_abort" when its snapshot failed midway and is taken
// again: the section before it counts for nothing), and last an "end"
// line. A backup without its "end" line is incomplete. An "error" line
// says why a backup stopped.
const (
	TypeBackup         = "backup"
	TypeTable          = "table"
	TypePartition      = "partition"
	TypeRow            = "row"
	TypeMark           = "mark"
	TypePartitionEnd   = "partition_end"
	TypePartitionAbort = "partition_abort"
	TypeEnd            = "end"
	TypeError          = "error"
)

// Sources finds who streams a partition's snapshot: its master
// (routing.ChangeSources, as change streams use).
type Sources interface {
	Snapshot(db string, partition int) (node.Snapshotter, error)
}

// Registry is what a backup reads of the schema registry.
type Registry interface {
	Database(name string) (*schema.Database, error)
	Tables(db string) []*schema.Table
	TableAtLeast(ctx context.Context, db, name string, version int) (*schema.Table, error)
}

// Dumper writes backups.
type Dumper struct {
	Sources Sources
	Reg     Registry
	Logger  *slog.Logger
	// Attempts is how many times a partition's snapshot is taken before
	// the backup fails (default 10), with a pause that doubles from
	// 250 ms up to 5 s between them (about 28 s in all, past a
	// failover's lease): a master that fails over midway, or is
	// streaming its most snapshots at once, is asked again.
	Attempts int
}

// Summary is what a backup holds.
type Summary struct {
	Partitions int    `json:"partitions"`
	Rows       int    `json:"rows"`
	Marks      int    `json:"marks"`
	Token      string `json:"token"`
}

// Header is a backup's first line.
type Header struct {
	Type     string           `json:"type"`
	Format   int              `json:"format"`
	DB       string           `json:"db"`
	Created  time.Time        `json:"created"`
	Database *schema.Database `json:"database"`
}

// TableLine is a table's definition: its key, compatibility level and
// every schema version, as registered.
type TableLine struct {
	Type          string               `json:"type"`
	Table         string               `json:"table"`
	Key           []schema.KeyPart     `json:"key"`
	Compatibility schema.Compatibility `json:"compatibility"`
	Versions      []VersionLine        `json:"versions"`
}

// VersionLine is one schema version of a table.
type VersionLine struct {
	Version int             `json:"version"`
	Schema  json.RawMessage `json:"schema"`
}

// PartitionLine opens a partition's section: a snapshot consistent at SCN.
type PartitionLine struct {
	Type      string `json:"type"`
	Partition int    `json:"partition"`
	SCN       string `json:"scn"`
}

// PartitionEnd closes a partition's section: how many row and mark lines
// it holds and the CRC-32C of their bytes (each line with its newline).
type PartitionEnd struct {
	Type      string `json:"type"`
	Partition int    `json:"partition"`
	Rows      int    `json:"rows"`
	Marks     int    `json:"marks"`
	CRC32C    uint32 `json:"crc32c"`
}

// PartitionAbort says the section begun last failed midway: it counts
// for nothing, and is taken again.
type PartitionAbort struct {
	Type      string `json:"type"`
	Partition int    `json:"partition"`
	Reason    string `json:"reason"`
}

// ErrorLine says why a backup stopped (Error is the problem a request
// would have had).
type ErrorLine struct {
	Type  string `json:"type"`
	Error any    `json:"error"`
}

// End is a backup's last line.
type End struct {
	Type       string `json:"type"`
	Partitions int    `json:"partitions"`
	Rows       int    `json:"rows"`
	Marks      int    `json:"marks"`
	// Token is a change-stream token at every partition's SCN.
	Token string `json:"token"`
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Dump writes a backup of db's partitions (all when partitions is empty)
// to w, calling flush after each partition's section. An error after the
// first line leaves the backup without its end line.
func (d *Dumper) Dump(ctx context.Context, db string, partitions []int, w io.Writer, flush func() error) (Summary, error) {
	def, err := d.Reg.Database(db)
	if err != nil {
		return Summary{}, err
	}
	if len(partitions) == 0 {
		for p := range def.Partitions {
			partitions = append(partitions, p)
		}
	}
	o := &output{w: w, flush: flush, written: map[string]int{}}
	if err := o.line(Header{Type: TypeBackup, Format: Format, DB: db, Created: time.Now().UTC(), Database: def}); err != nil {
		return Summary{}, err
	}
	for _, t := range d.Reg.Tables(db) { // by name
		if err := o.table(t); err != nil {
			return Summary{}, err
		}
	}
	token := changes.Token{}
	var sum Summary
	for _, p := range partitions {
		scn, rows, marks, err := d.partition(ctx, db, p, o)
		if err != nil {
			return sum, err
		}
		token[p] = changes.Position{SCN: scn}
		sum.Partitions++
		sum.Rows += rows
		sum.Marks += marks
	}
	sum.Token = token.Encode(db)
	if err := o.line(End{Type: TypeEnd, Partitions: sum.Partitions, Rows: sum.Rows, Marks: sum.Marks, Token: sum.Token}); err != nil {
		return sum, err
	}
	return sum, o.flush()
}

// output writes lines, remembering which table versions it wrote.
type output struct {
	w       io.Writer
	flush   func() error
	buf     []byte
	written map[string]int // table → newest version written
}

// outputError is a failure to write to the backup's reader: never worth
// taking the snapshot again for.
type outputError struct{ err error }

func (e *outputError) Error() string { return e.err.Error() }
func (e *outputError) Unwrap() error { return e.err }

func (o *output) line(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return o.raw(append(b, '\n'))
}

func (o *output) raw(b []byte) error {
	if _, err := o.w.Write(b); err != nil {
		return &outputError{err}
	}
	return nil
}

func (o *output) table(t *schema.Table) error {
	l := TableLine{Type: TypeTable, Table: t.Name, Key: t.Key, Compatibility: t.Compatibility.Or()}
	for _, v := range t.Versions {
		l.Versions = append(l.Versions, VersionLine{Version: v.Number, Schema: json.RawMessage(v.Text)})
	}
	o.written[t.Name] = len(t.Versions)
	return o.line(l)
}

// partition writes one partition's section, taking its snapshot again
// when one fails midway.
func (d *Dumper) partition(ctx context.Context, db string, p int, o *output) (storage.SCN, int, int, error) {
	attempts := d.Attempts
	if attempts <= 0 {
		attempts = 10
	}
	pause := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		scn, rows, marks, opened, err := d.section(ctx, db, p, o)
		if err == nil {
			return scn, rows, marks, nil
		}
		var oe *outputError
		var bad *badRow
		if ctx.Err() != nil || errors.As(err, &oe) || errors.As(err, &bad) || attempt == attempts {
			return storage.SCN{}, 0, 0, err
		}
		if d.Logger != nil {
			d.Logger.Warn("backup: a partition's snapshot failed; taking it again", "db", db, "partition", p, "attempt", attempt, "err", err)
		}
		if opened {
			if err := o.line(PartitionAbort{Type: TypePartitionAbort, Partition: p, Reason: err.Error()}); err != nil {
				return storage.SCN{}, 0, 0, err
			}
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return storage.SCN{}, 0, 0, ctx.Err()
		}
		pause = min(2*pause, 5*time.Second)
	}
}

// badRow is a stored row a backup cannot write: the backup fails rather
// than leave it out.
type badRow struct{ err error }

func (e *badRow) Error() string { return e.err.Error() }
func (e *badRow) Unwrap() error { return e.err }

// section streams one snapshot of partition p as its section; opened says
// whether its partition line was written.
func (d *Dumper) section(ctx context.Context, db string, p int, o *output) (scn storage.SCN, rows, marks int, opened bool, err error) {
	src, err := d.Sources.Snapshot(db, p)
	if err != nil {
		return scn, 0, 0, false, err
	}
	crc := uint32(0)
	emit := func(b []byte) error {
		crc = crc32.Update(crc, castagnoli, b)
		return o.raw(b)
	}
	// Replicated: a section holds no commit a failover could still undo
	// (one committed by the master and not yet held by enough replicas
	// to be acknowledged), as a read returns none.
	err = src.Snapshot(ctx, node.SnapshotRequest{DB: db, Partition: p, Replicated: true}, func(c *node.SnapshotChunk) error {
		if !opened {
			scn, opened = c.SCN, true
			if !c.Replicated && d.Logger != nil {
				d.Logger.Warn("backup: the partition's master is of an older release and did not wait for its replicas: the section may hold commits a failover undoes", "db", db, "partition", p, "scn", c.SCN)
			}
			if err := o.line(PartitionLine{Type: TypePartition, Partition: p, SCN: c.SCN.String()}); err != nil {
				return err
			}
		}
		for i := range c.Rows {
			b, err := d.row(ctx, db, &c.Rows[i], o)
			if err != nil {
				return err
			}
			if err := emit(b); err != nil {
				return err
			}
			rows++
		}
		for _, m := range c.Marks {
			b, err := markLine(o.buf[:0], m)
			if err != nil {
				return &badRow{fmt.Errorf("partition %s/%d: an auto-increment mark: %w", db, p, err)}
			}
			if err := emit(b); err != nil {
				return err
			}
			marks++
		}
		return nil
	})
	if err != nil {
		return scn, 0, 0, opened, err
	}
	if !opened {
		return scn, 0, 0, false, fmt.Errorf("partition %s/%d: an empty snapshot stream", db, p)
	}
	if err := o.line(PartitionEnd{Type: TypePartitionEnd, Partition: p, Rows: rows, Marks: marks, CRC32C: crc}); err != nil {
		return scn, 0, 0, true, err
	}
	if err := o.flush(); err != nil {
		return scn, 0, 0, true, &outputError{err}
	}
	return scn, rows, marks, true, nil
}

// row renders a stored row as a row line, writing its table's line first
// when the row's version is newer than those written.
func (d *Dumper) row(ctx context.Context, db string, r *storage.Row, o *output) ([]byte, error) {
	doc, err := r.Doc()
	if err != nil {
		return nil, &badRow{fmt.Errorf("table %s: a stored row: %w", r.Table, err)}
	}
	if o.written[r.Table] < doc.Version {
		t, err := d.Reg.TableAtLeast(ctx, db, r.Table, doc.Version)
		if err != nil {
			return nil, err
		}
		if err := o.table(t); err != nil {
			return nil, err
		}
	}
	parts, err := keys.Decode(r.Key)
	if err != nil {
		return nil, &badRow{fmt.Errorf("table %s: a stored key: %w", r.Table, err)}
	}
	// Table names are letters, digits and underscores: quoted alike in
	// Go and JSON.
	b := append(o.buf[:0], `{"type":"row","table":`...)
	b = strconv.AppendQuote(b, r.Table)
	b = append(b, `,"key":`...)
	b = schema.AppendKeyJSON(b, parts)
	b = append(b, `,"version":`...)
	b = strconv.AppendInt(b, int64(doc.Version), 10)
	b = append(b, `,"ts_ms":`...)
	b = strconv.AppendInt(b, doc.Modified.UnixMilli(), 10)
	b = append(b, `,"avro":"`...)
	b = base64.StdEncoding.AppendEncode(b, doc.Value)
	b = append(b, "\"}\n"...)
	o.buf = b
	return b, nil
}

// markLine renders an auto-increment mark: the collection's key with the
// largest last part ever handed out or deleted there.
func markLine(b []byte, m storage.Mark) ([]byte, error) {
	parts, err := keys.Decode(m.Key)
	if err != nil {
		return nil, err
	}
	if len(parts) < 2 || parts[0].IsInt || len(m.Value) != 8 {
		return nil, fmt.Errorf("malformed mark %x = %x", m.Key, m.Value)
	}
	last := int64(binary.BigEndian.Uint64(m.Value))
	b = append(b, `{"type":"mark","table":`...)
	b = strconv.AppendQuote(b, parts[0].Str)
	b = append(b, `,"key":`...)
	b = schema.AppendKeyJSON(b, append(parts[1:], keys.I(last)))
	return append(b, "}\n"...), nil
}

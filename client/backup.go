package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The backup format (docs/operations.md, "Backup and restore"): NDJSON
// lines, each an object whose first member is "type".
const (
	backupFormat = 1
	// restoreChunkBytes is how much of a partition's section one restore
	// request carries (a line longer than that goes alone).
	restoreChunkBytes = 4 << 20
)

// BackupOptions narrow a backup.
type BackupOptions struct {
	// Partitions backs up only these partitions (all when empty).
	Partitions []int
}

// BackupSummary is what a backup holds.
type BackupSummary struct {
	Database   string
	Partitions int
	Rows       int
	Marks      int
	Bytes      int64
	// Token is a change-stream token at every partition's SCN in the
	// backup: a stream started from it (ChangeOptions.Since) carries the
	// changes made after the backup.
	Token string
}

// Backup writes a backup of database db to w: its definition, every
// table's schema versions, and each partition's documents as written
// (Avro of the version they were written in) with its auto-increment
// marks, consistent at one SCN per partition. It checks the backup as it
// comes (each partition's row count and CRC-32C, the last line's totals)
// and fails when it is incomplete: what w holds is a backup only when
// Backup returns no error.
func (c *Client) Backup(ctx context.Context, db string, w io.Writer, o *BackupOptions) (*BackupSummary, error) {
	q := url.Values{}
	if o != nil && len(o.Partitions) > 0 {
		ps := make([]string, len(o.Partitions))
		for i, p := range o.Partitions {
			ps[i] = strconv.Itoa(p)
		}
		q.Set("partitions", strings.Join(ps, ","))
	}
	chk := &backupChecker{}
	sum := &BackupSummary{}
	err := c.t.Backup(ctx, db, q, func(line []byte) error {
		if err := chk.line(line); err != nil {
			return err
		}
		sum.Bytes += int64(len(line)) + 1
		if _, err := w.Write(line); err != nil {
			return err
		}
		_, err := w.Write([]byte{'\n'})
		return err
	})
	if err != nil {
		return nil, err
	}
	if chk.end == nil {
		return nil, fmt.Errorf("cortado: backup of %s: the stream ended before its last line (incomplete)", db)
	}
	sum.Database = chk.header.DB
	sum.Partitions, sum.Rows, sum.Marks, sum.Token = chk.end.Partitions, chk.end.Rows, chk.end.Marks, chk.end.Token
	return sum, nil
}

// Lines of the backup format.
type (
	backupHeader struct {
		Type     string          `json:"type"`
		Format   int             `json:"format"`
		DB       string          `json:"db"`
		Database json.RawMessage `json:"database"`
	}
	backupTable struct {
		Type          string          `json:"type"`
		Table         string          `json:"table"`
		Key           json.RawMessage `json:"key"`
		Compatibility string          `json:"compatibility"`
		Versions      []struct {
			Version int             `json:"version"`
			Schema  json.RawMessage `json:"schema"`
		} `json:"versions"`
	}
	backupPartition struct {
		Type      string `json:"type"`
		Partition int    `json:"partition"`
		SCN       string `json:"scn"`
		Rows      int    `json:"rows"`
		Marks     int    `json:"marks"`
		CRC32C    uint32 `json:"crc32c"`
	}
	backupEnd struct {
		Type       string `json:"type"`
		Partitions int    `json:"partitions"`
		Rows       int    `json:"rows"`
		Marks      int    `json:"marks"`
		Token      string `json:"token"`
	}
)

// section is a partition's rows and marks in a backup: where its lines
// are, and what they hold.
type section struct {
	partition   int
	start, end  int64 // byte offsets of its row and mark lines
	rows, marks int
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// backupLines reads a backup's lines: split at '\n' only (a '\r' stays
// in its line, so offsets and checksums count every byte).
func backupLines(r io.Reader) *bufio.Scanner {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxBackupLineBytes)
	sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			return i + 1, data[:i], nil
		}
		if atEOF && len(data) > 0 {
			return len(data), data, nil
		}
		return 0, nil, nil
	})
	return sc
}

// backupChecker follows a backup's lines and checks what each partition
// section and the last line say about them.
type backupChecker struct {
	header   *backupHeader
	tables   map[string]*backupTable
	end      *backupEnd
	open     *section // the section being read
	crc      uint32
	sections map[int]section // complete sections: the last of a partition counts
	offset   int64           // of the line being read
	n        int
}

// lineType is a line's "type": the backup's writer puts it first.
func lineType(line []byte) string {
	const prefix = `{"type":"`
	if rest, ok := bytes.CutPrefix(line, []byte(prefix)); ok {
		if i := bytes.IndexByte(rest, '"'); i >= 0 {
			return string(rest[:i])
		}
	}
	return ""
}

func (b *backupChecker) line(line []byte) error {
	b.n++
	defer func() { b.offset += int64(len(line)) + 1 }()
	bad := func(format string, a ...any) error {
		return fmt.Errorf("cortado: backup line %d: "+format, append([]any{b.n}, a...)...)
	}
	if b.end != nil {
		return bad("a line after the last")
	}
	typ := lineType(line)
	if b.header == nil && typ != "backup" {
		return bad("not a Cortado backup (its first line is not a backup header)")
	}
	switch typ {
	case "row", "mark":
		if b.open == nil {
			return bad("a %s outside a partition's section", typ)
		}
		b.crc = crc32.Update(b.crc, castagnoli, line)
		b.crc = crc32.Update(b.crc, castagnoli, []byte{'\n'})
		if typ == "row" {
			b.open.rows++
		} else {
			b.open.marks++
		}
		return nil
	case "error":
		var e struct {
			Error *Error `json:"error"`
		}
		if json.Unmarshal(line, &e) == nil && e.Error != nil {
			return e.Error
		}
		return bad("the server stopped the backup")
	}
	switch typ {
	case "backup":
		if b.header != nil {
			return bad("a second backup header")
		}
		var h backupHeader
		if err := json.Unmarshal(line, &h); err != nil {
			return bad("%v", err)
		}
		if h.Format != backupFormat {
			return bad("backup format %d (this client reads %d)", h.Format, backupFormat)
		}
		b.header, b.tables, b.sections = &h, map[string]*backupTable{}, map[int]section{}
	case "table":
		var t backupTable
		if err := json.Unmarshal(line, &t); err != nil {
			return bad("%v", err)
		}
		for i, v := range t.Versions {
			if v.Version != i+1 {
				return bad("table %s: versions out of order", t.Table)
			}
		}
		if len(t.Versions) == 0 {
			return bad("table %s: no versions", t.Table)
		}
		b.tables[t.Table] = &t
	case "partition", "partition_end", "partition_abort":
		var p backupPartition
		if err := json.Unmarshal(line, &p); err != nil {
			return bad("%v", err)
		}
		switch typ {
		case "partition":
			if b.open != nil {
				return bad("partition %d opens inside partition %d", p.Partition, b.open.partition)
			}
			b.open, b.crc = &section{partition: p.Partition, start: b.offset + int64(len(line)) + 1}, 0
		case "partition_abort":
			b.open = nil // taken again: what it held counts for nothing
		default:
			s := b.open
			if s == nil || s.partition != p.Partition {
				return bad("partition %d ends outside its section", p.Partition)
			}
			if s.rows != p.Rows || s.marks != p.Marks || b.crc != p.CRC32C {
				return bad("partition %d: %d rows and %d marks, CRC-32C %08x; its last line says %d, %d, %08x (damaged)",
					p.Partition, s.rows, s.marks, b.crc, p.Rows, p.Marks, p.CRC32C)
			}
			s.end = b.offset
			b.sections[p.Partition] = *s
			b.open = nil
		}
	case "end":
		var e backupEnd
		if err := json.Unmarshal(line, &e); err != nil {
			return bad("%v", err)
		}
		rows, marks := 0, 0
		for _, s := range b.sections {
			rows, marks = rows+s.rows, marks+s.marks
		}
		if b.open != nil || e.Partitions != len(b.sections) || e.Rows != rows || e.Marks != marks {
			return bad("the backup's sections hold %d partitions, %d rows and %d marks; its last line says %d, %d, %d (damaged)",
				len(b.sections), rows, marks, e.Partitions, e.Rows, e.Marks)
		}
		b.end = &e
	default:
		return bad("unknown line type %q", typ)
	}
	return nil
}

// RestoreOptions say where and how a backup is restored.
type RestoreOptions struct {
	// As names the database to restore into (default: the backed-up
	// database's name).
	As string
	// Existing writes into a database that exists already (its
	// definition must be the backup's, its tables' versions a prefix of
	// the backup's): documents of the backup replace those of the same
	// key, others stay. Without it, an existing database is an error —
	// and an interrupted restore is resumed with it.
	Existing bool
	// Replicas, when positive, replaces the backup's replica count (and
	// sets minInSync to its default for that count).
	Replicas int
	// Parallel is how many partitions are written at once (default 4).
	Parallel int
	// Progress, when set, is called after each restore request.
	Progress func(RestoreProgress)
}

// RestoreProgress counts what a restore wrote so far.
type RestoreProgress struct {
	Partitions, PartitionsDone int
	Rows, Marks                int
}

// RestoreSummary reports a finished restore.
type RestoreSummary struct {
	Database   string
	Partitions int
	Rows       int
	Marks      int
	// Retries counts restore requests sent again after a failure (an
	// overloaded router, a failover).
	Retries int
}

// Restore writes the backup in src (size bytes; a file Backup wrote)
// into a database: it reads the whole backup first and refuses an
// incomplete or damaged one before changing anything, creates the
// database with the backup's definition, registers each table's schema
// versions as the backup holds them (same numbers, same compatibility
// level), then writes every partition's documents as they were written
// (their schema versions kept) and raises the auto-increment marks to
// the backup's, so that an insert never hands out a key the backed-up
// database had handed out. Documents get new SCNs and times (their
// commits are the restore's). Requests that fail for a reason worth
// retrying (overload, failover, a broken connection) are sent again:
// writing a backup's documents twice leaves the same database.
func (c *Client) Restore(ctx context.Context, src io.ReaderAt, size int64, o *RestoreOptions) (*RestoreSummary, error) {
	if o == nil {
		o = &RestoreOptions{}
	}
	chk := &backupChecker{}
	sc := backupLines(io.NewSectionReader(src, 0, size))
	for sc.Scan() {
		if err := chk.line(sc.Bytes()); err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("cortado: reading the backup: %w", err)
	}
	if chk.end == nil {
		return nil, errors.New("cortado: the backup has no last line (incomplete): nothing was restored")
	}
	db := chk.header.DB
	if o.As != "" {
		db = o.As
	}
	if err := c.restoreSchemas(ctx, db, chk, o); err != nil {
		return nil, err
	}
	parts := make([]section, 0, len(chk.sections))
	for _, s := range chk.sections {
		parts = append(parts, s)
	}
	slices.SortFunc(parts, func(a, b section) int { return a.partition - b.partition })
	sum := &RestoreSummary{Database: db, Partitions: len(parts)}
	var mu sync.Mutex
	progress := RestoreProgress{Partitions: len(parts)}
	report := func(rows, marks, retries int, done bool) {
		mu.Lock()
		defer mu.Unlock()
		progress.Rows += rows
		progress.Marks += marks
		sum.Retries += retries
		if done {
			progress.PartitionsDone++
		}
		if o.Progress != nil {
			o.Progress(progress)
		}
	}
	parallel := o.Parallel
	if parallel <= 0 {
		parallel = 4
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan section)
	var wg sync.WaitGroup
	for range min(parallel, max(len(parts), 1)) {
		wg.Go(func() {
			for s := range work {
				if err := c.restoreSection(ctx, db, src, s, report); err != nil {
					cancel(fmt.Errorf("cortado: restoring partition %d: %w", s.partition, err))
				}
			}
		})
	}
feed:
	for _, s := range parts {
		select {
		case work <- s:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	sum.Rows, sum.Marks = progress.Rows, progress.Marks
	return sum, nil
}

// restoreSchemas creates the database and registers its tables' versions.
func (c *Client) restoreSchemas(ctx context.Context, db string, chk *backupChecker, o *RestoreOptions) error {
	if _, err := c.t.DatabaseInfo(ctx, db); err == nil && !o.Existing {
		return fmt.Errorf("cortado: database %s exists: restore into a new name (As), or into it with Existing (to resume an interrupted restore)", db)
	} else if err != nil && !errors.Is(err, ErrNoDatabase) {
		return err
	}
	var def map[string]json.RawMessage
	if err := json.Unmarshal(chk.header.Database, &def); err != nil {
		return fmt.Errorf("cortado: the backup's database definition: %w", err)
	}
	delete(def, "name")
	if o.Replicas > 0 {
		def["replicas"] = json.RawMessage(strconv.Itoa(o.Replicas))
		delete(def, "minInSync")
	}
	body, _ := json.Marshal(def)
	if err := c.t.CreateDatabase(ctx, db, body); err != nil {
		return fmt.Errorf("cortado: creating database %s: %w", db, err)
	}
	names := make([]string, 0, len(chk.tables))
	for name := range chk.tables {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if err := c.restoreTable(ctx, db, chk.tables[name]); err != nil {
			return fmt.Errorf("cortado: table %s: %w", name, err)
		}
	}
	return nil
}

// restoreTable registers a table's versions the database lacks, checking
// those it has are the backup's: with the compatibility level NONE while
// it does (each was registered under the level of its day), then the
// backup's level.
func (c *Client) restoreTable(ctx context.Context, db string, t *backupTable) error {
	have, loosened := 0, false
	if b, err := c.t.TableInfo(ctx, db, t.Table); err == nil {
		var info struct{ Latest int }
		if err := json.Unmarshal(b, &info); err != nil {
			return err
		}
		have = info.Latest
	} else if !errors.Is(err, ErrNoTable) {
		return err
	}
	if have > len(t.Versions) {
		return fmt.Errorf("the database's table has %d versions, the backup's %d", have, len(t.Versions))
	}
	for _, v := range t.Versions[:have] {
		b, err := c.t.SchemaVersion(ctx, db, t.Table, v.Version)
		if err != nil {
			return err
		}
		var got struct{ Schema json.RawMessage }
		if err := json.Unmarshal(b, &got); err != nil {
			return err
		}
		if !sameJSON(got.Schema, v.Schema) {
			return fmt.Errorf("version %d differs from the backup's", v.Version)
		}
	}
	exists := have > 0
	for _, v := range t.Versions[have:] {
		if exists && !loosened {
			if err := c.t.SetCompatibility(ctx, db, t.Table, []byte(`{"compatibility":"NONE"}`)); err != nil {
				return err
			}
			loosened = true
		}
		body, _ := json.Marshal(struct {
			Key    json.RawMessage `json:"key,omitempty"`
			Schema json.RawMessage `json:"schema"`
		}{t.Key, v.Schema})
		got, err := c.t.RegisterSchema(ctx, db, t.Table, body)
		if err != nil {
			return fmt.Errorf("registering version %d: %w", v.Version, err)
		}
		if got != v.Version {
			return fmt.Errorf("version %d of the backup was registered as %d", v.Version, got)
		}
		exists = true
	}
	level, _ := json.Marshal(map[string]string{"compatibility": t.Compatibility})
	return c.t.SetCompatibility(ctx, db, t.Table, level)
}

// sameJSON reports whether two JSON texts are equal once compacted.
func sameJSON(a, b json.RawMessage) bool {
	var ca, cb bytes.Buffer
	return json.Compact(&ca, a) == nil && json.Compact(&cb, b) == nil && bytes.Equal(ca.Bytes(), cb.Bytes())
}

// restoreSection sends a partition's row and mark lines in requests of
// about restoreChunkBytes.
func (c *Client) restoreSection(ctx context.Context, db string, src io.ReaderAt, s section, report func(rows, marks, retries int, done bool)) error {
	sc := backupLines(io.NewSectionReader(src, s.start, s.end-s.start))
	var chunk []byte
	send := func() error {
		if len(chunk) == 0 {
			return nil
		}
		n, retries, err := c.restoreChunk(ctx, db, chunk)
		if err != nil {
			return err
		}
		report(n.Rows, n.Marks, retries, false)
		chunk = chunk[:0]
		return nil
	}
	for sc.Scan() {
		line := sc.Bytes()
		if len(chunk) > 0 && len(chunk)+len(line)+1 > restoreChunkBytes {
			if err := send(); err != nil {
				return err
			}
		}
		chunk = append(append(chunk, line...), '\n')
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if err := send(); err != nil {
		return err
	}
	report(0, 0, 0, true)
	return nil
}

// restoreChunk sends one restore request, again after failures worth
// retrying, with a pause that doubles from 250 ms up to 5 s (or the
// server's Retry-After), at most 10 times.
func (c *Client) restoreChunk(ctx context.Context, db string, body []byte) (n struct{ Rows, Marks int }, retries int, err error) {
	pause := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		var res []byte
		res, err = c.t.Restore(ctx, db, body)
		if err == nil {
			err = json.Unmarshal(res, &n)
			return n, retries, err
		}
		var e *Error
		retry := !errors.As(err, &e) || e.Status == 503 || e.Status == 429 || e.Status == 408
		if !retry || attempt == 10 || ctx.Err() != nil {
			return n, retries, err
		}
		wait := pause
		if e != nil && e.RetryAfter > wait {
			wait = e.RetryAfter
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return n, retries, ctx.Err()
		}
		retries++
		pause = min(2*pause, 5*time.Second)
	}
}

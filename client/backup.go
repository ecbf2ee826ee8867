package client

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/url"
	"os"
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
	// Lines are small and many: written through a buffer, not a call
	// (a system call, for a file) each.
	bw := bufio.NewWriterSize(w, 256<<10)
	err := c.t.Backup(ctx, db, q, func(line []byte) error {
		if err := chk.line(line); err != nil {
			return err
		}
		sum.Bytes += int64(len(line)) + 1
		bw.Write(line)
		return bw.WriteByte('\n')
	})
	if err == nil {
		err = bw.Flush()
	}
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

// Restore writes the backup that open reads (a file Backup wrote; open
// is called twice, the backup read through each time) into a database:
// it reads the whole backup first and refuses an incomplete or damaged
// one before changing anything, creates the database with the backup's
// definition, registers each table's schema versions as the backup holds
// them (same numbers, same compatibility level), then writes every
// partition's documents as they were written (their schema versions
// kept) and raises the auto-increment marks to the backup's, so that an
// insert never hands out a key the backed-up database had handed out.
// Documents get new SCNs and times (their commits are the restore's).
// Requests that fail for a reason worth retrying (overload, failover, a
// broken connection) are sent again: writing a backup's documents twice
// leaves the same database.
func (c *Client) Restore(ctx context.Context, open func() (io.ReadCloser, error), o *RestoreOptions) (*RestoreSummary, error) {
	if o == nil {
		o = &RestoreOptions{}
	}
	chk := &backupChecker{}
	if err := readBackup(open, func(line []byte, _ int64) error { return chk.line(line) }); err != nil {
		return nil, err
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
	r := &restorer{c: c, db: db, o: o, sum: &RestoreSummary{Database: db, Partitions: len(chk.sections)}, parts: map[int]*partState{}}
	r.progress.Partitions = len(chk.sections)
	return r.run(ctx, open, chk.sections)
}

// BackupFile opens a backup file for Restore: as written, or
// gzip-compressed (Backup's output through gzip: recognized by its
// first bytes).
func BackupFile(path string) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		br := bufio.NewReaderSize(f, 1<<20)
		if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
			zr, err := gzip.NewReader(br)
			if err != nil {
				f.Close()
				return nil, err
			}
			return readCloser{zr, f}, nil
		}
		return readCloser{br, f}, nil
	}
}

// readCloser reads through r and closes c.
type readCloser struct {
	io.Reader
	c io.Closer
}

func (r readCloser) Close() error { return r.c.Close() }

// readBackup passes each line of the backup open reads to fn, with its
// offset.
func readBackup(open func() (io.ReadCloser, error), fn func(line []byte, offset int64) error) error {
	rc, err := open()
	if err != nil {
		return fmt.Errorf("cortado: opening the backup: %w", err)
	}
	defer rc.Close()
	sc := backupLines(rc)
	offset := int64(0)
	for sc.Scan() {
		if err := fn(sc.Bytes(), offset); err != nil {
			return err
		}
		offset += int64(len(sc.Bytes())) + 1
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("cortado: reading the backup: %w", err)
	}
	return nil
}

// restorer writes a checked backup's sections: it reads the backup once
// more, in order, and hands its sections' lines in requests of about
// restoreChunkBytes to Parallel senders (a partition's documents are
// distinct keys, and marks only rise: the order they are written in
// does not matter).
type restorer struct {
	c        *Client
	db       string
	o        *RestoreOptions
	mu       sync.Mutex
	sum      *RestoreSummary
	progress RestoreProgress
	parts    map[int]*partState
}

// partState is how far a partition's section is.
type partState struct {
	pending int  // requests sent and not yet answered
	read    bool // its section read whole (its last request sent)
}

// chunk is one restore request's lines, of one partition.
type chunk struct {
	partition int
	body      []byte
}

func (r *restorer) run(ctx context.Context, open func() (io.ReadCloser, error), sections map[int]section) (*RestoreSummary, error) {
	parts := make([]section, 0, len(sections))
	for _, s := range sections {
		parts = append(parts, s)
	}
	slices.SortFunc(parts, func(a, b section) int { return int(a.start - b.start) })
	parallel := r.o.Parallel
	if parallel <= 0 {
		parallel = 4
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan chunk, parallel)
	var wg sync.WaitGroup
	for range parallel {
		wg.Go(func() {
			for ch := range work {
				if ctx.Err() != nil {
					continue
				}
				n, retries, err := r.c.restoreChunk(ctx, r.db, ch.body)
				if err != nil {
					cancel(fmt.Errorf("cortado: restoring partition %d: %w", ch.partition, err))
					continue
				}
				r.answered(ch.partition, n.Rows, n.Marks, retries, false)
			}
		})
	}
	// Lines of the section at parts[i], gathered into cur.
	i := 0
	var cur []byte
	send := func() bool {
		if len(cur) == 0 {
			return true
		}
		r.mu.Lock()
		r.state(parts[i].partition).pending++
		r.mu.Unlock()
		select {
		case work <- chunk{partition: parts[i].partition, body: cur}:
			cur = nil
			return true
		case <-ctx.Done():
			return false
		}
	}
	finish := func() bool {
		if !send() {
			return false
		}
		r.answered(parts[i].partition, 0, 0, 0, true)
		i++
		return true
	}
	errStopped := errors.New("stopped")
	err := readBackup(open, func(line []byte, offset int64) error {
		for i < len(parts) && offset >= parts[i].end {
			if !finish() {
				return errStopped
			}
		}
		if i == len(parts) || offset < parts[i].start {
			return nil
		}
		if len(cur) > 0 && len(cur)+len(line)+1 > restoreChunkBytes && !send() {
			return errStopped
		}
		cur = append(append(cur, line...), '\n')
		return nil
	})
	close(work)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	if err != nil {
		return nil, err
	}
	rows, marks := 0, 0
	for _, s := range parts {
		rows, marks = rows+s.rows, marks+s.marks
	}
	if i < len(parts) || r.progress.Rows != rows || r.progress.Marks != marks {
		return nil, fmt.Errorf("cortado: the backup changed while it was restored: %d documents and %d marks written of the %d and %d it held when checked", r.progress.Rows, r.progress.Marks, rows, marks)
	}
	r.sum.Rows, r.sum.Marks = rows, marks
	return r.sum, nil
}

// answered counts a request's answer (read: the partition's section was
// read whole) and reports the progress: a partition is done once read
// whole and every request of it answered.
func (r *restorer) answered(part, rows, marks, retries int, read bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.progress.Rows += rows
	r.progress.Marks += marks
	r.sum.Retries += retries
	st := r.state(part)
	if read {
		st.read = true
	} else {
		st.pending--
	}
	if st.read && st.pending == 0 {
		r.progress.PartitionsDone++
		delete(r.parts, part)
	}
	if r.o.Progress != nil {
		r.o.Progress(r.progress)
	}
}

// state is a partition's state, under mu.
func (r *restorer) state(part int) *partState {
	st := r.parts[part]
	if st == nil {
		st = &partState{}
		r.parts[part] = st
	}
	return st
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

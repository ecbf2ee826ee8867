// Package registry owns the schema registry: database definitions and the
// versioned schemas of every table, kept in etcd and mirrored in memory by a
// watch so that every router and storage node sees the same versions.
//
// Versions are immutable and numbered from 1 without gaps; a version is
// only written after schema.CheckLevel accepted it against the earlier
// ones under the table's compatibility level, and the write is an etcd transaction that fails if another
// registrar took the number first. A database's definition changes only
// in its replicas, retention and minInSync, which only rises and counts
// in failovers once the controller settles it (AlterDatabase,
// SettleInSync); nothing is ever deleted.
//
// What it holds is bounded (Limits): creating databases, tables and
// versions is input like any other, and must never grow every process
// without bound.
package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cortado-db/cortado/internal/coord"
	"github.com/cortado-db/cortado/internal/schema"
)

// Errors the API maps to statuses.
var (
	ErrNoDatabase     = errors.New("no such database")
	ErrNoTable        = errors.New("no such table")
	ErrNoVersion      = errors.New("no such schema version")
	ErrDatabaseExists = errors.New("database exists with another definition")
	ErrKeyChanged     = errors.New("a table's key cannot change")
	// ErrFixed is a change of a database setting that cannot change
	// once the database exists (AlterDatabase).
	ErrFixed = errors.New("database setting refused")
	// ErrContention means other registrars kept taking the next version
	// number; the caller may retry.
	ErrContention = errors.New("schema registration contended; retry")
	// ErrSchemaTooLarge is a schema text over MaxSchemaBytes.
	ErrSchemaTooLarge = fmt.Errorf("a schema is limited to %d bytes", MaxSchemaBytes)
	// ErrLimit is a database, table or schema version the registry
	// refuses because it holds the most it takes (Limits).
	ErrLimit = errors.New("registry limit reached")
)

// Limits are what the registry holds at most, so that no client can grow
// every process without bound: each database's partitions are opened on
// the storage nodes and placed by the controller, and every router and
// node keeps each table's schema versions in memory, parsed. They are
// checked where a database is created or a version registered;
// concurrent registrars may each pass a limit once. A zero field takes
// its default.
type Limits struct {
	// Partitions bounds the partitions of all databases together
	// (default 262,144: 4,096 databases of the default 64).
	Partitions int
	// Tables bounds a database's tables (default 1,024).
	Tables int
	// Versions bounds a table's schema versions (default 1,024).
	Versions int
	// SchemaTextBytes bounds the text of all schema versions of all
	// tables together (default 16 MiB). Every router and storage node
	// holds them parsed, at 12 to 35 times the text in the heap: 7 KB
	// for a version of a 600-byte schema of eight fields, 1.78 GB for
	// 199 versions of 256 KiB of optional union fields, 51 MB of text
	// (docs/operations.md, Limits).
	SchemaTextBytes int
}

// Defaults of Limits.
const (
	DefaultMaxPartitions      = 1 << 18
	DefaultMaxTables          = 1024
	DefaultMaxVersions        = 1024
	DefaultMaxSchemaTextBytes = 16 << 20
)

func (l *Limits) fill() {
	if l.Partitions <= 0 {
		l.Partitions = DefaultMaxPartitions
	}
	if l.Tables <= 0 {
		l.Tables = DefaultMaxTables
	}
	if l.Versions <= 0 {
		l.Versions = DefaultMaxVersions
	}
	if l.SchemaTextBytes <= 0 {
		l.SchemaTextBytes = DefaultMaxSchemaTextBytes
	}
}

// Options configure a Registry.
type Options struct {
	// Prefix is the cluster's etcd key prefix (server.Options.Prefix)
	// and Logger where bad entries are reported; both are required.
	Prefix string
	Logger *slog.Logger
	// Limits: a zero field takes its default.
	Limits Limits
}

// MaxSchemaBytes bounds a schema version's text (each version is one etcd
// value, and etcd refuses requests over 1.5 MiB).
const MaxSchemaBytes = 256 << 10

// maxRegisterAttempts bounds the compare-and-swap loop of RegisterVersion.
// Every failed attempt means another registrar succeeded, so the loop only
// runs out under sustained concurrent registration of one table.
const maxRegisterAttempts = 64

// InvalidError wraps a definition or schema the registry refuses as
// malformed (400).
type InvalidError struct{ Err error }

func (e *InvalidError) Error() string { return e.Err.Error() }
func (e *InvalidError) Unwrap() error { return e.Err }

// IncompatibleError is returned for a schema version that does not evolve
// from the previous one (409). Field names the offending field.
type IncompatibleError struct {
	Table   string
	Version int
	*schema.FieldError
}

func (e *IncompatibleError) Error() string {
	return fmt.Sprintf("table %s: version %d refused: %s", e.Table, e.Version, e.FieldError.Error())
}

// Registry is the etcd-backed schema registry with an in-memory mirror.
type Registry struct {
	cli    *clientv3.Client
	prefix string
	log    *slog.Logger

	mu     sync.RWMutex
	dbs    map[string]*schema.Database
	tables map[string]map[string]*schema.Table
	// compat holds each table's compatibility level by "db/table" (its
	// etcd key may load before the table's versions).
	compat map[string]schema.Compatibility
	limits Limits
	// textBytes is the text of every version in the mirror.
	textBytes int
	// revs is the etcd revision of the entries the mirror holds that
	// change (databases' definitions, tables' configs), by key: the
	// watch may pass on an older value after a write of this process
	// applied a newer one.
	revs map[string]int64

	cancel context.CancelFunc
	done   chan struct{}
}

type storedVersion struct {
	Key    []schema.KeyPart `json:"key"`
	Schema string           `json:"schema"`
}

// Open loads the registry under o.Prefix and keeps it in sync with a
// watch until Close.
func Open(ctx context.Context, cli *clientv3.Client, o Options) (*Registry, error) {
	o.Limits.fill()
	r := &Registry{
		cli: cli, prefix: strings.TrimSuffix(o.Prefix, "/") + "/schemata/", log: o.Logger,
		dbs: map[string]*schema.Database{}, tables: map[string]map[string]*schema.Table{},
		compat: map[string]schema.Compatibility{}, revs: map[string]int64{},
		done:   make(chan struct{}),
		limits: o.Limits,
	}
	wctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	w := coord.Watch(wctx, cli, r.prefix)
	// The first change lists everything: the mirror is loaded before
	// Open returns.
	select {
	case c := <-w.Changes():
		for _, kv := range c.KVs {
			if err := r.apply(string(kv.Key), kv.Value, kv.ModRevision); err != nil {
				cancel()
				<-w.Done()
				return nil, fmt.Errorf("load schema registry: %s: %w", kv.Key, err)
			}
		}
	case <-ctx.Done():
		cancel()
		<-w.Done()
		return nil, fmt.Errorf("load schema registry: %w", ctx.Err())
	}
	go r.follow(w)
	return r, nil
}

// Close stops the watch.
func (r *Registry) Close() {
	r.cancel()
	<-r.done
}

// follow applies the registry's changes until the watcher stops. Entries
// are only ever added (a new version, database or config) or changed (a
// database's definition, a table's config), never deleted, so a Reset
// applies every entry again.
func (r *Registry) follow(w *coord.Watcher) {
	defer close(r.done)
	w.Each(func(c coord.Change) {
		for _, kv := range c.Puts() {
			r.applyLogged(kv.Key, kv.Value, kv.ModRevision)
		}
	})
}

func (r *Registry) applyLogged(key, value []byte, rev int64) {
	if err := r.apply(string(key), value, rev); err != nil {
		r.log.Error("schema registry: bad entry", "key", string(key), "err", err)
	}
}

// apply adds one etcd entry, written at revision rev, to the mirror. It
// is idempotent, and keeps a newer value of an entry that changes.
func (r *Registry) apply(key string, value []byte, rev int64) error {
	rest := strings.TrimPrefix(key, r.prefix)
	parts := strings.Split(rest, "/")
	if len(parts) == 4 && parts[0] == "table" {
		return r.applyVersion(parts[1], parts[2], parts[3], value)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if rev < r.revs[key] {
		return nil
	}
	switch {
	case len(parts) == 3 && parts[0] == "config":
		var c tableConfig
		if err := json.Unmarshal(value, &c); err != nil {
			return err
		}
		db, name := parts[1], parts[2]
		r.revs[key] = rev
		r.compat[db+"/"+name] = c.Compatibility
		if t := r.tables[db][name]; t != nil {
			nt := *t
			nt.Compatibility = c.Compatibility
			r.tables[db][name] = &nt
		}
	case len(parts) == 2 && parts[0] == "db":
		var d schema.Database
		if err := json.Unmarshal(value, &d); err != nil {
			return err
		}
		if d.Name != parts[1] {
			return fmt.Errorf("the definition names database %s", schema.ShowName(d.Name))
		}
		r.revs[key] = rev
		r.dbs[d.Name] = &d
		if r.tables[d.Name] == nil {
			r.tables[d.Name] = map[string]*schema.Table{}
		}
	}
	return nil
}

// applyVersion adds a table's schema version to the mirror, parsed
// before the lock is taken: parsing takes up to tens of milliseconds
// (60 ms for 256 KiB of union fields), and every document read and
// write looks its table up under that lock.
func (r *Registry) applyVersion(db, name, number string, value []byte) error {
	n, err := strconv.Atoi(number)
	if err != nil {
		return err
	}
	if t, _ := r.Table(db, name); t != nil && n <= len(t.Versions) {
		return nil // already known
	}
	var sv storedVersion
	if err := json.Unmarshal(value, &sv); err != nil {
		return err
	}
	v, err := schema.LoadVersion(n, sv.Schema)
	if err != nil {
		return err
	}
	r.install(db, name, sv.Key, v)
	return nil
}

// install adds version v of a table to the mirror, unless it holds it
// (or v does not follow the versions it holds: the load sorts keys).
func (r *Registry) install(db, name string, key []schema.KeyPart, v *schema.Version) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.tables[db] == nil {
		r.tables[db] = map[string]*schema.Table{}
	}
	t := r.tables[db][name]
	if t == nil {
		t = &schema.Table{Database: db, Name: name, Key: key}
	}
	if v.Number != len(t.Versions)+1 {
		return
	}
	// Tables are replaced, never mutated, so readers holding the old
	// *Table keep a consistent view.
	nt := &schema.Table{Database: db, Name: name, Key: t.Key, Versions: append(t.Versions[:len(t.Versions):len(t.Versions)], v),
		Compatibility: r.compat[db+"/"+name]}
	r.tables[db][name] = nt
	r.textBytes += len(v.Text)
}

func (r *Registry) dbKey(name string) string { return r.prefix + "db/" + name }

func (r *Registry) configKey(db, table string) string { return r.prefix + "config/" + db + "/" + table }

// tableConfig is a table's settings apart from its versions.
type tableConfig struct {
	Compatibility schema.Compatibility `json:"compatibility"`
}

// SetCompatibility sets the level a table's next versions must meet.
func (r *Registry) SetCompatibility(ctx context.Context, db, table string, c schema.Compatibility) error {
	if !c.Valid() || c == "" {
		return &InvalidError{fmt.Errorf("compatibility %q is not one of %v", c, schema.Levels)}
	}
	if _, err := r.TableAtLeast(ctx, db, table, 1); err != nil {
		return err
	}
	val, _ := json.Marshal(tableConfig{Compatibility: c})
	k := r.configKey(db, table)
	resp, err := r.cli.Put(ctx, k, string(val))
	if err != nil {
		return fmt.Errorf("set compatibility of %s.%s: %w", db, table, err)
	}
	return r.apply(k, val, resp.Header.Revision)
}

func (r *Registry) versionKey(db, table string, n int) string {
	return fmt.Sprintf("%stable/%s/%s/%08d", r.prefix, db, table, n)
}

// CreateDatabase creates a database. Creating one that exists with the same
// definition is not an error (created is false); another definition is
// ErrDatabaseExists.
func (r *Registry) CreateDatabase(ctx context.Context, d schema.Database) (db *schema.Database, created bool, err error) {
	d.FailoverInSync = 0 // a new database has no raise under way
	if err := d.Normalize(); err != nil {
		return nil, false, &InvalidError{err}
	}
	val, _ := json.Marshal(d)
	key := r.dbKey(d.Name)
	if err := r.reload(ctx, r.prefix+"db/", clientv3.WithPrefix()); err != nil {
		return nil, false, err
	}
	if total := r.partitions(d.Name); total+d.Partitions > r.limits.Partitions {
		if existing, err := r.Database(d.Name); err == nil && sameDatabase(existing, &d) {
			return existing, false, nil // a repeated creation is still answered
		}
		return nil, false, fmt.Errorf("database %s of %d partitions: the databases hold %d of at most %d: %w", d.Name, d.Partitions, total, r.limits.Partitions, ErrLimit)
	}
	resp, err := r.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(val))).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return nil, false, fmt.Errorf("create database %s: %w", d.Name, err)
	}
	if !resp.Succeeded {
		var existing schema.Database
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 1 && json.Unmarshal(kvs[0].Value, &existing) == nil && sameDatabase(&existing, &d) {
			return &existing, false, nil
		}
		return &existing, false, fmt.Errorf("database %s: %w", d.Name, ErrDatabaseExists)
	}
	if err := r.apply(key, val, resp.Header.Revision); err != nil {
		return nil, false, err
	}
	return &d, true, nil
}

// maxAlterAttempts bounds AlterDatabase's compare-and-swap loop: each
// failed attempt means another alteration of the database came first.
const maxAlterAttempts = 16

// AlterDatabase changes database name's definition to what change makes
// of a copy of it (with the defaults of what it leaves out filled in
// again). Only the replicas, the retention and minInSync may change,
// minInSync only upwards (a raise is settled later: SettleInSync): another
// change is ErrFixed, since the partitions, their key ranges and the
// replication are what every copy was placed and every write replicated
// by. A definition left as it was is not
// written. The write is an etcd transaction on the definition's
// revision, tried again when another alteration came first.
func (r *Registry) AlterDatabase(ctx context.Context, name string, change func(*schema.Database) error) (*schema.Database, error) {
	if !schema.ValidName(name) {
		return nil, fmt.Errorf("database %s: %w", schema.ShowName(name), ErrNoDatabase)
	}
	for range maxAlterAttempts {
		d, err := r.swapDatabase(ctx, name, func(cur, next *schema.Database) (bool, error) {
			if err := change(next); err != nil {
				return false, err
			}
			next.Name = name
			if next.MinInSync == 0 { // a definition of before the setting, or the setting left out
				next.MinInSync = cur.InSync()
			}
			if next.Replicas > 0 && next.Replicas < cur.InSync() && next.MinInSync == cur.InSync() {
				return false, &InvalidError{fmt.Errorf("replicas %d is fewer than the database's minInSync (%d), which can be raised but not lowered: every write would be refused", next.Replicas, cur.InSync())}
			}
			// A raise of minInSync counts in failovers only once the
			// controller has seen the writes of before it held by as
			// many replicas (SettleInSync); until then they count by the
			// least minInSync of before.
			next.FailoverInSync = cur.FailoverInSync
			if next.MinInSync > cur.InSync() {
				next.FailoverInSync = cur.FailoverQuorum()
			}
			if err := next.Normalize(); err != nil {
				return false, &InvalidError{err}
			}
			if err := fixedUnchanged(cur, next); err != nil {
				return false, fmt.Errorf("database %s: %w", name, err)
			}
			return !sameDatabase(cur, next), nil
		})
		if !errors.Is(err, errOvertaken) {
			return d, err
		}
	}
	return nil, fmt.Errorf("alter database %s: %w", name, ErrContention)
}

// errOvertaken is swapDatabase's: another write of the definition came
// between its read and its write.
var errOvertaken = errors.New("the definition changed meanwhile")

// swapDatabase reads database name's stored definition and has change
// make the next one of a copy of it; when change says so, it writes the
// copy if the definition is still as read (a transaction on its etcd
// revision; errOvertaken if not). It returns the definition in force,
// and has the mirror hold it.
func (r *Registry) swapDatabase(ctx context.Context, name string, change func(cur, next *schema.Database) (write bool, err error)) (*schema.Database, error) {
	key := r.dbKey(name)
	resp, err := r.cli.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("read database %s: %w", name, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("database %s: %w", name, ErrNoDatabase)
	}
	kv := resp.Kvs[0]
	var cur, next schema.Database
	if err := json.Unmarshal(kv.Value, &cur); err != nil {
		return nil, fmt.Errorf("database %s: stored definition: %w", name, err)
	}
	json.Unmarshal(kv.Value, &next) // a copy that shares nothing with cur
	write, err := change(&cur, &next)
	if err != nil {
		return nil, err
	}
	if !write {
		return &cur, r.apply(key, kv.Value, kv.ModRevision)
	}
	val, _ := json.Marshal(next)
	tresp, err := r.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).
		Then(clientv3.OpPut(key, string(val))).Commit()
	if err != nil {
		return nil, fmt.Errorf("write database %s: %w", name, err)
	}
	if !tresp.Succeeded {
		return nil, errOvertaken
	}
	return &next, r.apply(key, val, tresp.Header.Revision)
}

// fixedUnchanged reports a setting next changes that AlterDatabase may
// not (ErrFixed).
func fixedUnchanged(cur, next *schema.Database) error {
	cb, _ := json.Marshal(cur.Boundaries)
	nb, _ := json.Marshal(next.Boundaries)
	for _, f := range []struct {
		name     string
		cur, new any
	}{
		{"partitioning", cur.Partitioning, next.Partitioning},
		{"partitions", cur.Partitions, next.Partitions},
		{"boundaries", string(cb), string(nb)},
		{"replication", cur.Replication, next.Replication},
	} {
		if f.cur != f.new {
			return fmt.Errorf("%w: %s is fixed once the database exists (it is %v, asked: %v)", ErrFixed, f.name, f.cur, f.new)
		}
	}
	if next.InSync() < cur.InSync() {
		// Masters and the controller's failovers each count by their own
		// mirror of the registry: for a while after a change one would
		// count by the lower value and the other by the higher, and a
		// failover could choose a replica lacking an acknowledged write.
		return fmt.Errorf("%w: minInSync can be raised, not lowered (it is %d, asked: %d)", ErrFixed, cur.InSync(), next.InSync())
	}
	return nil
}

// SettleInSync ends a raise of database name's minInSync to k: failovers
// count replicas' answers by k from now on (schema.Database.FailoverInSync
// cleared). The controller calls it once every partition's writes of
// before the raise are held by k replicas. A definition whose minInSync
// is no longer k, or with no raise under way, is left as it is.
func (r *Registry) SettleInSync(ctx context.Context, name string, k int) error {
	_, err := r.swapDatabase(ctx, name, func(_, d *schema.Database) (bool, error) {
		if d.InSync() != k || d.FailoverInSync == 0 {
			return false, nil
		}
		d.FailoverInSync = 0
		return true, nil
	})
	if errors.Is(err, errOvertaken) {
		return fmt.Errorf("settle minInSync of %s: %w", name, ErrContention)
	}
	return err
}

// partitions is how many partitions the databases other than except
// hold, as the mirror has them.
func (r *Registry) partitions(except string) int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	n := 0
	for name, d := range r.dbs {
		if name != except {
			n += d.Partitions
		}
	}
	return n
}

// schemaTextBytes is the text of every version the mirror holds.
func (r *Registry) schemaTextBytes() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.textBytes
}

// tableCount is how many tables database db has, as the mirror has them.
func (r *Registry) tableCount(db string) int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.tables[db])
}

// sameDatabase reports whether two normalized definitions are equal.
func sameDatabase(a, b *schema.Database) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}

// Database returns a database definition.
func (r *Registry) Database(name string) (*schema.Database, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	d, ok := r.dbs[name]
	if !ok {
		return nil, fmt.Errorf("database %s: %w", schema.ShowName(name), ErrNoDatabase)
	}
	return d, nil
}

// DatabaseFresh is Database, but on a miss it reads etcd before giving
// up: a database just created through another process may not have
// reached this one's mirror yet.
func (r *Registry) DatabaseFresh(ctx context.Context, name string) (*schema.Database, error) {
	if d, err := r.Database(name); err == nil || !schema.ValidName(name) {
		return d, err
	}
	if err := r.reload(ctx, r.dbKey(name)); err != nil {
		return nil, err
	}
	return r.Database(name)
}

// Databases lists all databases by name.
func (r *Registry) Databases() []*schema.Database {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]*schema.Database, 0, len(r.dbs))
	for _, d := range r.dbs {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Table returns a table with all its versions.
func (r *Registry) Table(db, name string) (*schema.Table, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if _, ok := r.dbs[db]; !ok {
		return nil, fmt.Errorf("database %s: %w", schema.ShowName(db), ErrNoDatabase)
	}
	t, ok := r.tables[db][name]
	if !ok {
		return nil, fmt.Errorf("table %s.%s: %w", db, schema.ShowName(name), ErrNoTable)
	}
	return t, nil
}

// TableAtLeast returns a table that has at least version, reading etcd
// when the mirror has not caught up yet (a document written through
// another router with a version this process has not seen).
func (r *Registry) TableAtLeast(ctx context.Context, db, name string, version int) (*schema.Table, error) {
	if t, err := r.Table(db, name); err == nil && len(t.Versions) >= version {
		return t, nil
	} else if !schema.ValidName(db) || !schema.ValidName(name) {
		return nil, err // no such name can be registered: etcd holds none
	}
	if err := r.reload(ctx, r.dbKey(db)); err != nil {
		return nil, err
	}
	if err := r.reloadTable(ctx, db, name); err != nil {
		return nil, err
	}
	t, err := r.Table(db, name)
	if err != nil {
		return nil, err
	}
	if len(t.Versions) < version {
		return nil, fmt.Errorf("table %s.%s version %d: %w", db, name, version, ErrNoVersion)
	}
	return t, nil
}

// Tables lists a database's tables by name.
func (r *Registry) Tables(db string) []*schema.Table {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]*schema.Table, 0, len(r.tables[db]))
	for _, t := range r.tables[db] {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// RegisterVersion registers text as the next schema version of a table,
// creating the table (with key) at version 1. key may be nil after version
// 1; when given it must equal the table's key. Registering the same text
// as the latest version returns that version with created false.
func (r *Registry) RegisterVersion(ctx context.Context, db, table string, key []schema.KeyPart, text string) (version int, created bool, err error) {
	// Decide from etcd, not from the mirror: another registrar may have
	// created the database or table a moment ago.
	if err := r.reload(ctx, r.dbKey(db)); err != nil {
		return 0, false, err
	}
	d, err := r.Database(db)
	if err != nil {
		return 0, false, err
	}
	if !schema.ValidName(table) {
		return 0, false, &InvalidError{fmt.Errorf("table name %s must be a letter followed by at most 127 letters, digits or _", schema.ShowName(table))}
	}
	for range maxRegisterAttempts {
		if err := r.reloadTable(ctx, db, table); err != nil {
			return 0, false, err
		}
		t, _ := r.Table(db, table)
		next := 1
		if t != nil {
			next = len(t.Versions) + 1
			if key != nil && !schema.SameKey(key, t.Key) {
				return 0, false, fmt.Errorf("table %s: %w", table, ErrKeyChanged)
			}
			key = t.Key
			if t.Latest().Text == text {
				return t.Latest().Number, false, nil
			}
			if len(t.Versions) >= r.limits.Versions {
				return 0, false, fmt.Errorf("table %s holds %d schema versions, the most it takes: %w", table, len(t.Versions), ErrLimit)
			}
		} else if n := r.tableCount(db); n >= r.limits.Tables {
			return 0, false, fmt.Errorf("table %s: database %s holds %d tables, the most it takes: %w", table, db, n, ErrLimit)
		} else if err := schema.ValidateKey(key); err != nil {
			return 0, false, &InvalidError{fmt.Errorf("table %s: %w", table, err)}
		} else if err := d.CheckPartitionKey(key[0]); err != nil {
			return 0, false, &InvalidError{fmt.Errorf("table %s: %w", table, err)}
		}
		if len(text) > MaxSchemaBytes {
			return 0, false, fmt.Errorf("table %s: a schema of %d bytes: %w", table, len(text), ErrSchemaTooLarge)
		}
		if held := r.schemaTextBytes(); held+len(text) > r.limits.SchemaTextBytes {
			return 0, false, fmt.Errorf("table %s: a schema of %d bytes, where the registry holds %d of at most %d: %w", table, len(text), held, r.limits.SchemaTextBytes, ErrLimit)
		}
		v, err := schema.NewVersion(next, text)
		if err != nil {
			return 0, false, &InvalidError{fmt.Errorf("table %s: %w", table, err)}
		}
		if t != nil {
			if err := schema.CheckLevel(t.Compatibility, t.Versions, v); err != nil {
				return 0, false, &IncompatibleError{Table: table, Version: next, FieldError: err.(*schema.FieldError)}
			}
		}
		val, _ := json.Marshal(storedVersion{Key: key, Schema: text})
		k := r.versionKey(db, table, next)
		resp, err := r.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
			Then(clientv3.OpPut(k, string(val))).Commit()
		if err != nil {
			return 0, false, fmt.Errorf("register %s.%s version %d: %w", db, table, next, err)
		}
		if resp.Succeeded {
			// What the watch will bring, parsed once already.
			r.install(db, table, key, v)
			return next, true, nil
		}
		// Someone registered this number first; the next attempt
		// reloads and re-checks against their version.
	}
	return 0, false, fmt.Errorf("register %s.%s: %w", db, table, ErrContention)
}

func (r *Registry) reloadTable(ctx context.Context, db, table string) error {
	return r.reload(ctx, fmt.Sprintf("%stable/%s/%s/", r.prefix, db, table), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
}

// reload reads keys from etcd (linearizably) into the mirror.
func (r *Registry) reload(ctx context.Context, key string, opts ...clientv3.OpOption) error {
	resp, err := r.cli.Get(ctx, key, opts...)
	if err != nil {
		return fmt.Errorf("read schema registry: %w", err)
	}
	for _, kv := range resp.Kvs {
		if err := r.apply(string(kv.Key), kv.Value, kv.ModRevision); err != nil {
			return err
		}
	}
	return nil
}

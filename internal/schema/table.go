package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hamba/avro/v2"

	"github.com/cortado-db/cortado/internal/keys"
)

// Database is a database definition: the unit of partitioning.
type Database struct {
	Name string `json:"name"`
	// Partitioning is "hash" (default) or "range".
	Partitioning string `json:"partitioning"`
	// Partitions is the number of partitions (default 64; for range
	// partitioning, one more than the boundaries).
	Partitions int `json:"partitions"`
	// Boundaries, for range partitioning, are the partition keys at which
	// partitions 1, 2, … begin, ascending: partition i holds the keys k
	// with Boundaries[i-1] ≤ k < Boundaries[i]. All strings or all
	// integers; every table's partition key must be of that kind.
	Boundaries []json.RawMessage `json:"boundaries,omitempty"`
	// Replicas is the number of copies of each partition (default 1 on
	// one node; used by the cluster manager).
	Replicas int `json:"replicas"`
	// Replication is "semi-sync" (default) or "async".
	Replication string `json:"replication"`
	// MinInSync is, under semi-sync replication, how many replicas
	// (the master included) must durably hold a write before it is
	// acknowledged; with fewer live replicas writes are refused (503).
	// Default: 2 when there are two or more replicas, else 1.
	MinInSync int `json:"minInSync"`
	// FailoverInSync, while set, is the smaller minInSync the database
	// had before it was raised (registry.AlterDatabase): a failover goes
	// on counting replicas' answers by it until the controller has seen
	// every partition's writes of before the raise held by MinInSync
	// replicas, and then clears it. Set only by the registry.
	FailoverInSync int `json:"failoverInSync,omitempty"`
	// Retention bounds each partition's commit log.
	Retention Retention `json:"retention"`
}

// Retention bounds a database's commit logs. Commits are trimmed once they
// are older than MaxAge or while a partition's log is over MaxBytes — but
// never past what is acknowledged, nor what a live slave has not applied
// unless it is more than MaxSlaveLag behind (it is then rebuilt from a
// snapshot). A change-stream consumer behind the retained log gets a
// snapshot, then the changes after it. Durations are Go durations.
type Retention struct {
	MaxAge      string `json:"maxAge,omitempty"`      // default "24h"; "0s": no limit by age
	MaxBytes    int64  `json:"maxBytes,omitempty"`    // default 1 GiB per partition; -1: no limit by size
	MaxSlaveLag string `json:"maxSlaveLag,omitempty"` // default "1h"
}

// Retention defaults.
const (
	DefaultRetainAge      = 24 * time.Hour
	DefaultRetainBytes    = 1 << 30
	DefaultMaxSlaveLag    = time.Hour
	minRetentionDuration  = time.Second
	minRetentionByteLimit = 1 << 10
)

// Limits returns the retention with defaults filled in: the age (0: no
// limit), the size (0: no limit), and the slave lag past which a slave
// stops pinning the log.
func (r Retention) Limits() (age time.Duration, size int64, slaveLag time.Duration) {
	age, size, slaveLag = DefaultRetainAge, DefaultRetainBytes, DefaultMaxSlaveLag
	if d, err := time.ParseDuration(r.MaxAge); err == nil {
		age = d
	}
	switch {
	case r.MaxBytes < 0:
		size = 0
	case r.MaxBytes > 0:
		size = r.MaxBytes
	}
	if d, err := time.ParseDuration(r.MaxSlaveLag); err == nil {
		slaveLag = d
	}
	return age, size, slaveLag
}

func (r *Retention) normalize() error {
	for name, v := range map[string]*string{"maxAge": &r.MaxAge, "maxSlaveLag": &r.MaxSlaveLag} {
		if *v == "" {
			continue
		}
		d, err := time.ParseDuration(*v)
		if err != nil {
			return fmt.Errorf("retention.%s %q is not a duration (like \"24h\")", name, *v)
		}
		if d < 0 || (d > 0 && d < minRetentionDuration) || (d == 0 && name == "maxSlaveLag") {
			return fmt.Errorf("retention.%s %q must be at least %s", name, *v, minRetentionDuration)
		}
		*v = d.String()
	}
	if r.MaxBytes < -1 || (r.MaxBytes > 0 && r.MaxBytes < minRetentionByteLimit) {
		return fmt.Errorf("retention.maxBytes must be -1 (no limit) or at least %d, got %d", minRetentionByteLimit, r.MaxBytes)
	}
	return nil
}

// InSync is MinInSync with its default filled in (for definitions
// stored before the setting existed).
func (d *Database) InSync() int {
	if d.MinInSync > 0 {
		return d.MinInSync
	}
	return min(2, max(d.Replicas, 1))
}

// FailoverQuorum is the minInSync a failover counts replicas' answers by:
// FailoverInSync while a raise of minInSync is under way, else InSync.
func (d *Database) FailoverQuorum() int {
	if d.FailoverInSync > 0 {
		return min(d.FailoverInSync, d.InSync())
	}
	return d.InSync()
}

// KeyPart is one part of a table's primary key. The first part of every
// table is the partition key.
type KeyPart struct {
	Name          string    `json:"name"`
	Type          keys.Type `json:"type"`
	AutoIncrement bool      `json:"autoIncrement,omitempty"`
}

var namePattern = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]{0,127}$`)

// ValidName reports whether s may name a database, table or key part.
func ValidName(s string) bool { return namePattern.MatchString(s) }

// ShowName is s for a message: as it is when it is a valid name, else
// quoted and cut to a few dozen bytes — a name from a request that names
// nothing must not make an error as long as the request (or, its invalid
// UTF-8 replaced, three times as long).
func ShowName(s string) string {
	if ValidName(s) {
		return s
	}
	if len(s) > 40 {
		return strconv.Quote(s[:37]) + "…"
	}
	return strconv.Quote(s)
}

// Normalize fills defaults and checks a database definition.
func (d *Database) Normalize() error {
	if !ValidName(d.Name) {
		return fmt.Errorf("database name %s must match %s", ShowName(d.Name), namePattern)
	}
	if d.Partitioning == "" {
		d.Partitioning = "hash"
	}
	switch d.Partitioning {
	case "hash":
		if len(d.Boundaries) > 0 {
			return fmt.Errorf("boundaries are for range partitioning; this database is hash-partitioned")
		}
		if d.Partitions == 0 {
			d.Partitions = 64
		}
	case "range":
		bounds, err := d.boundaries()
		if err != nil {
			return err
		}
		if len(bounds) == 0 {
			return fmt.Errorf("range partitioning needs boundaries (the partition keys where partitions 1, 2, … begin)")
		}
		for i := 1; i < len(bounds); i++ {
			if bounds[i-1].IsInt != bounds[i].IsInt {
				return fmt.Errorf("boundaries must be all strings or all integers")
			}
			if bytes.Compare(keys.AppendPart(nil, bounds[i-1]), keys.AppendPart(nil, bounds[i])) >= 0 {
				return fmt.Errorf("boundaries must ascend strictly: %s then %s", d.Boundaries[i-1], d.Boundaries[i])
			}
		}
		if d.Partitions != 0 && d.Partitions != len(bounds)+1 {
			return fmt.Errorf("%d boundaries make %d partitions, not %d", len(bounds), len(bounds)+1, d.Partitions)
		}
		d.Partitions = len(bounds) + 1
		for i, b := range bounds { // one spelling, so equal definitions compare equal
			if b.IsInt {
				d.Boundaries[i] = json.RawMessage(strconv.FormatInt(b.Int, 10))
			} else {
				d.Boundaries[i], _ = json.Marshal(b.Str)
			}
		}
	default:
		return fmt.Errorf("partitioning %q is not supported (use hash or range)", d.Partitioning)
	}
	if d.Partitions < 1 || d.Partitions > 4096 {
		return fmt.Errorf("partitions must be between 1 and 4096, got %d", d.Partitions)
	}
	if d.Replicas == 0 {
		d.Replicas = 1
	}
	if d.Replicas < 1 || d.Replicas > 7 {
		return fmt.Errorf("replicas must be between 1 and 7, got %d", d.Replicas)
	}
	if d.Replication == "" {
		d.Replication = "semi-sync"
	}
	if d.Replication != "semi-sync" && d.Replication != "async" {
		return fmt.Errorf("replication must be semi-sync or async, got %q", d.Replication)
	}
	if d.MinInSync == 0 {
		d.MinInSync = min(2, d.Replicas)
	}
	if d.MinInSync < 1 || d.MinInSync > d.Replicas {
		return fmt.Errorf("minInSync must be between 1 and replicas (%d), got %d", d.Replicas, d.MinInSync)
	}
	if d.FailoverInSync < 0 || d.FailoverInSync >= d.MinInSync {
		d.FailoverInSync = 0
	}
	return d.Retention.normalize()
}

// ValidateKey checks a table's key definition.
func ValidateKey(key []KeyPart) error {
	if len(key) == 0 {
		return fmt.Errorf("a table needs at least one key part")
	}
	if len(key) > 8 {
		return fmt.Errorf("a table has at most 8 key parts, got %d", len(key))
	}
	seen := map[string]bool{}
	for i := range key {
		k := &key[i]
		if !ValidName(k.Name) {
			return fmt.Errorf("key part name %s must match %s", ShowName(k.Name), namePattern)
		}
		if seen[k.Name] {
			return fmt.Errorf("key part %s appears twice", k.Name)
		}
		seen[k.Name] = true
		if k.Type == "" {
			k.Type = keys.String
		}
		if k.Type != keys.String && k.Type != keys.Long && k.Type != keys.Int {
			return fmt.Errorf("key part %s: type must be string, long or int, got %q", k.Name, k.Type)
		}
		if k.AutoIncrement {
			if i != len(key)-1 || i == 0 {
				return fmt.Errorf("key part %s: only the last key part of a key with two or more parts may auto-increment", k.Name)
			}
			if k.Type == keys.String {
				return fmt.Errorf("key part %s: an auto-increment key part must be long or int", k.Name)
			}
		}
	}
	return nil
}

// Version is one registered document schema version of a table.
type Version struct {
	Number int
	// Text is the schema exactly as registered; plan caches key on it
	// because canonical forms drop defaults.
	Text   string
	Schema avro.Schema
	JSON   *JSONWriter
	// Indexes are the fields this version annotates with "index":
	// documents written with this version are indexed by them.
	Indexes []Index
}

// NewVersion parses a version's schema text for registration, with every
// check a new version must pass. The top level must be a record.
func NewVersion(number int, text string) (*Version, error) {
	s, err := Parse(text)
	if err != nil {
		return nil, err
	}
	if s.Type() != avro.Record {
		return nil, fmt.Errorf("a document schema must be a record, got %s", s.Type())
	}
	if err := checkFinite(s); err != nil {
		return nil, err
	}
	if err := checkRawDefaults(text, s); err != nil {
		return nil, err
	}
	if err := checkDefaults(s, ""); err != nil {
		return nil, err
	}
	ix, err := indexes(s)
	if err != nil {
		return nil, err
	}
	return &Version{Number: number, Text: text, Schema: s, JSON: NewJSONWriter(s), Indexes: ix}, nil
}

// LoadVersion parses a version that was registered already (read back
// from the registry): the checks added to registration since it was
// stored must not keep a node from loading what the cluster holds.
func LoadVersion(number int, text string) (*Version, error) {
	s, err := avro.ParseWithCache(text, "", &avro.SchemaCache{})
	if err != nil {
		return nil, fmt.Errorf("parse avro schema: %w", err)
	}
	// Annotations were checked at registration.
	ix, _ := indexes(s)
	return &Version{Number: number, Text: text, Schema: s, JSON: NewJSONWriter(s), Indexes: ix}, nil
}

// checkDefaults makes sure every default encodes, so that resolution never
// fails at read time on a bad default.
func checkDefaults(s avro.Schema, path string) error {
	return eachField(s, path, func(f *avro.Field, p string) error {
		if f.HasDefault() {
			if _, err := encodeDefault(f); err != nil {
				return fieldErr(p, "default does not match the field type: %v", err)
			}
		}
		return nil
	})
}

// eachField calls fn with every field of every record in s (named records
// once: it ends on recursive types), with its dot path, until fn fails.
func eachField(s avro.Schema, path string, fn func(f *avro.Field, path string) error) error {
	seen := map[string]bool{}
	var walk func(s avro.Schema, path string) error
	walk = func(s avro.Schema, path string) error {
		switch s := deref(s).(type) {
		case *avro.RecordSchema:
			if seen[s.FullName()] {
				return nil
			}
			seen[s.FullName()] = true
			for _, f := range s.Fields() {
				p := join(path, f.Name())
				if err := fn(f, p); err != nil {
					return err
				}
				if err := walk(f.Type(), p); err != nil {
					return err
				}
			}
		case *avro.ArraySchema:
			return walk(s.Items(), path)
		case *avro.MapSchema:
			return walk(s.Values(), path)
		case *avro.UnionSchema:
			for _, b := range s.Types() {
				if err := walk(b, path); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(s, path)
}

// Table is a table definition with all its schema versions.
type Table struct {
	Database string
	Name     string
	Key      []KeyPart
	Versions []*Version // Versions[i].Number == i+1
	// Compatibility is the level a new version must meet ("" is FULL).
	Compatibility Compatibility
}

// Latest returns the newest version.
func (t *Table) Latest() *Version { return t.Versions[len(t.Versions)-1] }

// Version returns version n, or nil.
func (t *Table) Version(n int) *Version {
	if n < 1 || n > len(t.Versions) {
		return nil
	}
	return t.Versions[n-1]
}

// ParseKey parses key parts from their text form. It accepts a prefix of
// the key (a collection); more parts than the key has is an error.
func (t *Table) ParseKey(texts []string) ([]keys.Part, error) {
	if len(texts) > len(t.Key) {
		return nil, fmt.Errorf("table %s has %d key parts (%s), got %d", t.Name, len(t.Key), t.keyNames(), len(texts))
	}
	parts := make([]keys.Part, len(texts))
	size := 0
	for i, s := range texts {
		p, err := keys.Parse(t.Key[i].Type, s)
		if err != nil {
			return nil, fmt.Errorf("key part %s: %w", t.Key[i].Name, err)
		}
		parts[i] = p
		size += len(s)
	}
	if size > keys.MaxKeyBytes {
		return nil, fmt.Errorf("a key of %d bytes is over the limit of %d", size, keys.MaxKeyBytes)
	}
	return parts, nil
}

func (t *Table) keyNames() string {
	names := make([]string, len(t.Key))
	for i, k := range t.Key {
		names[i] = k.Name
	}
	return strings.Join(names, ", ")
}

// AutoIncrement reports whether the table's last key part auto-increments.
func (t *Table) AutoIncrement() bool { return t.Key[len(t.Key)-1].AutoIncrement }

// KeyJSON renders key parts as a JSON array of strings and numbers.
func KeyJSON(parts []keys.Part) json.RawMessage { return AppendKeyJSON(nil, parts) }

// AppendKeyJSON appends KeyJSON(parts) to b.
func AppendKeyJSON(b []byte, parts []keys.Part) []byte {
	b = append(b, '[')
	for i, p := range parts {
		if i > 0 {
			b = append(b, ',')
		}
		if p.IsInt {
			b = strconv.AppendInt(b, p.Int, 10)
		} else {
			b = appendJSONString(b, p.Str)
		}
	}
	return append(b, ']')
}

// KeyTexts turns a key given as JSON values (decoded with UseNumber:
// strings and json.Numbers) into the text form ParseKey reads, the
// inverse of AppendKeyJSON.
func KeyTexts(parts []any) ([]string, error) {
	texts := make([]string, len(parts))
	for i, k := range parts {
		switch v := k.(type) {
		case string:
			texts[i] = v
		case json.Number:
			texts[i] = v.String()
		default:
			return nil, fmt.Errorf("key parts must be strings or integers")
		}
	}
	return texts, nil
}

// SameKey reports whether two key definitions are identical.
func SameKey(a, b []KeyPart) bool { return slices.Equal(a, b) }

// PartitionOf returns the partition that holds the document group of
// partition key pk. It is the one partitioning function of the system, so
// every role computes the same answer: for hash partitioning, FNV-1a of
// the key part's order-preserving encoding modulo the number of
// partitions; for range partitioning, the number of boundaries at or
// below the key (in the same encoding's order).
func (d *Database) PartitionOf(pk keys.Part) int {
	if d.Partitioning == "range" {
		return d.rangePartition(keys.AppendPart(nil, pk))
	}
	var buf [64]byte // most keys' encodings fit: no allocation
	enc := keys.AppendPart(buf[:0], pk)
	// FNV-1a (hash/fnv's New32a, written out: the interface made enc
	// and the hash escape to the heap on every call).
	h := uint32(2166136261)
	for _, c := range enc {
		h = (h ^ uint32(c)) * 16777619
	}
	return int(h % uint32(d.Partitions))
}

// rangePartition is PartitionOf for range partitioning, of the key's
// encoding enc.
func (d *Database) rangePartition(enc []byte) int {
	bounds, _ := d.boundaries() // checked when the database was created
	n, _ := slices.BinarySearchFunc(bounds, enc, func(b keys.Part, k []byte) int {
		return bytes.Compare(keys.AppendPart(nil, b), k)
	})
	if n < len(bounds) && bytes.Equal(keys.AppendPart(nil, bounds[n]), enc) {
		n++ // a boundary begins its own partition
	}
	return n
}

// boundaries parses the range boundaries.
func (d *Database) boundaries() ([]keys.Part, error) {
	out := make([]keys.Part, len(d.Boundaries))
	for i, raw := range d.Boundaries {
		var v any
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("boundary %d: %w", i, err)
		}
		switch v := v.(type) {
		case string:
			out[i] = keys.S(v)
		case json.Number:
			n, err := v.Int64()
			if err != nil {
				return nil, fmt.Errorf("boundary %d: %s is not an integer", i, v)
			}
			out[i] = keys.I(n)
		default:
			return nil, fmt.Errorf("boundary %d: %s is neither a string nor an integer", i, raw)
		}
	}
	return out, nil
}

// CheckPartitionKey says whether a table whose first key part is pk may
// live in this database: under range partitioning its type must be of the
// boundaries' kind.
func (d *Database) CheckPartitionKey(pk KeyPart) error {
	if d.Partitioning != "range" {
		return nil
	}
	bounds, err := d.boundaries()
	if err != nil || len(bounds) == 0 {
		return err
	}
	isInt := pk.Type == keys.Long || pk.Type == keys.Int
	if isInt != bounds[0].IsInt {
		kind := "string"
		if bounds[0].IsInt {
			kind = "integer"
		}
		return fmt.Errorf("partition key %s is %s but database %s is range-partitioned on %s boundaries", pk.Name, keyTypeName(pk.Type), d.Name, kind)
	}
	return nil
}

func keyTypeName(t keys.Type) string {
	if t == "" {
		return string(keys.String)
	}
	return string(t)
}

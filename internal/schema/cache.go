package schema

import (
	"strings"
	"sync"

	"github.com/hamba/avro/v2"
)

// Reader is a compiled way to read a table's stored documents: the reader
// schema (a version, or a projection of one) with its JSON writer.
type Reader struct {
	Schema avro.Schema
	JSON   *JSONWriter
}

// Plans caches projections and resolution plans. Keys are built from
// immutable registered versions (database, table, version numbers) and
// projection paths, never from canonical schema text. It holds at most
// limit entries of each kind and is safe for concurrent use; one entry is
// shared by all goroutines.
type Plans struct {
	mu      sync.RWMutex
	readers map[planKey]*Reader
	plans   map[planKey]*Plan
	limit   int
}

// planKey names a reader (writer 0) or a plan. A struct, not a string
// built per lookup: every document read looks one up.
type planKey struct {
	db, table      string
	reader, writer int
	fields         string
}

// NewPlans returns an empty cache holding at most limit entries of each kind.
func NewPlans(limit int) *Plans {
	return &Plans{readers: map[planKey]*Reader{}, plans: map[planKey]*Plan{}, limit: limit}
}

// readerKey is the key of version of t projected to fields (paths hold
// no commas; one field, or none, joins without allocating).
func readerKey(t *Table, version int, fields []string) planKey {
	return planKey{db: t.Database, table: t.Name, reader: version, fields: strings.Join(fields, ",")}
}

// Reader returns the reader for version of t projected to fields (all
// fields when none are given).
func (c *Plans) Reader(t *Table, version int, fields []string) (*Reader, error) {
	key := readerKey(t, version, fields)
	c.mu.RLock()
	r, ok := c.readers[key]
	c.mu.RUnlock()
	if ok {
		return r, nil
	}
	v := t.Version(version)
	if len(fields) == 0 {
		r = &Reader{Schema: v.Schema, JSON: v.JSON}
	} else {
		s, err := Project(v.Schema, fields)
		if err != nil {
			return nil, err
		}
		r = &Reader{Schema: s, JSON: NewJSONWriter(s)}
	}
	c.mu.Lock()
	if len(c.readers) >= c.limit {
		clear(c.readers)
	}
	c.readers[key] = r
	c.mu.Unlock()
	return r, nil
}

// Plan returns the plan reading documents of writer version w of t as
// version r projected to fields.
func (c *Plans) Plan(t *Table, w, r int, fields []string) (*Plan, error) {
	key := readerKey(t, r, fields)
	key.writer = w
	c.mu.RLock()
	p, ok := c.plans[key]
	c.mu.RUnlock()
	if ok {
		return p, nil
	}
	rd, err := c.Reader(t, r, fields)
	if err != nil {
		return nil, err
	}
	p, err = NewPlan(t.Version(w).Schema, rd.Schema)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if len(c.plans) >= c.limit {
		clear(c.plans)
	}
	c.plans[key] = p
	c.mu.Unlock()
	return p, nil
}

package client

import (
	"context"
	"fmt"
	"sync"

	"github.com/cortado-db/cortado/internal/schema"
)

// ReadAs reads a document as written (Avro, no server-side conversion) and
// converts it in this process with the same resolution plans the server
// uses: up-conversion to o.Version (default: the latest) and projection to
// o.Fields, written as JSON. Schema versions it has not seen are fetched
// from the registry once and cached. The result equals Get's.
func (c *Client) ReadAs(ctx context.Context, db, table string, key Key, o *ReadOptions) (*Document, error) {
	raw, err := c.GetAvro(ctx, db, table, key, &ReadOptions{Conditions: condOf(o)})
	if err != nil {
		return raw, err
	}
	want := 0
	var fields []string
	if o != nil {
		want, fields = o.Version, o.Fields
	}
	t, err := c.local.table(ctx, c, db, table, max(want, raw.SchemaVersion))
	if err != nil {
		return nil, err
	}
	if want == 0 {
		want = t.Latest().Number
	}
	plan, err := c.local.plans.Plan(t, raw.SchemaVersion, want, fields)
	if err != nil {
		return nil, fmt.Errorf("cortado: read %s.%s as version %d: %w", db, table, want, err)
	}
	body, err := plan.Apply(nil, raw.Body)
	if err != nil {
		return nil, fmt.Errorf("cortado: read %s.%s as version %d: %w", db, table, want, err)
	}
	rd, err := c.local.plans.Reader(t, want, fields)
	if err != nil {
		return nil, err
	}
	if raw.Body, err = rd.JSON.Append(nil, body); err != nil {
		return nil, err
	}
	raw.ETag = schema.WithSuffix(schema.WithSuffix(raw.ETag, schema.VersionSuffix(raw.SchemaVersion, want)), schema.ProjectionSuffix(fields))
	raw.SchemaVersion = want
	return raw, nil
}

func condOf(o *ReadOptions) Conditions {
	if o == nil {
		return Conditions{}
	}
	return o.Conditions
}

// localSchemas caches the schema versions a client has fetched, and the
// plans built from them.
type localSchemas struct {
	mu     sync.Mutex
	tables map[string]*schema.Table
	plans  *schema.Plans
}

func newLocalSchemas() *localSchemas {
	return &localSchemas{tables: map[string]*schema.Table{}, plans: schema.NewPlans(1024)}
}

// table returns db.table with at least versions 1..atLeast (0: the
// latest), fetching what is missing.
func (l *localSchemas) table(ctx context.Context, c *Client, db, name string, atLeast int) (*schema.Table, error) {
	key := db + "\x00" + name
	l.mu.Lock()
	t := l.tables[key]
	l.mu.Unlock()
	if t != nil && atLeast > 0 && len(t.Versions) >= atLeast {
		return t, nil
	}
	info, err := c.Table(ctx, db, name)
	if err != nil {
		return nil, err
	}
	nt := &schema.Table{Database: db, Name: name}
	if t != nil {
		nt.Versions = t.Versions
	}
	for v := len(nt.Versions) + 1; v <= info.Latest; v++ {
		text, err := c.Schema(ctx, db, name, v)
		if err != nil {
			return nil, err
		}
		ver, err := schema.NewVersion(v, string(text))
		if err != nil {
			return nil, fmt.Errorf("cortado: %s.%s version %d: %w", db, name, v, err)
		}
		nt.Versions = append(nt.Versions[:len(nt.Versions):len(nt.Versions)], ver)
	}
	if len(nt.Versions) < atLeast {
		return nil, fmt.Errorf("cortado: %s.%s has no version %d", db, name, atLeast)
	}
	l.mu.Lock()
	l.tables[key] = nt
	l.mu.Unlock()
	return nt, nil
}

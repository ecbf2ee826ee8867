package router

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/schema"
)

// A page of databases (GET /_schemata) holds DefaultDatabasesPage unless
// its limit asks for fewer or more, and at most MaxDatabasesPage.
const (
	DefaultDatabasesPage = 1000
	MaxDatabasesPage     = 10000
)

// Databases is a page of the databases' definitions (without their
// tables: DatabaseInfo has them), in name order, from the first named
// after after, at most limit (DefaultDatabasesPage if 0 or less); its
// next names the last one when more follow.
func (r *Router) Databases(after string, limit int) []byte {
	if limit <= 0 {
		limit = DefaultDatabasesPage
	}
	limit = min(limit, MaxDatabasesPage)
	all := r.reg.Databases()
	i := sort.Search(len(all), func(i int) bool { return all[i].Name > after })
	out := struct {
		Databases []*schema.Database `json:"databases"`
		Next      string             `json:"next,omitempty"`
	}{Databases: all[i:min(len(all), i+limit)]}
	if i+limit < len(all) {
		out.Next = out.Databases[len(out.Databases)-1].Name
	}
	b, _ := json.Marshal(out)
	return b
}

// CreateDatabase creates database name from a JSON definition
// ({"partitions":64,"replicas":1,"replication":"semi-sync"}; all optional).
// It returns the stored definition and whether it was created now.
func (r *Router) CreateDatabase(ctx context.Context, name string, body []byte) ([]byte, bool, error) {
	var d schema.Database
	if len(bytes.TrimSpace(body)) > 0 {
		if err := schema.DecodeInto(body, &d, "database definition"); err != nil {
			return nil, false, err
		}
		// An explicit 0 is a mistake, not a request for the default.
		var explicit map[string]json.RawMessage
		json.Unmarshal(body, &explicit)
		for _, f := range []string{"partitions", "replicas", "minInSync"} {
			if v, ok := explicit[f]; ok && string(bytes.TrimSpace(v)) == "0" {
				return nil, false, &registry.InvalidError{Err: fmt.Errorf("%s must be at least 1 (leave it out for the default)", f)}
			}
		}
		// So is a size limit of 0 bytes, which would read as "keep
		// nothing" and was taken for the default of 1 GiB.
		var retention map[string]json.RawMessage
		if json.Unmarshal(explicit["retention"], &retention) == nil {
			if v, ok := retention["maxBytes"]; ok && string(bytes.TrimSpace(v)) == "0" {
				return nil, false, &registry.InvalidError{Err: fmt.Errorf("retention.maxBytes must be -1 (no limit) or at least 1024 (leave it out for the default)")}
			}
		}
	}
	if err := r.fitsNodes(ctx, max(d.Replicas, 1)); err != nil {
		return nil, false, err
	}
	if d.Name != "" && d.Name != name {
		return nil, false, &schema.FieldError{Path: "name", Reason: fmt.Sprintf("body names database %q but the path names %q", d.Name, name)}
	}
	d.Name = name
	stored, created, err := r.reg.CreateDatabase(ctx, d)
	if err != nil {
		return nil, false, err
	}
	if a, ok := r.backend.(awaiter); ok {
		// In a cluster, answer once the partitions have masters, so the
		// first write does not meet a 503. If none come (no storage
		// node is up yet), the database exists all the same.
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		a.AwaitDatabase(actx, name)
		cancel()
	}
	out, _ := json.Marshal(stored)
	return out, created, nil
}

// AlterDatabase changes database name's definition by a JSON merge patch
// (RFC 7396) of it: {"replicas":3}, {"retention":{"maxAge":"72h"}}, a
// member null for its default ({"retention":{"maxBytes":null}}). Only
// the replicas, the retention and minInSync (upwards, once every node
// and controller speaks protocol 8) may change (registry.AlterDatabase);
// the other members may be given with their current values, so a
// definition as read, changed and sent back is a patch too. It returns
// the stored definition. In a cluster the controller then adds or drops
// replicas as it does when nodes come and go.
func (r *Router) AlterDatabase(ctx context.Context, name string, body []byte) ([]byte, error) {
	if _, err := schema.DecodeJSON(body); err != nil {
		return nil, err
	}
	var patch map[string]json.RawMessage
	if err := json.Unmarshal(body, &patch); err != nil || patch == nil {
		return nil, &schema.FieldError{Reason: "a database's change is a JSON object of the settings to change, like {\"replicas\":3}"}
	}
	if raw, ok := patch["name"]; ok {
		var named string
		if json.Unmarshal(raw, &named) != nil || named != name {
			return nil, &schema.FieldError{Path: "name", Reason: fmt.Sprintf("body names database %s but the path names %q (a database cannot be renamed)", bytes.TrimSpace(raw), name)}
		}
	}
	for f, v := range patch {
		v = bytes.TrimSpace(v)
		switch {
		case f == "retention":
		case string(v) == "null":
			return nil, &registry.InvalidError{Err: fmt.Errorf("%s cannot be unset (give its new value)", f)}
		case string(v) == "0" && (f == "partitions" || f == "replicas" || f == "minInSync"):
			return nil, &registry.InvalidError{Err: fmt.Errorf("%s must be at least 1", f)}
		}
	}
	// What a definition as read (GET /_schemata/{db}), sent back, holds
	// besides its settings: the tables, and what the controller sets and
	// clears.
	delete(patch, "tables")
	delete(patch, "failoverInSync")
	if raw, ok := patch["minInSync"]; ok {
		var want int
		d, err := r.reg.Database(name)
		if err != nil || (json.Unmarshal(raw, &want) == nil && want > d.InSync()) {
			if err := r.raisable(ctx); err != nil {
				return nil, err
			}
		}
	}
	if raw, ok := patch["replicas"]; ok {
		var want int
		if json.Unmarshal(raw, &want) == nil {
			if err := r.fitsNodes(ctx, want); err != nil {
				return nil, err
			}
		}
	}
	d, err := r.reg.AlterDatabase(ctx, name, func(d *schema.Database) error {
		cur, _ := json.Marshal(d)
		var merged map[string]json.RawMessage
		json.Unmarshal(cur, &merged)
		for f, v := range patch {
			if f != "retention" {
				merged[f] = v
				continue
			}
			if string(bytes.TrimSpace(v)) == "null" {
				delete(merged, f)
				continue
			}
			var old, change map[string]json.RawMessage
			json.Unmarshal(merged[f], &old)
			if err := json.Unmarshal(v, &change); err != nil || change == nil {
				return &schema.FieldError{Path: "retention", Reason: "retention is an object, like {\"maxAge\":\"72h\"}"}
			}
			if old == nil {
				old = map[string]json.RawMessage{}
			}
			for k, cv := range change {
				switch cv := bytes.TrimSpace(cv); {
				case string(cv) == "null":
					delete(old, k)
				case k == "maxBytes" && string(cv) == "0":
					return &registry.InvalidError{Err: fmt.Errorf("retention.maxBytes must be -1 (no limit) or at least 1024 (null for the default)")}
				default:
					old[k] = cv
				}
			}
			merged[f], _ = json.Marshal(old)
		}
		b, _ := json.Marshal(merged)
		*d = schema.Database{}
		return schema.DecodeInto(b, d, "database definition")
	})
	if err != nil {
		return nil, err
	}
	out, _ := json.Marshal(d)
	return out, nil
}

// raisable refuses a raise of minInSync while a storage node or a
// controller of protocol 7 or older is registered: such a node would
// not report the minInSync it counts by, nor such a controller go on
// counting failovers by the old value until the raise is settled.
func (r *Router) raisable(ctx context.Context) error {
	l, ok := r.backend.(protocolLister)
	if !ok {
		return nil
	}
	oldest, who, err := l.OldestProtocol(ctx)
	if err != nil {
		return err
	}
	if who != "" && oldest < raiseProtocol {
		return fmt.Errorf("%w: minInSync can be raised once every storage node and controller speaks protocol %d or later; %s speaks %d (0: a release that does not say)", registry.ErrFixed, raiseProtocol, who, oldest)
	}
	return nil
}

// raiseProtocol is the first protocol version whose nodes report the
// minInSync they count by and whose controllers settle a raise.
const raiseProtocol = 8

// protocolLister is a Backend that knows the oldest protocol the cluster's
// storage nodes and controllers speak.
type protocolLister interface {
	OldestProtocol(ctx context.Context) (uint32, string, error)
}

// fitsNodes refuses replicas beyond the storage nodes there are, when the
// backend knows how many (no two replicas of a partition share a node).
func (r *Router) fitsNodes(ctx context.Context, replicas int) error {
	c, ok := r.backend.(nodeCounter)
	if !ok {
		return nil
	}
	if n, err := c.StorageNodes(ctx); err == nil && replicas > n {
		return &registry.InvalidError{Err: fmt.Errorf("replicas %d is more than the %d storage node(s) available: no two replicas of a partition share a node", replicas, n)}
	}
	return nil
}

// nodeCounter is a Backend that knows how many storage nodes there are.
type nodeCounter interface {
	StorageNodes(ctx context.Context) (int, error)
}

// awaiter is a Backend that can tell when a new database's partitions are
// ready for writes.
type awaiter interface {
	AwaitDatabase(ctx context.Context, db string) error
}

type tableSummary struct {
	Name          string               `json:"name"`
	Key           []schema.KeyPart     `json:"key"`
	Latest        int                  `json:"latest"`
	Versions      []int                `json:"versions"`
	Compatibility schema.Compatibility `json:"compatibility"`
}

func summarize(t *schema.Table) tableSummary {
	s := tableSummary{Name: t.Name, Key: t.Key, Latest: t.Latest().Number, Compatibility: t.Compatibility.Or()}
	for _, v := range t.Versions {
		s.Versions = append(s.Versions, v.Number)
	}
	return s
}

// DatabaseInfo returns a database definition with its tables.
func (r *Router) DatabaseInfo(name string) ([]byte, error) {
	d, err := r.reg.Database(name)
	if err != nil {
		return nil, err
	}
	tables := []tableSummary{}
	for _, t := range r.reg.Tables(name) {
		tables = append(tables, summarize(t))
	}
	return json.Marshal(struct {
		*schema.Database
		Tables []tableSummary `json:"tables"`
	}{d, tables})
}

// RegisterSchema registers a table's next schema version from
// {"key":[{"name":"id","type":"string"}…], "schema": <Avro schema>}. The key
// is required for version 1 and may be left out after.
func (r *Router) RegisterSchema(ctx context.Context, db, table string, body []byte) ([]byte, bool, error) {
	var req struct {
		Key    []schema.KeyPart `json:"key"`
		Schema json.RawMessage  `json:"schema"`
	}
	if err := schema.DecodeInto(body, &req, "table definition"); err != nil {
		return nil, false, err
	}
	if len(req.Schema) == 0 {
		return nil, false, &schema.FieldError{Path: "schema", Reason: "a table definition needs an Avro schema"}
	}
	var text bytes.Buffer
	if err := json.Compact(&text, req.Schema); err != nil {
		return nil, false, &schema.FieldError{Path: "schema", Reason: err.Error()}
	}
	v, created, err := r.reg.RegisterVersion(ctx, db, table, req.Key, text.String())
	if err != nil {
		return nil, false, err
	}
	out, _ := json.Marshal(map[string]int{"version": v})
	return out, created, nil
}

// SetCompatibility sets a table's compatibility level from
// {"compatibility":"BACKWARD"} and returns the table's summary.
func (r *Router) SetCompatibility(ctx context.Context, db, table string, body []byte) ([]byte, error) {
	var req struct {
		Compatibility schema.Compatibility `json:"compatibility"`
	}
	if err := schema.DecodeInto(body, &req, "table config"); err != nil {
		return nil, err
	}
	if err := r.reg.SetCompatibility(ctx, db, table, req.Compatibility); err != nil {
		return nil, err
	}
	return r.TableInfo(db, table)
}

// TableInfo returns a table's key and versions.
func (r *Router) TableInfo(db, table string) ([]byte, error) {
	t, err := r.reg.Table(db, table)
	if err != nil {
		return nil, err
	}
	return json.Marshal(summarize(t))
}

// SchemaVersion returns one version of a table's schema.
func (r *Router) SchemaVersion(db, table string, version int) ([]byte, error) {
	t, err := r.reg.Table(db, table)
	if err != nil {
		return nil, err
	}
	v := t.Version(version)
	if v == nil {
		return nil, fmt.Errorf("table %s version %d: %w", table, version, registry.ErrNoVersion)
	}
	return json.Marshal(struct {
		Version int              `json:"version"`
		Key     []schema.KeyPart `json:"key"`
		Schema  json.RawMessage  `json:"schema"`
	}{v.Number, t.Key, json.RawMessage(v.Text)})
}

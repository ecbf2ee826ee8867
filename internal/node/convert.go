package node

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/storage"
	"github.com/cortado-db/cortado/internal/wire"
)

// Conversions between the node's requests and results and the protocol's
// messages (package wire). Document bytes are carried as they are; keys
// in their storage encoding, decoded (and so checked) on arrival.

func scnTo(s storage.SCN) *wire.SCN { return &wire.SCN{Gen: s.Gen, Seq: s.Seq} }

func scnFrom(s *wire.SCN) storage.SCN { return storage.SCN{Gen: s.GetGen(), Seq: s.GetSeq()} }

func timeTo(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func timeFrom(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

func keyFrom(b []byte) ([]keys.Part, error) {
	if len(b) == 0 {
		return nil, nil
	}
	k, err := keys.Decode(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errBadRequest, err)
	}
	return k, nil
}

func condTo(c Preconditions) *wire.Preconditions {
	return &wire.Preconditions{IfMatch: c.IfMatch, IfNoneMatch: c.IfNoneMatch,
		IfModifiedSince: timeTo(c.IfModifiedSince), IfUnmodifiedSince: timeTo(c.IfUnmodifiedSince)}
}

func condFrom(c *wire.Preconditions) Preconditions {
	return Preconditions{IfMatch: c.GetIfMatch(), IfNoneMatch: c.GetIfNoneMatch(),
		IfModifiedSince: timeFrom(c.GetIfModifiedSince()), IfUnmodifiedSince: timeFrom(c.GetIfUnmodifiedSince())}
}

func readTo(r ReadSpec) *wire.ReadSpec {
	return &wire.ReadSpec{Version: int32(r.Version), Fields: r.Fields}
}

func readFrom(r *wire.ReadSpec) ReadSpec {
	return ReadSpec{Version: int(r.GetVersion()), Fields: r.GetFields()}
}

func itemTo(it *Item) *wire.Item {
	if it == nil {
		return nil
	}
	return &wire.Item{Key: keys.Encode(it.Key), Scn: scnTo(it.SCN), Modified: timeTo(it.Modified), Etag: it.ETag,
		Body: it.Body, BodyVersion: int32(it.BodyVersion), StaleNanos: int64(it.Stale), Position: it.Position}
}

func itemFrom(w *wire.Item) (*Item, error) {
	if w == nil {
		return nil, nil
	}
	k, err := keyFrom(w.Key)
	if err != nil {
		return nil, err
	}
	return &Item{Key: k, SCN: scnFrom(w.Scn), Modified: timeFrom(w.Modified), ETag: w.Etag,
		Body: w.Body, BodyVersion: int(w.BodyVersion), Stale: time.Duration(w.StaleNanos), Position: w.Position}, nil
}

func itemsTo(items []*Item) []*wire.Item {
	out := make([]*wire.Item, len(items))
	for i, it := range items {
		out[i] = itemTo(it)
	}
	return out
}

func itemsFrom(ws []*wire.Item) ([]*Item, error) {
	out := make([]*Item, len(ws))
	for i, w := range ws {
		var err error
		if out[i], err = itemFrom(w); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func getTo(r GetRequest) *wire.GetRequest {
	return &wire.GetRequest{Db: r.DB, Table: r.Table, Partition: int32(r.Partition), Key: keys.Encode(r.Key),
		Read: readTo(r.Read), Cond: condTo(r.Cond), MaxStaleNanos: int64(r.MaxStale)}
}

func getFrom(w *wire.GetRequest) (GetRequest, error) {
	k, err := keyFrom(w.Key)
	return GetRequest{DB: w.Db, Table: w.Table, Partition: int(w.Partition), Key: k,
		Read: readFrom(w.Read), Cond: condFrom(w.Cond), MaxStale: time.Duration(w.MaxStaleNanos)}, err
}

func multiGetTo(r MultiGetRequest) *wire.MultiGetRequest {
	ks := make([][]byte, len(r.Keys))
	for i, k := range r.Keys {
		ks[i] = keys.Encode(k)
	}
	return &wire.MultiGetRequest{Db: r.DB, Table: r.Table, Partition: int32(r.Partition), Keys: ks, Read: readTo(r.Read), MaxBytes: int64(r.MaxBytes), MaxStaleNanos: int64(r.MaxStale)}
}

func multiGetFrom(w *wire.MultiGetRequest) (MultiGetRequest, error) {
	r := MultiGetRequest{DB: w.Db, Table: w.Table, Partition: int(w.Partition), Read: readFrom(w.Read), Keys: make([][]keys.Part, len(w.Keys)),
		MaxBytes: bytesFrom(w.MaxBytes, MaxReadBytes), MaxStale: time.Duration(w.MaxStaleNanos)}
	for i, b := range w.Keys {
		var err error
		if r.Keys[i], err = keyFrom(b); err != nil {
			return r, err
		}
	}
	return r, nil
}

func scanTo(r ScanRequest) *wire.ScanRequest {
	return &wire.ScanRequest{Db: r.DB, Table: r.Table, Partition: int32(r.Partition), Prefix: keys.Encode(r.Prefix),
		After: r.After, Limit: int32(r.Limit), Read: readTo(r.Read), Query: r.Query, Sort: r.Sort, MaxBytes: int64(r.MaxBytes), MaxStaleNanos: int64(r.MaxStale)}
}

func scanFrom(w *wire.ScanRequest) (ScanRequest, error) {
	k, err := keyFrom(w.Prefix)
	return ScanRequest{DB: w.Db, Table: w.Table, Partition: int(w.Partition), Prefix: k, After: w.After,
		Limit: int(w.Limit), Read: readFrom(w.Read), Query: w.Query, Sort: w.Sort, MaxBytes: bytesFrom(w.MaxBytes, MaxReadBytes), MaxStale: time.Duration(w.MaxStaleNanos)}, err
}

func writeTo(r WriteRequest) (*wire.WriteRequest, error) {
	w := &wire.WriteRequest{Db: r.DB, Partition: int32(r.Partition), Ops: make([]*wire.Op, len(r.Ops))}
	for i, op := range r.Ops {
		o := &wire.Op{Kind: string(op.Kind), Table: op.Table, Key: keys.Encode(op.Key), Version: int32(op.Version),
			Value: op.Value, Cond: condTo(op.Cond)}
		if op.Patch != nil {
			b, err := json.Marshal(op.Patch)
			if err != nil {
				return nil, err
			}
			o.Patch = b
		}
		w.Ops[i] = o
	}
	return w, nil
}

func writeFrom(w *wire.WriteRequest) (WriteRequest, error) {
	r := WriteRequest{DB: w.Db, Partition: int(w.Partition), Ops: make([]Op, len(w.Ops))}
	for i, o := range w.Ops {
		k, err := keyFrom(o.Key)
		if err != nil {
			return r, err
		}
		op := Op{Kind: OpKind(o.Kind), Table: o.Table, Key: k, Version: int(o.Version), Value: o.Value, Cond: condFrom(o.Cond)}
		if len(o.Patch) > 0 {
			dec := json.NewDecoder(bytes.NewReader(o.Patch))
			dec.UseNumber()
			op.Patch = new(Patch)
			if err := dec.Decode(op.Patch); err != nil {
				return r, fmt.Errorf("%w: operation %d: patch: %v", errBadRequest, i, err)
			}
		}
		r.Ops[i] = op
	}
	return r, nil
}

func writeResultTo(r *WriteResult) *wire.WriteResult {
	w := &wire.WriteResult{Scn: scnTo(r.SCN), Results: make([]*wire.OpResult, len(r.Results))}
	for i, o := range r.Results {
		w.Results[i] = &wire.OpResult{Key: keys.Encode(o.Key), Created: o.Created, Etag: o.ETag, Modified: timeTo(o.Modified), Deleted: int32(o.Deleted)}
	}
	return w
}

func writeResultFrom(w *wire.WriteResult) (*WriteResult, error) {
	r := &WriteResult{SCN: scnFrom(w.Scn), Results: make([]OpResult, len(w.Results))}
	for i, o := range w.Results {
		k, err := keyFrom(o.Key)
		if err != nil {
			return nil, err
		}
		r.Results[i] = OpResult{Key: k, Created: o.Created, ETag: o.Etag, Modified: timeFrom(o.Modified), Deleted: int(o.Deleted)}
	}
	return r, nil
}

func logTo(r LogRequest) *wire.LogRequest {
	return &wire.LogRequest{Db: r.DB, Partition: int32(r.Partition), After: scnTo(r.After), Max: int32(r.Max),
		WaitNanos: int64(r.Wait), Ack: r.Ack, Replica: r.Replica, BufferOnly: r.BufferOnly, MaxBytes: int64(r.MaxBytes),
		AckedOnly: r.AckedOnly, WatchAcked: r.WatchAcked, AckedSeen: scnTo(r.AckedSeen)}
}

func logFrom(w *wire.LogRequest) LogRequest {
	return LogRequest{DB: w.Db, Partition: int(w.Partition), After: scnFrom(w.After), Max: int(w.Max),
		Wait: time.Duration(w.WaitNanos), Ack: w.Ack, Replica: w.Replica, BufferOnly: w.BufferOnly, MaxBytes: bytesFrom(w.MaxBytes, MaxLogBytes),
		AckedOnly: w.AckedOnly, WatchAcked: w.WatchAcked, AckedSeen: scnFrom(w.AckedSeen)}
}

func commitTo(c *storage.Commit) *wire.Commit {
	w := &wire.Commit{Scn: scnTo(c.SCN), Timestamp: timeTo(c.Timestamp), Events: make([]*wire.Event, len(c.Events))}
	for i := range c.Events {
		e := &c.Events[i]
		w.Events[i] = &wire.Event{Op: uint32(e.Op), Table: e.Table, Key: e.Key, Version: int32(e.Version), Value: e.Value,
			PrevVersion: int32(e.PrevVersion), PrevValue: e.PrevValue, PrevScn: scnTo(e.PrevSCN), PrevModified: timeTo(e.PrevModified), WholeCollection: e.WholeCollection}
	}
	return w
}

func commitFrom(w *wire.Commit) storage.Commit {
	c := storage.Commit{SCN: scnFrom(w.Scn), Timestamp: timeFrom(w.Timestamp), Events: make([]storage.Event, len(w.Events))}
	for i, e := range w.Events {
		c.Events[i] = storage.Event{Op: storage.Op(e.Op), Table: e.Table, Key: e.Key, Version: int(e.Version), Value: e.Value,
			PrevVersion: int(e.PrevVersion), PrevValue: e.PrevValue, PrevSCN: scnFrom(e.PrevScn), PrevModified: timeFrom(e.PrevModified), WholeCollection: e.WholeCollection && storage.Op(e.Op) == storage.OpDelete}
	}
	return c
}

func logResultTo(r *LogResult) *wire.LogResult {
	w := &wire.LogResult{Diverged: r.Diverged, Common: scnTo(r.Common), Holds: r.Holds, SourceRole: int32(r.SourceRole),
		SourceScn: scnTo(r.SourceSCN), Acked: scnTo(r.Acked), Trimmed: r.Trimmed, LogStart: scnTo(r.LogStart), SourceBehindNanos: int64(r.SourceBehind),
		AckedOnly: r.AckedOnly, Commits: make([]*wire.Commit, len(r.Commits))}
	for i := range r.Commits {
		w.Commits[i] = commitTo(&r.Commits[i])
	}
	return w
}

func logResultFrom(w *wire.LogResult) *LogResult {
	r := &LogResult{Diverged: w.Diverged, Common: scnFrom(w.Common), Holds: w.Holds, SourceRole: Role(w.SourceRole),
		SourceSCN: scnFrom(w.SourceScn), Acked: scnFrom(w.Acked), Trimmed: w.Trimmed, LogStart: scnFrom(w.LogStart), AckedOnly: w.AckedOnly,
		// Never ahead of the master (which would stretch a slave's
		// freshness into the future).
		SourceBehind: max(0, time.Duration(w.SourceBehindNanos))}
	if len(w.Commits) > 0 {
		r.Commits = make([]storage.Commit, len(w.Commits))
		for i, c := range w.Commits {
			r.Commits[i] = commitFrom(c)
		}
	}
	return r
}

func statusTo(ps []PartitionStatus) *wire.StatusResult {
	w := &wire.StatusResult{Partitions: make([]*wire.PartitionStatus, len(ps))}
	for i, p := range ps {
		w.Partitions[i] = &wire.PartitionStatus{Db: p.DB, Partition: int32(p.Partition), Role: int32(p.Role), Scn: scnTo(p.SCN), Generation: p.Generation, LogStart: scnTo(p.LogStart), LogBytes: p.LogBytes, IndexBuilding: p.IndexBuilding,
			InSync: uint32(p.InSync)}
	}
	return w
}

func statusFrom(w *wire.StatusResult) []PartitionStatus {
	var out []PartitionStatus
	for _, p := range w.Partitions {
		out = append(out, PartitionStatus{DB: p.Db, Partition: int(p.Partition), Role: Role(p.Role), SCN: scnFrom(p.Scn), Generation: p.Generation, LogStart: scnFrom(p.LogStart), LogBytes: p.LogBytes, IndexBuilding: p.IndexBuilding,
			InSync: int(min(p.InSync, 7))})
	}
	return out
}

func snapshotChunkTo(c *SnapshotChunk) *wire.SnapshotChunk {
	w := &wire.SnapshotChunk{Scn: scnTo(c.SCN), Acked: scnTo(c.Acked), Last: c.Last, Replicated: c.Replicated}
	for _, h := range c.History {
		w.History = append(w.History, scnTo(h))
	}
	w.Rows = make([]*wire.Row, len(c.Rows))
	for i, r := range c.Rows {
		w.Rows[i] = &wire.Row{Table: r.Table, Key: r.Key, Value: r.Value}
	}
	for _, m := range c.Marks {
		w.Marks = append(w.Marks, &wire.Mark{Key: m.Key, Value: m.Value})
	}
	return w
}

func snapshotChunkFrom(w *wire.SnapshotChunk) *SnapshotChunk {
	c := &SnapshotChunk{SCN: scnFrom(w.Scn), Acked: scnFrom(w.Acked), Last: w.Last, Replicated: w.Replicated}
	for _, h := range w.History {
		c.History = append(c.History, scnFrom(h))
	}
	c.Rows = make([]storage.Row, len(w.Rows))
	for i, r := range w.Rows {
		c.Rows[i] = storage.Row{Table: r.Table, Key: r.Key, Value: r.Value}
	}
	for _, m := range w.Marks {
		c.Marks = append(c.Marks, storage.Mark{Key: m.Key, Value: m.Value})
	}
	return c
}

// bytesFrom reads a byte bound from the wire: 0 (none stated) up to the
// node's own bound, whatever the sender wrote.
func bytesFrom(v int64, bound int) int { return int(min(max(v, 0), int64(bound))) }

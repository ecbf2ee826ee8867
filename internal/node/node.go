package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cortado-db/cortado/internal/index"
	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/registry"
	"github.com/cortado-db/cortado/internal/schema"
	"github.com/cortado-db/cortado/internal/storage"
)

// Node serves document operations from its storage engine.
type Node struct {
	eng   *storage.Engine
	reg   *registry.Registry
	plans *schema.Plans
	log   *slog.Logger
	roles roles
	opts  Options
	// snapshots holds a token per snapshot streaming (MaxSnapshots).
	snapshots chan struct{}
	// writes bounds the bytes of documents writes carry at once.
	writes *byteGate
	// pins keeps the logs of the partitions this node snapshots from
	// being trimmed past the snapshots' SCNs.
	pins snapshotPins
	// inSyncFloor is, by database, the least minInSync its masters here
	// count acknowledgements by (SetInSyncFloor): the routing tables'.
	inSyncFloor sync.Map // string → int
}

// Options configures a Node.
type Options struct {
	// AllMaster makes this node master of every partition (a single-node
	// deployment). Otherwise partitions are OFFLINE until SetRole.
	AllMaster bool
	// SemiSyncTimeout is how long a write waits for a slave to confirm it
	// (default 5s).
	SemiSyncTimeout time.Duration
	// ReplicationLag, when set, is told for every commit a slave applies
	// how long after its master committed it (same clock assumed).
	ReplicationLag func(time.Duration)
	// AckLag, when set, is told on a master for every commit of its own
	// a replica acknowledges how long after it became durable on the
	// master (PostgreSQL's replay lag, measured where it is: from the
	// primary's flush to the standby's feedback). ReplicationLag counts
	// from the commit's timestamp, before the master's own fsync.
	AckLag func(time.Duration)
	// SnapshotBytesPerSecond caps how fast a snapshot is streamed
	// (default DefaultSnapshotRate).
	SnapshotBytesPerSecond int64
	// SnapshotPinGrace is how long after a snapshot ends its SCN stays
	// pinned in the partition's log, for its asker to read on from there
	// (default DefaultSnapshotPinGrace). While it streams it is pinned
	// in any case.
	SnapshotPinGrace time.Duration
	// Retained, when set, is told after each retention pass, per
	// database, how many log bytes it trimmed and how many the hosted
	// partitions' logs still take.
	Retained func(db string, trimmed, logBytes int64)
	// IndexBuilding, when set, is told after each index-build pass how
	// many documents of a table the indexes of its latest version still
	// lack on the partitions this node masters.
	IndexBuilding func(db, table string, remaining uint64)
	// WriteBytes bounds the bytes of documents the node's writes carry
	// at once (default DefaultWriteBytes; -1: no bound): a write beyond
	// it waits, within its deadline, for those before it; one larger
	// goes alone.
	WriteBytes int64
}

// New returns a node over an open engine and registry. plans may be shared
// with the router.
func New(eng *storage.Engine, reg *registry.Registry, plans *schema.Plans, log *slog.Logger, opts Options) *Node {
	if opts.SemiSyncTimeout == 0 {
		opts.SemiSyncTimeout = 5 * time.Second
	}
	if opts.SnapshotBytesPerSecond == 0 {
		opts.SnapshotBytesPerSecond = DefaultSnapshotRate
	}
	if opts.WriteBytes == 0 {
		opts.WriteBytes = DefaultWriteBytes
	}
	if opts.SnapshotPinGrace == 0 {
		opts.SnapshotPinGrace = DefaultSnapshotPinGrace
	}
	// Every document change indexes the document in its own commit.
	eng.SetIndexer(&index.Indexer{Tables: reg, Plans: plans})
	return &Node{eng: eng, reg: reg, plans: plans, log: log, opts: opts, roles: roles{allMaster: opts.AllMaster, m: map[partitionKey]*partRole{}},
		snapshots: make(chan struct{}, MaxSnapshots), writes: newByteGate(opts.WriteBytes)}
}

var _ Service = (*Node)(nil)

func (n *Node) partition(db string, id int) (*storage.Partition, error) {
	_, p, err := n.partitionOf(db, id)
	return p, err
}

// partitionOf is partition with its database's definition.
func (n *Node) partitionOf(db string, id int) (*schema.Database, *storage.Partition, error) {
	d, err := n.reg.DatabaseFresh(context.Background(), db)
	if err != nil {
		return nil, nil, err
	}
	if id < 0 || id >= d.Partitions {
		return nil, nil, fmt.Errorf("database %s has no partition %d", db, id)
	}
	p, err := n.eng.Partition(db, id)
	return d, p, err
}

// open finds the table and the partition a read addresses.
func (n *Node) open(db, table string, part int) (*schema.Table, *storage.Partition, error) {
	// A table just registered through another process may not have
	// reached this one's mirror yet: TableAtLeast looks in etcd.
	t, err := n.reg.TableAtLeast(context.Background(), db, table, 1)
	if err != nil {
		return nil, nil, err
	}
	p, err := n.partition(db, part)
	if err != nil {
		return nil, nil, err
	}
	return t, p, nil
}

// render converts a stored document for a reader.
func (n *Node) render(t *schema.Table, key []keys.Part, d *storage.Doc, spec ReadSpec) (*Item, error) {
	// The stored bytes were copied out of Pebble once (storage.Get); a
	// read as written, or of an unchanged version unprojected, returns
	// that copy itself.
	it := &Item{Key: key, SCN: d.SCN, Modified: d.Modified, ETag: d.ETag(), Body: d.Value, BodyVersion: d.Version}
	return Render(context.Background(), n.reg, n.plans, t, it, spec)
}

// Render converts whole, a document as written (its body of the version
// it was written with, its entity tag), for a reader: to spec's version
// (0: as written) and projection, with the entity tag of that
// representation — what a storage node's read returns, in a new Item.
// The body is whole's own when nothing changes it. A version t does not
// hold yet (registered through another process) is looked up in reg.
func Render(ctx context.Context, reg *registry.Registry, plans *schema.Plans, t *schema.Table, whole *Item, spec ReadSpec) (*Item, error) {
	written, version := whole.BodyVersion, spec.Version
	if version == 0 {
		version = written
	}
	if t.Version(written) == nil || t.Version(version) == nil {
		var err error
		if t, err = reg.TableAtLeast(ctx, t.Database, t.Name, max(written, version)); err != nil {
			return nil, fmt.Errorf("document %v of schema version %d: %w", whole.Key, written, err)
		}
	}
	plan, err := plans.Plan(t, written, version, spec.Fields)
	if err != nil {
		return nil, err
	}
	body := whole.Body
	if !plan.Identity() {
		body, err = plan.Apply(nil, whole.Body)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s %v (version %d as %d): %w", t.Name, whole.Key, written, version, err)
	}
	it := *whole
	it.ETag, it.Body, it.BodyVersion = tagAt(whole.ETag, written, version), body, version
	return &it, nil
}

// Get reads one document.
func (n *Node) Get(ctx context.Context, req GetRequest) (*Item, error) {
	t, p, err := n.open(req.DB, req.Table, req.Partition)
	if err != nil {
		return nil, err
	}
	// Only the master in force answers fresh reads; a slave answers a
	// read that tolerates staleness (the router tries slaves when the
	// master cannot) if it is current enough.
	stale, lease, err := n.readable(req.DB, req.Partition, req.MaxStale)
	if err != nil {
		return nil, err
	}
	before := p.SCN()
	d, ok, err := p.Get(req.Table, req.Key)
	if err != nil {
		return nil, err
	}
	if ok {
		before = d.SCN
	}
	if err := n.awaitReplicated(ctx, p, before); err != nil {
		return nil, err
	}
	if err := n.inForce(req.DB, req.Partition, lease); err != nil {
		return nil, err
	}
	if err := req.Cond.Check(&d, ok, true, req.Read.Version); err != nil {
		if errors.Is(err, ErrNotModified) {
			return &Item{Key: req.Key, SCN: d.SCN, Modified: d.Modified, ETag: etagAt(&d, req.Read.Version), Stale: stale}, err
		}
		return nil, err
	}
	if !ok {
		if lease == staleRead {
			// A slave's "not found" may be stale too: it says how much
			// (an Age for the answer), as its documents do.
			return &Item{Key: req.Key, SCN: before, Stale: stale}, ErrNotFound
		}
		return nil, ErrNotFound
	}
	it, err := n.render(t, req.Key, &d, req.Read)
	if it != nil {
		it.Stale = stale
	}
	return it, err
}

// MultiGet reads several documents of one partition.
func (n *Node) MultiGet(ctx context.Context, req MultiGetRequest) (*MultiGetResult, error) {
	t, p, err := n.open(req.DB, req.Table, req.Partition)
	if err != nil {
		return nil, err
	}
	stale, lease, err := n.readable(req.DB, req.Partition, req.MaxStale)
	if err != nil {
		return nil, err
	}
	var items []*Item
	before, newest := p.SCN(), storage.SCN{}
	limit, size := req.ByteLimit(), 0
	for _, k := range req.Keys {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if size >= limit {
			break // the caller asks again for the rest (Answered)
		}
		d, ok, err := p.Get(req.Table, k)
		if err != nil {
			return nil, err
		}
		if !ok {
			newest = later(newest, before)
			continue
		}
		newest = later(newest, d.SCN)
		it, err := n.render(t, k, &d, req.Read)
		if err != nil {
			return nil, err
		}
		it.Stale = stale
		items = append(items, it)
		size += len(it.Body)
	}
	if err := n.awaitReplicated(ctx, p, newest); err != nil {
		return nil, err
	}
	if err := n.inForce(req.DB, req.Partition, lease); err != nil {
		return nil, err
	}
	return &MultiGetResult{Items: items, Stale: stale}, nil
}

func later(a, b storage.SCN) storage.SCN {
	if a.Less(b) {
		return b
	}
	return a
}

// awaitReplicated holds back a read on a semi-sync master until a slave
// holds scn (the read's newest commit, or the partition's last for a
// document not found): a commit not yet confirmed may be lost in a
// failover, and a reader must not see what could then un-happen.
func (n *Node) awaitReplicated(ctx context.Context, p *storage.Partition, scn storage.SCN) error {
	if scn.IsZero() {
		return nil
	}
	// Durable here first: a commit is visible while it waits for the
	// fsync it shares with others (storage.Partition.Update).
	if err := p.AwaitDurable(ctx, scn); err != nil {
		return err
	}
	db, id := p.DB, p.ID
	e, _ := n.roles.lookup(db, id)
	if e == nil {
		return nil
	}
	need := n.syncSlaves(db)
	if need == 0 {
		return nil
	}
	// A commit of an older generation held by slaves is not safe yet:
	// a replica holding another older generation's commits could still
	// be chosen over them, until slaves hold this master's own marker
	// (Raft's rule that a leader commits only entries of its own term).
	e.ackMu.Lock()
	scn = later(scn, e.opened)
	e.ackMu.Unlock()
	// A slave learns what is confirmed from its master: it asks.
	e.mu.RLock()
	slave := e.role == Slave
	e.mu.RUnlock()
	return e.awaitAck(ctx, scn, need, n.opts.SemiSyncTimeout, slave)
}

// syncSlaves is how many slaves must durably hold a commit of db before
// it is acknowledged: minInSync-1 under semi-sync, none under async or on
// a single node that masters everything.
func (n *Node) syncSlaves(db string) int {
	if n.roles.mastersAll() {
		return 0
	}
	d, err := n.reg.Database(db)
	if err != nil || d.Replication == "async" {
		return 0
	}
	return n.inSync(d) - 1
}

// inSync is the minInSync this node counts db's acknowledgements by: the
// registry's, or the routing table's when that is larger (a raise this
// node's registry has not seen yet).
func (n *Node) inSync(d *schema.Database) int {
	k := d.InSync()
	if f, ok := n.inSyncFloor.Load(d.Name); ok {
		k = max(k, f.(int))
	}
	return k
}

// SetInSyncFloor makes this node count the acknowledgements of db's
// writes by k replicas at least (a routing table's minInSync, which only
// grows). Its agent sets it before it applies the table's roles.
func (n *Node) SetInSyncFloor(db string, k int) {
	for {
		old, loaded := n.inSyncFloor.LoadOrStore(db, k)
		if !loaded || old.(int) >= k || n.inSyncFloor.CompareAndSwap(db, old, k) {
			return
		}
	}
}

// Scan reads one page of a collection.
func (n *Node) Scan(ctx context.Context, req ScanRequest) (*ScanResult, error) {
	t, p, err := n.open(req.DB, req.Table, req.Partition)
	if err != nil {
		return nil, err
	}
	stale, lease, err := n.readable(req.DB, req.Partition, req.MaxStale)
	if err != nil {
		return nil, err
	}
	if req.Query != "" {
		res, err := n.query(ctx, t, p, req)
		if err != nil {
			return nil, err
		}
		res.Stale = stale
		for _, it := range res.Items {
			it.Stale = stale
		}
		// Everything the query saw is at or before res.SCN.
		if err := n.awaitReplicated(ctx, p, res.SCN); err != nil {
			return nil, err
		}
		if err := n.inForce(req.DB, req.Partition, lease); err != nil {
			return nil, err
		}
		return res, nil
	}
	res := &ScanResult{SCN: p.SCN(), Stale: stale}
	limit, maxBytes, size := req.CountLimit(), req.ByteLimit(), 0
	var renderErr error
	var last []byte
	err = p.Scan(storage.ScanOptions{Table: req.Table, Prefix: req.Prefix, After: req.After}, func(k []keys.Part, enc []byte, d storage.Doc) bool {
		if len(res.Items) == limit || size >= maxBytes {
			res.Next = last // there is at least one more
			return false
		}
		if renderErr = ctx.Err(); renderErr != nil {
			return false
		}
		var it *Item
		if it, renderErr = n.render(t, k, &d, req.Read); renderErr != nil {
			return false
		}
		it.Stale = stale
		res.Items = append(res.Items, it)
		size += it.ScanBytes()
		last = enc
		return true
	})
	if err != nil {
		return nil, err
	}
	if renderErr != nil {
		return nil, renderErr
	}
	newest := res.SCN
	for _, it := range res.Items {
		newest = later(newest, it.SCN)
	}
	if err := n.awaitReplicated(ctx, p, newest); err != nil {
		return nil, err
	}
	if err := n.inForce(req.DB, req.Partition, lease); err != nil {
		return nil, err
	}
	return res, nil
}

// Write executes a transaction of one partition. Only the partition's
// master writes.
func (n *Node) Write(ctx context.Context, req WriteRequest) (*WriteResult, error) {
	d, p, err := n.partitionOf(req.DB, req.Partition)
	if err != nil {
		return nil, err
	}
	if err := n.eng.Failed(); err != nil {
		return nil, fmt.Errorf("partition %s/%d: %w", req.DB, req.Partition, err)
	}
	var held int64
	if n.writes.max > 0 {
		if held, err = n.writes.acquire(ctx, weight(p, &req)); err != nil {
			return nil, fmt.Errorf("partition %s/%d: waiting for other writes' documents to be committed: %w", req.DB, req.Partition, err)
		}
	}
	// Held for the whole write, so a demotion waits for writes in flight
	// and no write starts after it.
	e, lease, err := n.beginWrite(req.DB, req.Partition)
	if err != nil {
		n.writes.release(held)
		return nil, err
	}
	need := n.syncSlaves(req.DB)
	if live := e.liveSlaves(); live < need {
		e.mu.RUnlock()
		n.writes.release(held)
		return nil, fmt.Errorf("partition %s/%d: %d live replica(s), minInSync %d: %w", req.DB, req.Partition, live+1, need+1, ErrNotEnoughReplicas)
	}
	res, err := n.write(ctx, d, p, req)
	e.mu.RUnlock()
	// Committed (or not): the documents' memory is the batch's no more.
	// Waiting for replicas holds none of it.
	n.writes.release(held)
	if err != nil {
		return nil, err
	}
	// The count is taken again now that the commit is durable: once
	// this node's status has reported a raised minInSync (read before
	// its SCN), every commit made durable after that SCN waits for the
	// raised count, which is what the controller counts on before a
	// failover does (schema.Database.FailoverInSync).
	need = max(need, n.syncSlaves(req.DB))
	if need > 0 {
		// Semi-sync: acknowledge once need slaves durably hold the
		// commit. The role is not held meanwhile: the commit is made,
		// and a demotion need not wait for slaves.
		if err := e.awaitAck(ctx, res.SCN, need, n.opts.SemiSyncTimeout, false); err != nil {
			return nil, err
		}
	}
	// A master paused (or cut off) after its write began may have lost
	// its lease meanwhile, and another replica been promoted without this
	// commit: slaves that still followed this node may have applied it,
	// but it is not on the timeline in force. Only while the lease the
	// write began under is certainly held is it the partition's timeline.
	if !n.roles.stillHeld(lease) {
		return nil, fmt.Errorf("partition %s/%d: commit %s: the membership lease it was made under may have lapsed: %w", req.DB, req.Partition, res.SCN, ErrNotReplicated)
	}
	if need > 0 {
		p.Acknowledged(res.SCN)
	}
	return res, nil
}

func (n *Node) write(ctx context.Context, d *schema.Database, p *storage.Partition, req WriteRequest) (*WriteResult, error) {
	var err error
	tables := make([]*schema.Table, len(req.Ops))
	for i, op := range req.Ops {
		if tables[i], err = n.reg.TableAtLeast(ctx, req.DB, op.Table, max(op.Version, 1)); err != nil {
			return nil, &OpError{i, err}
		}
		// A document stored in another partition than its key's would
		// be missing to reads by key and found by queries of every
		// partition: the router routes by key, and a node takes no
		// partition on trust from the wire either.
		if len(op.Key) > 0 {
			if home := d.PartitionOf(op.Key[0]); home != req.Partition {
				return nil, &OpError{i, fmt.Errorf("%w: the key's partition is %d, not %d", errBadRequest, home, req.Partition)}
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	res := &WriteResult{Results: make([]OpResult, len(req.Ops))}
	scn, err := p.Update(func(tx *storage.Tx) error {
		for i := range req.Ops {
			r, err := n.apply(tx, tables[i], &req.Ops[i])
			if err != nil {
				return &OpError{i, err}
			}
			res.Results[i] = r
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	res.SCN = scn
	return res, nil
}

func (n *Node) apply(tx *storage.Tx, t *schema.Table, op *Op) (OpResult, error) {
	if op.Kind == OpInsert || op.Kind == OpPut {
		// The router validated the document; a node takes nothing on
		// trust from the wire either: what it stores, reads give back.
		v := t.Version(op.Version)
		if v == nil {
			return OpResult{}, fmt.Errorf("%w: table %s has no schema version %d", errBadRequest, op.Table, op.Version)
		}
		if err := v.Validate(op.Value); err != nil {
			return OpResult{}, err
		}
	}
	switch op.Kind {
	case OpInsert:
		_, most := t.Key[len(t.Key)-1].Type.Range()
		next, err := tx.NextAutoIncrement(op.Table, op.Key, most)
		if err != nil {
			return OpResult{}, err
		}
		key := append(append([]keys.Part(nil), op.Key...), keys.I(next))
		return n.put(tx, op, key)
	case OpPut:
		return n.put(tx, op, op.Key)
	case OpPatch:
		return n.patch(tx, t, op)
	case OpDelete:
		if _, _, err := current(tx, op, op.Key, true); err != nil {
			return OpResult{}, err
		}
		if _, err := tx.Delete(op.Table, op.Key); err != nil {
			return OpResult{}, err
		}
		if t.AutoIncrement() {
			if err := tx.KeepMark(op.Table, op.Key); err != nil {
				return OpResult{}, err
			}
		}
		return OpResult{Key: op.Key, Deleted: 1}, nil
	case OpKeepMark:
		if !t.AutoIncrement() || len(op.Key) != len(t.Key) {
			return OpResult{}, fmt.Errorf("%w: a mark needs a table whose last key part auto-increments, and a full key", errBadRequest)
		}
		if err := tx.KeepMark(op.Table, op.Key); err != nil {
			return OpResult{}, err
		}
		return OpResult{Key: op.Key}, nil
	case OpDeleteCollection:
		n, err := tx.DeleteCollection(op.Table, op.Key, t.AutoIncrement())
		if err != nil {
			return OpResult{}, err
		}
		return OpResult{Key: op.Key, Deleted: n}, nil
	}
	return OpResult{}, fmt.Errorf("unknown operation %q", op.Kind)
}

// current reads the row an operation applies to and checks the
// operation's preconditions against it; mustExist makes a missing row
// ErrNotFound (after the preconditions, so If-Match on a missing row is 412).
func current(tx *storage.Tx, op *Op, key []keys.Part, mustExist bool) (storage.Doc, bool, error) {
	cur, exists, err := tx.Get(op.Table, key)
	if err != nil {
		return storage.Doc{}, false, err
	}
	if err := op.Cond.Check(&cur, exists, false, 0); err != nil {
		return storage.Doc{}, false, err
	}
	if mustExist && !exists {
		return storage.Doc{}, false, ErrNotFound
	}
	return cur, exists, nil
}

func (n *Node) put(tx *storage.Tx, op *Op, key []keys.Part) (OpResult, error) {
	_, exists, err := current(tx, op, key, false)
	if err != nil {
		return OpResult{}, err
	}
	d, err := tx.Put(op.Table, key, op.Version, op.Value)
	if err != nil {
		return OpResult{}, err
	}
	return OpResult{Key: key, Created: !exists, ETag: d.ETag(), Modified: d.Modified}, nil
}

// patch reads the current document as the latest version, applies the
// patch to its JSON form and writes it back validated.
func (n *Node) patch(tx *storage.Tx, t *schema.Table, op *Op) (OpResult, error) {
	if op.Patch == nil {
		return OpResult{}, fmt.Errorf("%w: a patch operation without a patch", errBadRequest)
	}
	cur, _, err := current(tx, op, op.Key, true)
	if err != nil {
		return OpResult{}, err
	}
	latest := t.Latest()
	item, err := n.render(t, op.Key, &cur, ReadSpec{Version: latest.Number})
	if err != nil {
		return OpResult{}, err
	}
	js, err := latest.JSON.Append(nil, item.Body)
	if err != nil {
		return OpResult{}, err
	}
	tree, err := schema.DecodeJSON(js)
	if err != nil {
		return OpResult{}, err
	}
	doc := tree.(map[string]any)
	if err := op.Patch.apply(doc); err != nil {
		return OpResult{}, err
	}
	value, err := schema.EncodeJSON(nil, latest.Schema, doc)
	if err != nil {
		return OpResult{}, err
	}
	d, err := tx.Put(op.Table, op.Key, latest.Number, value)
	if err != nil {
		return OpResult{}, err
	}
	return OpResult{Key: op.Key, ETag: d.ETag(), Modified: d.Modified}, nil
}

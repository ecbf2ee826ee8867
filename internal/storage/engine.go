package storage

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"

	"github.com/cortado-db/cortado/internal/keys"
)

// ErrFailed is returned for every write after the engine met an error it
// cannot go on from (a failed WAL write or sync: a full or failing disk).
// Pebble's commit pipeline is unusable from then on; the node must give
// up its partitions and be restarted once the disk is fixed.
var ErrFailed = errors.New("storage: the engine failed (disk full or failing)")

// Options configures an Engine. The zero value is usable.
type Options struct {
	// NoSync skips the fsync before a commit is acknowledged. Only for
	// benchmarks that measure everything but the disk; never in serve.
	NoSync bool
	// CacheBytes is Pebble's block cache size (default 256 MiB).
	CacheBytes int64
	// RowCacheBytes bounds the cache of documents read by key in front
	// of Pebble (rowcache.go; default DefaultRowCacheBytes, negative:
	// none).
	RowCacheBytes int64
	// MemTableBytes is the size Pebble's memtables grow to (default 64
	// MiB, CockroachDB's). Pebble's own default, 4 MiB, flushes so often
	// that compactions took 40 % of a PUT load's CPU.
	MemTableBytes uint64
	// SeparateValuesFrom is the size from which Pebble keeps a value in a
	// blob file beside its tables rather than in them (default 512 bytes,
	// Pebble's own benchmarks' setting; negative: never). A PUT load of 1
	// KB documents spent a fifth of its CPU in compactions rewriting
	// values; with separation they rewrite the keys and references.
	SeparateValuesFrom int
	// Logger receives Pebble's errors (default slog.Default()).
	Logger *slog.Logger
	// ProbeInterval is how often the engine checks that its disk takes
	// writes (default 1s; negative: never): it creates, writes, syncs
	// and removes a small file in the data directory. A failure, or a
	// probe not done within StallTimeout (default DefaultStallTimeout),
	// fails the engine (ErrFailed) before a commit has to find out.
	ProbeInterval, StallTimeout time.Duration
	// MinFreeBytes is the least free space the data directory's file
	// system may have (default DefaultMinFreeBytes; negative: no floor):
	// the probe finds less and fails the engine as if the disk were full.
	// On ext4 a probe of a full disk can succeed (delayed allocation hands
	// back blocks it reserved), and Pebble would meet the full disk only
	// at its next new file.
	MinFreeBytes int64
	// ReadFlushInterval is the least time between the memtable flushes
	// reads ask for (default 10 s; negative: none). A read that stepped
	// over more than hiddenStepsForFlush values it could not see — older
	// values of a key rewritten many times, a deleted key's values — asks
	// for one: the flush keeps only each key's newest value (and those
	// open snapshots see), so the reads after it do not step over them
	// again. Without it they would until the memtable filled.
	ReadFlushInterval time.Duration
	// ClusterID, when set, is the cluster this engine serves
	// (topo.ClusterID): the data directory records it at its first open
	// and is refused by a process of another cluster (ErrOtherCluster),
	// unless AdoptCluster, which records the new one instead (after
	// etcd was rebuilt for the same cluster).
	ClusterID    string
	AdoptCluster bool
}

// hiddenStepsForFlush is how many values a read may step over without
// returning them before it asks for a flush (ReadFlushInterval): about
// 2 ms of a read's time.
const hiddenStepsForFlush = 10000

// readFlushMinBytes is the least a memtable must hold for a read's flush
// (see flusher).
const readFlushMinBytes = 1 << 20

// DefaultMinFreeBytes is the default free-space floor: a quarter of a
// memtable. It does not keep room for every flush; it is there because
// an ext4 that refuses new files can still show a few megabytes free.
const DefaultMinFreeBytes = 16 << 20

// DefaultStallTimeout is how long a disk probe may take before the engine
// takes its disk for failed: long enough for a slow disk under load (a
// sync of a second or two), short enough that a stalled disk's
// partitions fail over in seconds. CockroachDB's own bound is 20 s.
const DefaultStallTimeout = 10 * time.Second

// DefaultRowCacheBytes is the row cache's default bound: 100,000 documents
// of 1 KB with their keys.
const DefaultRowCacheBytes = 128 << 20

// Engine is one storage node's Pebble instance and the partitions it hosts.
type Engine struct {
	db   *pebble.DB
	opts Options

	mu         sync.Mutex
	partitions map[partitionID]*Partition

	rows    *rowCache // nil: none
	fail    *failure
	indexer Indexer
	// stop is closed by Close: the disk probe and the flusher return.
	stop      chan struct{}
	probeDone chan struct{}
	// flushWanted takes reads' requests for a flush (noteSteps);
	// flusher, done when flusherDone is closed, serves them.
	flushWanted chan struct{}
	flusherDone chan struct{}
	// readFlushes counts the flushes reads asked for that were started,
	// readFlushSkips the requests let go for a small memtable; unflushed
	// is about how many bytes of batches the memtable holds (set to 0 as
	// a flush begins).
	readFlushes, readFlushSkips atomic.Int64
	unflushed                   *atomic.Int64

	// logEpoch is the epoch of the log space new log entries go to
	// (logspace.go): later than every stored entry's, and moved on at
	// every flush.
	logEpoch *atomic.Uint32

	// closeOnce makes Close run once; closeErr is what it returned.
	closeOnce sync.Once
	closeErr  error
}

// failure is an engine's first fatal error, shared with its Pebble logger.
type failure struct {
	mu   sync.Mutex
	err  error
	done chan struct{}
}

func (f *failure) set(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
		close(f.done)
	}
}

func (f *failure) get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// fatalPanic is how the Pebble logger's Fatalf unwinds (Pebble expects it
// not to return); Engine.guarded recovers it as ErrFailed.
type fatalPanic struct{ err error }

type partitionID struct {
	db string
	id int
}

// Open opens (or creates) the engine in dir.
func Open(dir string, opts Options) (*Engine, error) {
	if opts.CacheBytes == 0 {
		opts.CacheBytes = 256 << 20
	}
	if opts.RowCacheBytes == 0 {
		opts.RowCacheBytes = DefaultRowCacheBytes
	}
	if opts.MemTableBytes == 0 {
		opts.MemTableBytes = 64 << 20
	}
	if opts.SeparateValuesFrom == 0 {
		opts.SeparateValuesFrom = 512
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.ProbeInterval == 0 {
		opts.ProbeInterval = time.Second
	}
	if opts.ReadFlushInterval == 0 {
		opts.ReadFlushInterval = 10 * time.Second
	}
	if opts.StallTimeout == 0 {
		opts.StallTimeout = DefaultStallTimeout
	}
	if opts.MinFreeBytes == 0 {
		opts.MinFreeBytes = DefaultMinFreeBytes
	}
	cache := pebble.NewCache(opts.CacheBytes)
	defer cache.Unref()
	fail := &failure{done: make(chan struct{})}
	logEpoch := new(atomic.Uint32)
	unflushed := new(atomic.Int64)
	po := &pebble.Options{
		FormatMajorVersion: pebble.FormatNewest,
		Cache:              cache,
		MemTableSize:       opts.MemTableBytes,
		Logger:             pebbleLogger{opts.Logger, fail},
		EventListener: &pebble.EventListener{BackgroundError: func(err error) {
			// A flush or compaction that cannot write: the disk is
			// full or failing, and writes would soon stall.
			opts.Logger.Error("pebble background error", "err", err)
			fail.set(fmt.Errorf("%w: %v", ErrFailed, err))
		}, FlushBegin: func(pebble.FlushInfo) {
			// The memtable being flushed holds the entries of the epoch
			// ending now (logspace.go).
			logEpoch.Add(1)
			unflushed.Store(0)
		}},
	}
	if opts.SeparateValuesFrom > 0 {
		// Values this large go to blob files when a memtable is flushed,
		// and compactions move only their references: a document and its
		// log entry are written to disk about once instead of once per
		// level. Blob files that become 20 % garbage are rewritten, as
		// CockroachDB's defaults do.
		policy := pebble.ValueSeparationPolicy{Enabled: true, MinimumSize: opts.SeparateValuesFrom,
			MaxBlobReferenceDepth: 40, RewriteMinimumAge: 5 * time.Minute, TargetGarbageRatio: 0.2}
		po.Experimental.ValueSeparationPolicy = func() pebble.ValueSeparationPolicy { return policy }
	}
	// A point read (a document by key, a log entry by SCN) skips every
	// table whose bloom filter says the key is not there: without them a
	// read seeks into each L0 sublevel and each level.
	for i := range po.Levels {
		po.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
		po.Levels[i].FilterType = pebble.TableFilter
	}
	db, err := pebble.Open(dir, po)
	if err != nil {
		return nil, fmt.Errorf("open pebble in %s: %w", dir, err)
	}
	if err := checkFormat(db, dir); err != nil {
		db.Close()
		return nil, err
	}
	if err := checkCluster(db, dir, opts.ClusterID, opts.AdoptCluster, opts.Logger); err != nil {
		db.Close()
		return nil, err
	}
	last, err := lastLogEpoch(db)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open pebble in %s: the log's last epoch: %w", dir, err)
	}
	// Epoch 0 is for logs stored before the log space (migrateLog).
	logEpoch.Store(max(logEpoch.Load(), last+1, 1))
	e := &Engine{db: db, opts: opts, partitions: map[partitionID]*Partition{}, fail: fail, rows: newRowCache(opts.RowCacheBytes),
		logEpoch: logEpoch, stop: make(chan struct{}), probeDone: make(chan struct{}),
		flushWanted: make(chan struct{}, 1), flusherDone: make(chan struct{}), unflushed: unflushed}
	if opts.ProbeInterval > 0 {
		go e.probeDisk(dir)
	} else {
		close(e.probeDone)
	}
	if opts.ReadFlushInterval > 0 {
		go e.flusher()
	} else {
		close(e.flusherDone)
	}
	return e, nil
}

// ReadFlushes is how many memtable flushes reads asked for
// (Options.ReadFlushInterval) were started.
func (e *Engine) ReadFlushes() int64 { return e.readFlushes.Load() }

// closeIter closes a read's iterator, noting its steps first.
func (e *Engine) closeIter(it *pebble.Iterator) error {
	e.noteSteps(it)
	return it.Close()
}

// noteSteps asks for a flush if it stepped over more than
// hiddenStepsForFlush values it did not return (see ReadFlushInterval);
// reads call it before closing an iterator.
func (e *Engine) noteSteps(it *pebble.Iterator) {
	st := it.Stats()
	hidden := st.ForwardStepCount[pebble.InternalIterCall] + st.ReverseStepCount[pebble.InternalIterCall] -
		st.ForwardStepCount[pebble.InterfaceCall] - st.ReverseStepCount[pebble.InterfaceCall]
	if hidden <= hiddenStepsForFlush {
		return
	}
	select {
	case e.flushWanted <- struct{}{}:
	default: // one is asked for already
	}
}

// flusher starts the flushes reads ask for, at most one every
// ReadFlushInterval, until Close.
func (e *Engine) flusher() {
	defer close(e.flusherDone)
	var last time.Time
	for {
		select {
		case <-e.stop:
			return
		case <-e.flushWanted:
		}
		if wait := e.opts.ReadFlushInterval - time.Since(last); !last.IsZero() && wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-e.stop:
				t.Stop()
				return
			case <-t.C:
			}
		}
		last = time.Now()
		if e.Failed() != nil {
			continue
		}
		// A memtable this small cannot hold the values the read stepped
		// over: they are in tables (tombstones of deleted keys, which
		// compactions drop), and flushing it again would only add small
		// tables.
		if e.unflushed.Load() < readFlushMinBytes {
			e.readFlushSkips.Add(1)
			continue
		}
		if err := e.guarded(func() error { _, err := e.db.AsyncFlush(); return err }); err != nil {
			e.opts.Logger.Warn("storage: a flush reads asked for", "err", err)
			continue
		}
		e.readFlushes.Add(1)
	}
}

// probeDisk checks the disk every ProbeInterval until Close.
func (e *Engine) probeDisk(dir string) {
	defer close(e.probeDone)
	t := time.NewTicker(e.opts.ProbeInterval)
	defer t.Stop()
	for n := 0; ; n++ {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		if e.Failed() != nil {
			return
		}
		done := make(chan error, 1)
		// A probe stuck in the kernel cannot be cancelled; it ends with
		// the I/O it waits for.
		go func() { done <- probeOnce(filepath.Join(dir, fmt.Sprintf("probe-%d", n%2))) }()
		select {
		case err := <-done:
			if err != nil {
				e.opts.Logger.Error("storage: the disk refused a probe write", "err", err)
				e.fail.set(fmt.Errorf("%w: disk probe: %v", ErrFailed, err))
			} else if free, ok := freeBytes(dir); ok && e.opts.MinFreeBytes > 0 && free < e.opts.MinFreeBytes {
				e.opts.Logger.Error("storage: the disk is full", "free", free, "floor", e.opts.MinFreeBytes)
				e.fail.set(fmt.Errorf("%w: %d bytes free on the disk, under the floor of %d", ErrFailed, free, e.opts.MinFreeBytes))
			}
		case <-time.After(e.opts.StallTimeout):
			e.opts.Logger.Error("storage: a disk probe stalled", "after", e.opts.StallTimeout)
			e.fail.set(fmt.Errorf("%w: a disk probe stalled for %v", ErrFailed, e.opts.StallTimeout))
		case <-e.stop:
			return
		}
	}
}

// probeOnce writes a new 4 KiB file, syncs it and removes it: a full disk
// refuses the new pages even where overwriting old ones would succeed.
func probeOnce(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, werr := f.Write(make([]byte, 4096))
	serr := f.Sync()
	cerr := f.Close()
	os.Remove(path)
	return errors.Join(werr, serr, cerr)
}

// Failed returns the engine's fatal error, nil while it is healthy.
func (e *Engine) Failed() error { return e.fail.get() }

// FailedC is closed when the engine fails.
func (e *Engine) FailedC() <-chan struct{} { return e.fail.done }

// commit commits b with the engine's durability, or fails fast with
// ErrFailed once the engine has failed.
func (e *Engine) commit(b *pebble.Batch) error {
	e.unflushed.Add(int64(b.Len()))
	return e.guarded(func() error { return b.Commit(e.writeOptions()) })
}

// guarded runs a write to Pebble, failing fast with ErrFailed once the
// engine has failed; Pebble treats a failed WAL write as fatal, and its
// Fatalf unwinds to here as that error.
func (e *Engine) guarded(write func() error) (err error) {
	if err := e.Failed(); err != nil {
		return err
	}
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(fatalPanic)
			if !ok {
				panic(r)
			}
			err = f.err
		}
	}()
	return write()
}

// apply commits b as commit does but returns once b is applied (visible
// to readers) and queued for the write-ahead log's next fsync; wait
// returns once it is durable. Commits queued meanwhile, of any partition,
// share that fsync. A failed fsync fails the engine.
func (e *Engine) apply(b *pebble.Batch) (wait func() error, err error) {
	if e.opts.NoSync {
		return func() error { return nil }, e.commit(b)
	}
	e.unflushed.Add(int64(b.Len()))
	if err := e.guarded(func() error { return e.db.ApplyNoSyncWait(b, pebble.Sync) }); err != nil {
		return nil, err
	}
	return func() error {
		if err := b.SyncWait(); err != nil {
			err = fmt.Errorf("%w: write-ahead log sync: %v", ErrFailed, err)
			e.fail.set(err)
			return err
		}
		return nil
	}, nil
}

// Close stops the disk probe and the flusher and closes Pebble. Callers
// stop all writes first. Closing again returns the first Close's error
// (a shutdown path and a deferred cleanup may both close).
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		close(e.stop)
		<-e.probeDone
		<-e.flusherDone
		e.closeErr = errors.Join(e.storeWatermarks(), e.db.Close())
	})
	return e.closeErr
}

// storeWatermarks stores each partition's acknowledged watermark where
// it is ahead of the stored one (commits store it at most every
// ackedEvery), so that a clean restart forgets none of it.
func (e *Engine) storeWatermarks() error {
	e.mu.Lock()
	parts := slices.Collect(maps.Values(e.partitions))
	e.mu.Unlock()
	b := e.db.NewBatch()
	defer b.Close()
	moved := false
	for _, p := range parts {
		p.mu.Lock()
		if p.stored.Less(p.acked) {
			if err := b.Set(keys.Meta(p.DB, p.ID, "acked"), encodeSCN(p.acked), nil); err != nil {
				p.mu.Unlock()
				return err
			}
			moved = true
		}
		p.mu.Unlock()
	}
	if !moved {
		return nil
	}
	if err := b.Commit(e.writeOptions()); err != nil {
		return fmt.Errorf("store the acknowledged watermarks: %w", err)
	}
	return nil
}

// Metrics returns Pebble's metrics.
func (e *Engine) Metrics() *pebble.Metrics { return e.db.Metrics() }

// Partition returns partition id of database db, loading its SCN on first
// use.
func (e *Engine) Partition(db string, id int) (*Partition, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	pid := partitionID{db, id}
	if p, ok := e.partitions[pid]; ok {
		return p, nil
	}
	p, err := openPartition(e, db, id)
	if err != nil {
		return nil, err
	}
	e.partitions[pid] = p
	return p, nil
}

func (e *Engine) writeOptions() *pebble.WriteOptions {
	if e.opts.NoSync {
		return pebble.NoSync
	}
	return pebble.Sync
}

type pebbleLogger struct {
	log  *slog.Logger
	fail *failure
}

func (l pebbleLogger) Infof(string, ...any) {}
func (l pebbleLogger) Errorf(format string, args ...any) {
	l.log.Error("pebble", "msg", fmt.Sprintf(format, args...))
}
func (l pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.log.Error("pebble fatal", "msg", msg)
	err := fmt.Errorf("%w: %s", ErrFailed, msg)
	l.fail.set(err)
	panic(fatalPanic{err})
}

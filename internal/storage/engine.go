package storage

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/cockroachdb/pebble/v2"
)

// Options configures an Engine. The zero value is usable.
type Options struct {
	// NoSync skips the fsync before a commit is acknowledged. Only for
	// benchmarks that measure everything but the disk; never in serve.
	NoSync bool
	// CacheBytes is Pebble's block cache size (default 256 MiB).
	CacheBytes int64
	// Logger receives Pebble's errors (default slog.Default()).
	Logger *slog.Logger
}

// Engine is one storage node's Pebble instance and the partitions it hosts.
type Engine struct {
	db   *pebble.DB
	opts Options

	mu         sync.Mutex
	partitions map[partitionID]*Partition
}

type partitionID struct {
	db string
	id int
}

// Open opens (or creates) the engine in dir.
func Open(dir string, opts Options) (*Engine, error) {
	if opts.CacheBytes == 0 {
		opts.CacheBytes = 256 << 20
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	cache := pebble.NewCache(opts.CacheBytes)
	defer cache.Unref()
	db, err := pebble.Open(dir, &pebble.Options{
		FormatMajorVersion: pebble.FormatNewest,
		Cache:              cache,
		Logger:             pebbleLogger{opts.Logger},
	})
	if err != nil {
		return nil, fmt.Errorf("open pebble in %s: %w", dir, err)
	}
	return &Engine{db: db, opts: opts, partitions: map[partitionID]*Partition{}}, nil
}

// Close closes Pebble. Callers stop all writes first.
func (e *Engine) Close() error { return e.db.Close() }

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

type pebbleLogger struct{ log *slog.Logger }

func (l pebbleLogger) Infof(string, ...any) {}
func (l pebbleLogger) Errorf(format string, args ...any) {
	l.log.Error("pebble", "msg", fmt.Sprintf(format, args...))
}
func (l pebbleLogger) Fatalf(format string, args ...any) {
	l.log.Error("pebble fatal", "msg", fmt.Sprintf(format, args...))
	panic(fmt.Sprintf(format, args...))
}

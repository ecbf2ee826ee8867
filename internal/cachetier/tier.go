package cachetier

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cortado-db/cortado/internal/storage"
	"github.com/redis/go-redis/v9"
)

// Options configures a Tier (and the Updater that writes through it).
type Options struct {
	// URL is the Redis server's (redis://host:port/db); empty: no tier.
	URL string
	// Prefix starts every key the tier writes (default "cortado").
	Prefix string
	// TTL is how long an entry lives unless a commit or the
	// bootstrapper writes it again (default DefaultTTL).
	TTL time.Duration
	// BootstrapEvery is how often the bootstrapper walks every
	// partition (default TTL/3; at most TTL/2), BootstrapRate how fast
	// it reads their snapshots (default DefaultBootstrapRate, bytes a
	// second; a node's own --snapshot-rate bounds it too).
	BootstrapEvery time.Duration
	BootstrapRate  int64
	// ReadTimeout bounds a read's round trip to Redis (default
	// DefaultReadTimeout): a slower answer is a miss, and a failure.
	ReadTimeout time.Duration
	// WriteTimeout bounds the updater's calls (default 2 s).
	WriteTimeout time.Duration
	// FreshEvery is how often the updater asks each partition's master
	// for its newest commit (default DefaultFreshEvery): an idle
	// partition's entries are at most about that stale.
	FreshEvery time.Duration
	// Failures is how many failed reads in a row make the tier unhealthy
	// (default 3); ProbeEvery how often an unhealthy tier is pinged
	// (default 1 s).
	Failures   int
	ProbeEvery time.Duration
	// PoolSize bounds the connections to Redis (default 16): reads
	// beyond it wait at most ReadTimeout for one.
	PoolSize int
	// MaxDocBytes: the updater does not cache documents larger than this
	// (default 1 MiB); a read of one goes to the store.
	MaxDocBytes int
	// Databases the tier holds (empty: all): the updater follows them,
	// and readers ask Redis for their documents only.
	Databases []string
}

// Defaults of Options.
const (
	DefaultTTL           = time.Hour
	DefaultBootstrapRate = 8 << 20
	DefaultReadTimeout   = 25 * time.Millisecond
	DefaultFreshEvery    = 250 * time.Millisecond
)

func (o *Options) fill() {
	if o.Prefix == "" {
		o.Prefix = "cortado"
	}
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.BootstrapEvery <= 0 {
		o.BootstrapEvery = o.TTL / 3
	}
	o.BootstrapEvery = min(o.BootstrapEvery, o.TTL/2)
	if o.BootstrapRate <= 0 {
		o.BootstrapRate = DefaultBootstrapRate
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = DefaultReadTimeout
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 2 * time.Second
	}
	if o.FreshEvery <= 0 {
		o.FreshEvery = DefaultFreshEvery
	}
	if o.Failures <= 0 {
		o.Failures = 3
	}
	if o.ProbeEvery <= 0 {
		o.ProbeEvery = time.Second
	}
	if o.PoolSize <= 0 {
		o.PoolSize = 16
	}
	if o.MaxDocBytes <= 0 {
		o.MaxDocBytes = 1 << 20
	}
}

// Tier reads and writes the cache tier. A nil *Tier is no tier: it finds
// nothing.
type Tier struct {
	opts Options
	rdb  *redis.Client

	down  atomic.Bool
	fails atomic.Int32
	wake  chan struct{}
	stop  chan struct{}
	wg    sync.WaitGroup

	// Read outcomes (Stats).
	hits, misses, tooOld, failed, skipped atomic.Uint64
}

// New connects to o.URL (lazily: a Redis that is down makes the tier
// unhealthy, not New fail) and starts the health monitor; nil, nil when
// o.URL is empty.
func New(o Options) (*Tier, error) {
	if o.URL == "" {
		return nil, nil
	}
	o.fill()
	ro, err := redis.ParseURL(o.URL)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	ro.PoolSize = o.PoolSize
	ro.PoolTimeout = o.ReadTimeout
	ro.MaxRetries = -1 // a retry is another wait a request did not ask for
	ro.ContextTimeoutEnabled = true
	ro.DialTimeout = time.Second
	ro.ReadTimeout, ro.WriteTimeout = o.WriteTimeout, o.WriteTimeout
	t := &Tier{opts: o, rdb: redis.NewClient(ro), wake: make(chan struct{}, 1), stop: make(chan struct{})}
	t.wg.Add(1)
	go t.monitor()
	return t, nil
}

// Close stops the health monitor and closes the connections.
func (t *Tier) Close() {
	if t == nil {
		return
	}
	close(t.stop)
	t.wg.Wait()
	t.rdb.Close()
}

// Options returns the tier's effective options.
func (t *Tier) Options() Options { return t.opts }

// Healthy reports whether reads ask Redis.
func (t *Tier) Healthy() bool { return t != nil && !t.down.Load() }

// Stats counts reads: answered from Redis, not held, held but older than
// the read accepts, failed (an error or ReadTimeout), and not asked
// because the tier was unhealthy.
func (t *Tier) Stats() (hits, misses, tooOld, failed, skipped uint64) {
	if t == nil {
		return
	}
	return t.hits.Load(), t.misses.Load(), t.tooOld.Load(), t.failed.Load(), t.skipped.Load()
}

// monitor pings an unhealthy Redis every ProbeEvery until it answers.
func (t *Tier) monitor() {
	defer t.wg.Done()
	tick := time.NewTicker(t.opts.ProbeEvery)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-t.wake:
		case <-tick.C:
		}
		if !t.down.Load() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), t.opts.ProbeEvery)
		err := t.rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			t.fails.Store(0)
			t.down.Store(false)
		}
	}
}

// observe records a call's outcome for the health monitor. A call its
// caller gave up on (ctx ended before the call's own deadline) says
// nothing about Redis.
func (t *Tier) observe(ctx context.Context, err error) {
	switch {
	case err == nil || errors.Is(err, redis.Nil):
		t.fails.Store(0)
	case ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
	default:
		if int(t.fails.Add(1)) >= t.opts.Failures && !t.down.Swap(true) {
			select {
			case t.wake <- struct{}{}:
			default:
			}
		}
	}
}

// Key layout: a partition's entries and its meta hash share a hash tag,
// so the scripts touch one slot (a Redis Cluster serves them too).
func (t *Tier) partKey(db string, part int) string {
	return t.opts.Prefix + ":{" + db + ":" + strconv.Itoa(part) + "}:"
}

func (t *Tier) metaKey(db string, part int) string { return t.partKey(db, part) + "m" }

func (t *Tier) docKey(db string, part int, table string, key []byte) string {
	return t.partKey(db, part) + "d:" + table + "\x00" + string(key)
}

// order is an entry's place in last-writer-wins: the epoch, the SCN,
// then whether the entry is known (an entry of a commit not yet
// acknowledged when the bootstrapper saw it is a placeholder that reads
// miss, replaced by the commit itself at the same SCN). Digits only, of
// fixed width, so Lua compares them as strings.
func order(epoch int64, scn storage.SCN, known bool) string {
	k := '0'
	if known {
		k = '1'
	}
	return fmt.Sprintf("%020d%010d%020d%c", epoch, scn.Gen, scn.Seq, k)
}

// orderLen is an order's length.
const orderLen = 51

var getScript = redis.NewScript(`
local d = redis.call('HMGET', KEYS[1], 'o', 'v')
local m = redis.call('HMGET', KEYS[2], 'epoch', 'fresh')
local t = redis.call('TIME')
return {d[1], d[2], m[1], m[2], t[1], t[2]}
`)

// Get returns the document stored under (db, part, table, key) — key as
// keys.Encode makes it — when the tier holds it and its partition's
// entries are at most maxStale stale, and how stale they may be. Any
// failure is a miss.
func (t *Tier) Get(ctx context.Context, db string, part int, table string, key []byte, maxStale time.Duration) (storage.Doc, time.Duration, bool) {
	if t == nil {
		return storage.Doc{}, 0, false
	}
	if !t.holds(db) {
		return storage.Doc{}, 0, false // not asked, not counted
	}
	if t.down.Load() {
		t.skipped.Add(1)
		return storage.Doc{}, 0, false
	}
	rctx, cancel := context.WithTimeout(ctx, t.opts.ReadTimeout)
	defer cancel()
	res, err := getScript.Run(rctx, t.rdb, []string{t.docKey(db, part, table, key), t.metaKey(db, part)}).Slice()
	t.observe(ctx, err)
	if err != nil {
		t.failed.Add(1)
		return storage.Doc{}, 0, false
	}
	d, age, ok := t.entry(res, maxStale)
	if ok {
		t.hits.Add(1)
	}
	return d, age, ok
}

// holds reports whether the tier keeps database db's documents.
func (t *Tier) holds(db string) bool {
	return len(t.opts.Databases) == 0 || slices.Contains(t.opts.Databases, db)
}

// entry reads getScript's answer: the entry, if of the partition's epoch,
// known, not a tombstone, and young enough.
func (t *Tier) entry(res []any, maxStale time.Duration) (storage.Doc, time.Duration, bool) {
	str := func(i int) (string, bool) {
		if i >= len(res) {
			return "", false
		}
		s, ok := res[i].(string)
		return s, ok
	}
	o, ok1 := str(0)
	v, ok2 := str(1)
	epoch, ok3 := str(2)
	fresh, ok4 := str(3)
	sec, ok5 := str(4)
	usec, ok6 := str(5)
	if !ok1 || !ok2 || !ok3 || len(o) != orderLen || o[orderLen-1] != '1' || v == "" {
		t.misses.Add(1)
		return storage.Doc{}, 0, false
	}
	e, err := strconv.ParseInt(o[:20], 10, 64)
	gen, errG := strconv.ParseUint(o[20:30], 10, 32)
	seq, errS := strconv.ParseUint(o[30:50], 10, 64)
	if err != nil || errG != nil || errS != nil || strconv.FormatInt(e, 10) != epoch {
		t.misses.Add(1) // an earlier epoch's
		return storage.Doc{}, 0, false
	}
	f, err1 := strconv.ParseInt(fresh, 10, 64)
	s, err2 := strconv.ParseInt(sec, 10, 64)
	u, err3 := strconv.ParseInt(usec, 10, 64)
	if !ok4 || !ok5 || !ok6 || err1 != nil || err2 != nil || err3 != nil {
		t.tooOld.Add(1) // no word yet on how fresh the partition is
		return storage.Doc{}, 0, false
	}
	age := time.Duration(s*1e6+u-f) * time.Microsecond
	if age > maxStale {
		t.tooOld.Add(1)
		return storage.Doc{}, 0, false
	}
	d, err := storage.DecodeRow([]byte(v))
	if err != nil || d.SCN != (storage.SCN{Gen: uint32(gen), Seq: seq}) {
		t.failed.Add(1) // not what the updater writes: a miss
		return storage.Doc{}, 0, false
	}
	return d, max(age, 0), true
}

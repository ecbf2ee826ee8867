package cachetier

import (
	"context"
	"errors"
	"strconv"

	"github.com/cortado-db/cortado/internal/storage"
	"github.com/redis/go-redis/v9"
)

// A partition's meta hash holds:
//
//	epoch  the partition's epoch: entries of another count for nothing
//	pos    the SCN the updater has written everything up to ("" while a
//	       snapshot is being loaded)
//	fresh  Redis time (µs) before which every acknowledged commit is in
//
// It has no TTL. Redis losing it, or any write of the updater's, shows
// as an epoch or position the updater did not leave, and the updater
// starts a new epoch.

// errLost says the partition's meta is not as the writer left it:
// another epoch began, or Redis lost writes.
var errLost = errors.New("cachetier: the partition's epoch or position changed under the writer")

// put is the last-writer-wins write of a batch (see putEntries).
var putScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[1], 'epoch', 'pos')
if m[1] ~= ARGV[1] then return -1 end
if ARGV[2] ~= '*' and m[2] ~= ARGV[2] then return -2 end
for i = 2, #KEYS do
  local o, v = ARGV[2*i+1], ARGV[2*i+2]
  local cur = redis.call('HGET', KEYS[i], 'o')
  if (not cur) or cur < o then
    redis.call('HSET', KEYS[i], 'o', o, 'v', v)
    redis.call('PEXPIRE', KEYS[i], ARGV[4])
  elseif cur == o then
    redis.call('PEXPIRE', KEYS[i], ARGV[4])
  end
end
if ARGV[3] ~= '*' then redis.call('HSET', KEYS[1], 'pos', ARGV[3]) end
return 1
`)

var initScript = redis.NewScript(`
local e = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HDEL', KEYS[1], 'fresh')
redis.call('HSET', KEYS[1], 'pos', '')
return e
`)

var freshScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[1], 'epoch', 'pos', 'fresh')
if m[1] ~= ARGV[1] or m[2] ~= ARGV[2] then return -1 end
if (not m[3]) or tonumber(m[3]) < tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[1], 'fresh', ARGV[3])
end
return 1
`)

// entry is one document's write: its table, key (keys.Encode), the SCN
// that wrote it, and its row (storage.AppendRow) — empty for a
// tombstone, or with known false for a placeholder.
type entry struct {
	table string
	key   []byte
	scn   storage.SCN
	row   []byte
	known bool
}

// anyPos is what putEntries' position arguments take for "do not check"
// and "do not set".
const anyPos = "*"

// maxBatch bounds the entries and bytes of one script call.
const (
	maxBatch      = 256
	maxBatchBytes = 4 << 20
)

// putEntries writes es in the partition's epoch, each only over an entry
// of an earlier order, refreshing the TTL of one of the same order. The
// first call checks that the partition's position is expect (anyPos: do
// not), the last sets it to set (anyPos: leave it); errLost if the epoch
// or position is not as expected.
func (t *Tier) putEntries(ctx context.Context, db string, part int, epoch int64, expect, set string, es []entry) error {
	ep := strconv.FormatInt(epoch, 10)
	ttl := strconv.FormatInt(t.opts.TTL.Milliseconds(), 10)
	meta := t.metaKey(db, part)
	for first := true; first || len(es) > 0; first = false {
		n, bytes := 0, 0
		for n < len(es) && n < maxBatch && (n == 0 || bytes+len(es[n].row) <= maxBatchBytes) {
			bytes += len(es[n].row)
			n++
		}
		keys := make([]string, 1, n+1)
		keys[0] = meta
		args := make([]any, 4, 4+2*n)
		args[0], args[1], args[2], args[3] = ep, expect, anyPos, ttl
		if n == len(es) {
			args[2] = set
		}
		for _, e := range es[:n] {
			keys = append(keys, t.docKey(db, part, e.table, e.key))
			args = append(args, order(epoch, e.scn, e.known), e.row)
		}
		wctx, cancel := context.WithTimeout(ctx, t.opts.WriteTimeout)
		r, err := putScript.Run(wctx, t.rdb, keys, args...).Int()
		cancel()
		t.observe(ctx, err)
		if err != nil {
			return err
		}
		if r < 0 {
			return errLost
		}
		es = es[n:]
		if set != anyPos {
			expect = set // later batches of this call: the position it set
		}
	}
	return nil
}

// meta reads a partition's epoch and position; ok false when Redis holds
// none.
func (t *Tier) meta(ctx context.Context, db string, part int) (epoch int64, pos string, ok bool, err error) {
	wctx, cancel := context.WithTimeout(ctx, t.opts.WriteTimeout)
	defer cancel()
	v, err := t.rdb.HMGet(wctx, t.metaKey(db, part), "epoch", "pos").Result()
	t.observe(ctx, err)
	if err != nil {
		return 0, "", false, err
	}
	e, _ := v[0].(string)
	p, okp := v[1].(string)
	if epoch, err = strconv.ParseInt(e, 10, 64); err != nil || !okp {
		return 0, "", false, nil
	}
	return epoch, p, true, nil
}

// newEpoch starts a partition's next epoch, with no position (a snapshot
// is being loaded) and no freshness.
func (t *Tier) newEpoch(ctx context.Context, db string, part int) (int64, error) {
	wctx, cancel := context.WithTimeout(ctx, t.opts.WriteTimeout)
	defer cancel()
	e, err := initScript.Run(wctx, t.rdb, []string{t.metaKey(db, part)}).Int64()
	t.observe(ctx, err)
	return e, err
}

// setFresh records that every commit acknowledged before Redis time
// at (µs) is in, if the partition is still at epoch and pos.
func (t *Tier) setFresh(ctx context.Context, db string, part int, epoch int64, pos string, at int64) error {
	wctx, cancel := context.WithTimeout(ctx, t.opts.WriteTimeout)
	defer cancel()
	r, err := freshScript.Run(wctx, t.rdb, []string{t.metaKey(db, part)}, strconv.FormatInt(epoch, 10), pos, strconv.FormatInt(at, 10)).Int()
	t.observe(ctx, err)
	if err == nil && r < 0 {
		err = errLost
	}
	return err
}

// now is Redis's time, in µs.
func (t *Tier) now(ctx context.Context) (int64, error) {
	wctx, cancel := context.WithTimeout(ctx, t.opts.WriteTimeout)
	defer cancel()
	tm, err := t.rdb.Time(wctx).Result()
	t.observe(ctx, err)
	return tm.UnixMicro(), err
}

package cachetier

import (
	"context"
	"errors"
	"hash/crc32"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/cachetier/redistest"
	"github.com/cortado-db/cortado/internal/storage"
)

func newTier(t *testing.T, o Options) (*Tier, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t)
	o.URL = srv.URL()
	tier, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tier.Close)
	return tier, srv
}

func row(v string, scn storage.SCN) []byte {
	d := storage.Doc{Version: 1, SCN: scn, Modified: time.Unix(1700000000, 0), CRC: crc32.ChecksumIEEE([]byte(v)), Value: []byte(v)}
	return storage.AppendRow(nil, &d)
}

// fresh makes the partition's entries current as of Redis's time now.
func fresh(t *testing.T, tier *Tier, epoch int64, pos string) {
	t.Helper()
	ctx := context.Background()
	now, err := tier.now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tier.setFresh(ctx, "d", 0, epoch, pos, now); err != nil {
		t.Fatal(err)
	}
}

// TestLastWriterWinsBySCN: an entry is replaced only by a later SCN, a
// tombstone or a placeholder reads as a miss, and entries of an earlier
// epoch count for nothing.
func TestLastWriterWinsBySCN(t *testing.T) {
	tier, _ := newTier(t, Options{})
	ctx := context.Background()
	epoch, err := tier.newEpoch(ctx, "d", 0)
	if err != nil {
		t.Fatal(err)
	}
	k := []byte("k")
	put := func(expect, set string, es ...entry) error {
		return tier.putEntries(ctx, "d", 0, epoch, expect, set, es)
	}
	get := func() (string, bool) {
		d, _, ok := tier.Get(ctx, "d", 0, "T", k, time.Minute)
		return string(d.Value), ok
	}
	s := func(seq uint64) storage.SCN { return storage.SCN{Gen: 1, Seq: seq} }
	if err := put("", "1:5", entry{table: "T", key: k, scn: s(5), row: row("five", s(5)), known: true}); err != nil {
		t.Fatal(err)
	}
	if _, ok := get(); ok {
		t.Fatal("an entry was read before the partition said how fresh it is")
	}
	fresh(t, tier, epoch, "1:5")
	if v, ok := get(); !ok || v != "five" {
		t.Fatalf("read %q %v, want five", v, ok)
	}
	// An older SCN (a bootstrapper's snapshot taken before) loses.
	if err := put(anyPos, anyPos, entry{table: "T", key: k, scn: s(3), row: row("three", s(3)), known: true}); err != nil {
		t.Fatal(err)
	}
	if v, _ := get(); v != "five" {
		t.Fatalf("an older commit replaced a newer one: %q", v)
	}
	// A placeholder at a later SCN: a miss, and the older value cannot
	// come back under it.
	if err := put(anyPos, anyPos, entry{table: "T", key: k, scn: s(7)}); err != nil {
		t.Fatal(err)
	}
	if v, ok := get(); ok {
		t.Fatalf("a placeholder read as %q", v)
	}
	put(anyPos, anyPos, entry{table: "T", key: k, scn: s(5), row: row("five", s(5)), known: true})
	if _, ok := get(); ok {
		t.Fatal("an older commit replaced a placeholder")
	}
	// The commit itself, at the placeholder's SCN, replaces it.
	if err := put("1:5", "1:7", entry{table: "T", key: k, scn: s(7), row: row("seven", s(7)), known: true}); err != nil {
		t.Fatal(err)
	}
	if v, _ := get(); v != "seven" {
		t.Fatalf("read %q, want seven", v)
	}
	// A tombstone.
	put("1:7", "1:8", entry{table: "T", key: k, scn: s(8), known: true})
	if v, ok := get(); ok {
		t.Fatalf("a deleted document read as %q", v)
	}
	// A writer whose position is not Redis's (Redis lost writes, or
	// another updater moved on) is refused.
	if err := put("1:5", "1:9"); !errors.Is(err, errLost) {
		t.Fatalf("a write from a stale position: %v", err)
	}
	// A new epoch: the old entries count for nothing, and the old
	// epoch's writer is refused.
	put("1:8", "1:9", entry{table: "T", key: k, scn: s(9), row: row("nine", s(9)), known: true})
	fresh(t, tier, epoch, "1:9")
	if v, _ := get(); v != "nine" {
		t.Fatalf("read %q, want nine", v)
	}
	next, err := tier.newEpoch(ctx, "d", 0)
	if err != nil || next != epoch+1 {
		t.Fatalf("new epoch %d, %v", next, err)
	}
	if v, ok := get(); ok {
		t.Fatalf("an entry of the earlier epoch read as %q", v)
	}
	if err := put(anyPos, anyPos, entry{table: "T", key: k, scn: s(10), row: row("ten", s(10)), known: true}); !errors.Is(err, errLost) {
		t.Fatalf("a write of the earlier epoch: %v", err)
	}
	if err := tier.setFresh(ctx, "d", 0, epoch, "1:9", 1); !errors.Is(err, errLost) {
		t.Fatalf("freshness of the earlier epoch: %v", err)
	}
}

// TestStalenessOnRedisClock: a read gets an entry only while its
// partition's freshness is within the read's max-stale, and is told how
// stale it may be.
func TestStalenessOnRedisClock(t *testing.T) {
	tier, _ := newTier(t, Options{})
	ctx := context.Background()
	epoch, _ := tier.newEpoch(ctx, "d", 0)
	scn := storage.SCN{Gen: 1, Seq: 1}
	if err := tier.putEntries(ctx, "d", 0, epoch, "", "1:1", []entry{{table: "T", key: []byte("k"), scn: scn, row: row("v", scn), known: true}}); err != nil {
		t.Fatal(err)
	}
	now, _ := tier.now(ctx)
	// Fresh as of 3 s ago.
	if err := tier.setFresh(ctx, "d", 0, epoch, "1:1", now-3_000_000); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := tier.Get(ctx, "d", 0, "T", []byte("k"), 2*time.Second); ok {
		t.Fatal("an entry 3 s stale answered a read accepting 2 s")
	}
	d, age, ok := tier.Get(ctx, "d", 0, "T", []byte("k"), 5*time.Second)
	if !ok || string(d.Value) != "v" || d.SCN != scn || age < 3*time.Second || age > 4*time.Second {
		t.Fatalf("read %q at %v, age %v, %v", d.Value, d.SCN, age, ok)
	}
	// Freshness never goes back.
	tier.setFresh(ctx, "d", 0, epoch, "1:1", now-10_000_000)
	if _, age, _ := tier.Get(ctx, "d", 0, "T", []byte("k"), time.Minute); age > 4*time.Second {
		t.Fatalf("freshness went back: age %v", age)
	}
	_, _, tooOld, _, _ := tier.Stats()
	if tooOld != 1 {
		t.Fatalf("too_old %d, want 1", tooOld)
	}
}

// TestHostileEntries: whatever Redis holds under a key, a read is a
// document that passes its checks or a miss.
func TestHostileEntries(t *testing.T) {
	tier, _ := newTier(t, Options{})
	ctx := context.Background()
	epoch, _ := tier.newEpoch(ctx, "d", 0)
	tier.putEntries(ctx, "d", 0, epoch, "", "1:1", nil)
	fresh(t, tier, epoch, "1:1")
	good := row("v", storage.SCN{Gen: 1, Seq: 1})
	bad := append([]byte(nil), good...)
	bad[len(bad)-1] ^= 1
	for _, c := range []struct{ name, o, v string }{
		{"a corrupt row", order(epoch, storage.SCN{Gen: 1, Seq: 1}, true), string(bad)},
		{"a short row", order(epoch, storage.SCN{Gen: 1, Seq: 1}, true), "x"},
		{"an order of another length", "1", string(good)},
		{"an order that is not digits", "x" + order(epoch, storage.SCN{Gen: 1, Seq: 1}, true)[1:], string(good)},
		{"a row of another SCN than its order", order(epoch, storage.SCN{Gen: 1, Seq: 2}, true), string(good)},
	} {
		key := tier.docKey("d", 0, "T", []byte("k"))
		if err := tier.rdb.HSet(ctx, key, "o", c.o, "v", c.v).Err(); err != nil {
			t.Fatal(err)
		}
		if d, _, ok := tier.Get(ctx, "d", 0, "T", []byte("k"), time.Minute); ok {
			t.Errorf("%s read as %q", c.name, d.Value)
		}
	}
}

// TestUnhealthyTierIsNotAsked: with Redis gone, a read waits at most
// ReadTimeout, and after Failures of them none asks Redis at all; once
// Redis answers again, reads ask it again.
func TestUnhealthyTierIsNotAsked(t *testing.T) {
	tier, srv := newTier(t, Options{ReadTimeout: 50 * time.Millisecond, Failures: 3, ProbeEvery: 50 * time.Millisecond})
	ctx := context.Background()
	if _, _, ok := tier.Get(ctx, "d", 0, "T", []byte("k"), time.Minute); ok || !tier.Healthy() {
		t.Fatal("an empty tier answered, or is unhealthy")
	}
	srv.Kill()
	for i := range 3 {
		start := time.Now()
		if _, _, ok := tier.Get(ctx, "d", 0, "T", []byte("k"), time.Minute); ok {
			t.Fatal("a dead Redis answered")
		}
		if took := time.Since(start); took > time.Second {
			t.Fatalf("read %d took %v with Redis dead", i, took)
		}
	}
	if tier.Healthy() {
		t.Fatal("three failed reads left the tier healthy")
	}
	_, _, _, failed, _ := tier.Stats()
	for range 100 {
		tier.Get(ctx, "d", 0, "T", []byte("k"), time.Minute)
	}
	_, _, _, failedAfter, skipped := tier.Stats()
	if failedAfter != failed || skipped != 100 {
		t.Fatalf("an unhealthy tier was asked: failed %d → %d, skipped %d", failed, failedAfter, skipped)
	}
	srv.Restart()
	deadline := time.Now().Add(10 * time.Second)
	for !tier.Healthy() {
		if time.Now().After(deadline) {
			t.Fatal("the tier stayed unhealthy 10 s after Redis came back")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestOnlyItsDatabases: a tier that holds some databases is not asked
// for another's documents (no Redis round trip, nothing counted), and
// answers for its own.
func TestOnlyItsDatabases(t *testing.T) {
	tier, _ := newTier(t, Options{Databases: []string{"d"}})
	ctx := context.Background()
	epoch, _ := tier.newEpoch(ctx, "d", 0)
	scn := storage.SCN{Gen: 1, Seq: 1}
	if err := tier.putEntries(ctx, "d", 0, epoch, "", "1:1", []entry{{table: "T", key: []byte("k"), scn: scn, row: row("v", scn), known: true}}); err != nil {
		t.Fatal(err)
	}
	fresh(t, tier, epoch, "1:1")
	if _, _, ok := tier.Get(ctx, "d", 0, "T", []byte("k"), time.Minute); !ok {
		t.Fatal("the tier did not answer for its database")
	}
	if _, _, ok := tier.Get(ctx, "other", 0, "T", []byte("k"), time.Minute); ok {
		t.Fatal("the tier answered for a database it does not hold")
	}
	hits, misses, tooOld, failed, skipped := tier.Stats()
	if hits != 1 || misses+tooOld+failed+skipped != 0 {
		t.Fatalf("stats %d %d %d %d %d: another database's read was counted", hits, misses, tooOld, failed, skipped)
	}
}

package cachetier

import (
	"strconv"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/storage"
)

// FuzzTierEntry: whatever Redis answers a read with (the entry's order
// and row, the partition's epoch and freshness, Redis's time), the read
// is a miss or a document whose row passes its checks, of the order's
// SCN and the partition's epoch, no staler than the read accepts.
func FuzzTierEntry(f *testing.F) {
	scn := storage.SCN{Gen: 1, Seq: 7}
	good := string(row("v", scn))
	f.Add(order(3, scn, true), good, "3", "1700000000000000", "1700000000", "500000", int64(time.Second))
	f.Add(order(3, scn, false), good, "3", "1700000000000000", "1700000000", "500000", int64(time.Second))
	f.Add(order(2, scn, true), good, "3", "1", "1", "1", int64(time.Hour))
	f.Add(order(3, scn, true), "", "3", "-1", "x", "", int64(0))
	f.Fuzz(func(t *testing.T, o, v, epoch, fresh, sec, usec string, maxStale int64) {
		tier := &Tier{}
		res := []any{o, v, epoch, fresh, sec, usec}
		d, age, ok := tier.entry(res, time.Duration(maxStale))
		if !ok {
			return
		}
		if age < 0 || age > time.Duration(maxStale) {
			t.Fatalf("age %v for a read accepting %v", age, time.Duration(maxStale))
		}
		back, err := storage.DecodeRow([]byte(v))
		if err != nil || back.SCN != d.SCN || string(back.Value) != string(d.Value) {
			t.Fatalf("answered a row that does not decode as answered: %v", err)
		}
		if len(o) != orderLen || o[orderLen-1] != '1' {
			t.Fatalf("answered an entry of order %q", o)
		}
		if e, err := strconv.ParseInt(o[:20], 10, 64); err != nil || strconv.FormatInt(e, 10) != epoch {
			t.Fatalf("answered an entry of order %q in epoch %q", o, epoch)
		}
	})
}

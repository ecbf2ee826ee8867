package jepsen

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/cortado-db/cortado/client"
)

// Backups backs database d up through the routers every few seconds for
// as long as the run lasts, as an operator's schedule would, and
// restores the first backup it takes into database "copy" (again after
// a failure, into what the failed attempt left). CheckBackups then holds
// each backup against what clients were told: every unique-key write
// acknowledged before a backup began is in it with its value, none begun
// after it ended is, none is that the database lost since; and the copy
// holds what its backup does.
type Backups struct {
	background // Stop stops backing up and waits for a backup or restore under way
	urls       []string

	mu       sync.Mutex
	taken    []backupTaken
	restored *backupTaken
	failed   int
	lastErr  string
}

// backupTaken is one backup: when it ran, and its unique-key writes
// (U/u-… → value).
type backupTaken struct {
	start, end time.Time
	rows       int
	u          map[string]int64
}

// StartBackups starts backing c's database up.
func StartBackups(c *Cluster) *Backups {
	b := &Backups{urls: c.routerURLs()}
	b.start(b.run)
	return b
}

func (b *Backups) run(ctx context.Context) {
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
		cl := client.New(b.urls[i%len(b.urls)])
		var buf bytes.Buffer
		start := time.Now()
		sum, err := cl.Backup(ctx, "d", &buf, nil)
		end := time.Now()
		if err != nil {
			if ctx.Err() == nil {
				b.fail(err)
			}
			continue
		}
		t := backupTaken{start: start, end: end, rows: sum.Rows, u: uniqueRows(buf.Bytes())}
		b.mu.Lock()
		b.taken = append(b.taken, t)
		first := b.restored == nil
		b.mu.Unlock()
		if first && b.restore(ctx, buf.Bytes()) {
			b.mu.Lock()
			b.restored = &t
			b.mu.Unlock()
		}
	}
}

// restore writes a backup into database "copy", again after a failure
// (a node down, a failover), for as long as the run lasts.
func (b *Backups) restore(ctx context.Context, backup []byte) bool {
	open := func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(backup)), nil }
	for attempt := 0; ctx.Err() == nil; attempt++ {
		cl := client.New(b.urls[attempt%len(b.urls)])
		_, err := cl.Restore(ctx, open, &client.RestoreOptions{As: "copy", Existing: attempt > 0})
		if err == nil {
			return true
		}
		b.fail(err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return false
}

func (b *Backups) fail(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failed++
	b.lastErr = err.Error()
}

// uniqueRows reads a backup's U/u-… rows: their one field, a long, is
// the Avro of the document.
func uniqueRows(backup []byte) map[string]int64 {
	out := map[string]int64{}
	for line := range bytes.Lines(backup) {
		if !bytes.HasPrefix(line, []byte(`{"type":"row","table":"U",`)) {
			continue
		}
		var r struct {
			Key  []string
			Avro []byte
		}
		if json.Unmarshal(line, &r) != nil || len(r.Key) != 1 || !strings.HasPrefix(r.Key[0], "u-") {
			continue
		}
		if v, n := binary.Varint(r.Avro); n == len(r.Avro) {
			out["U/"+r.Key[0]] = v
		}
	}
	return out
}

// Stats says how the backups went.
func (b *Backups) Stats() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	restored := "none restored"
	if b.restored != nil {
		restored = fmt.Sprintf("the one of %s restored into copy", b.restored.start.Format(stamp))
	}
	return fmt.Sprintf("%d backups, %d failed attempts (last: %q), %s", len(b.taken), b.failed, b.lastErr, restored)
}

// CheckBackups stops the backups and holds each against the history:
// an acknowledged unique-key write that ended before a backup began and
// is not in it (with its value) is lost to that backup; a unique key
// whose first write began after a backup ended and that is in it is an
// anomaly, and so is one the database no longer holds as the backup does
// (a write undone by a failover after the backup saved it); and so is a
// document of the restored backup that database "copy" does not hold as
// the backup does.
func CheckBackups(c *Cluster, h *History, b *Backups) (lost, anomalies []Anomaly) {
	b.Stop()
	firstStart := map[string]time.Time{}
	var acked []Op
	for _, op := range h.ops {
		if op.Kind != "put" {
			continue
		}
		k := "U/" + op.Key
		if s, ok := firstStart[k]; !ok || op.Start.Before(s) {
			firstStart[k] = op.Start
		}
		if op.Outcome == Ok {
			acked = append(acked, op)
		}
	}
	for _, t := range b.taken {
		for _, op := range acked {
			k := "U/" + op.Key
			if v, ok := t.u[k]; op.End.Before(t.start) && (!ok || v != op.Value) {
				lost = append(lost, Anomaly{op.End, "lost to a backup", fmt.Sprintf("%s=%d acknowledged at %s (scn %s); the backup begun at %s has %v (found %v)",
					k, op.Value, op.End.Format(stamp), op.SCN, t.start.Format(stamp), v, ok)})
			}
		}
		for k := range t.u {
			if s, ok := firstStart[k]; ok && s.After(t.end) {
				anomalies = append(anomalies, Anomaly{s, "backup", fmt.Sprintf("the backup that ended at %s holds %s, first written at %s", t.end.Format(stamp), k, s.Format(stamp))})
			}
		}
	}
	// A unique key is written once: one a backup holds that the database
	// does not, with that value, is a write the backup saved and a
	// failover then undid (a commit no replica had taken yet: a backup
	// waits until its replicas hold what it streams, as a read does).
	held := map[string]int64{}
	for _, t := range b.taken {
		for k, v := range t.u {
			held[k] = v
		}
	}
	saved := make([]string, 0, len(held))
	for k := range held {
		saved = append(saved, k)
	}
	readEach(c.routerURLs(), len(saved), func(i int) string { return "/d/" + saved[i] }, func(i int, v int64, found bool, err error) {
		switch {
		case err != nil:
			anomalies = append(anomalies, Anomaly{time.Now(), "unreadable", err.Error()})
		case !found || v != held[saved[i]]:
			anomalies = append(anomalies, Anomaly{time.Now(), "backup", fmt.Sprintf("a backup holds %s=%d, which the database does not (found %v, value %d): a write undone after the backup saved it", saved[i], held[saved[i]], found, v)})
		}
	})
	if r := b.restored; r != nil {
		keys := make([]string, 0, len(r.u))
		for k := range r.u {
			keys = append(keys, k)
		}
		readEach(c.routerURLs(), len(keys), func(i int) string { return "/copy/" + keys[i] }, func(i int, v int64, found bool, err error) {
			switch {
			case err != nil:
				anomalies = append(anomalies, Anomaly{time.Now(), "unreadable", err.Error()})
			case !found || v != r.u[keys[i]]:
				anomalies = append(anomalies, Anomaly{time.Now(), "restore", fmt.Sprintf("the backup has %s=%d; its restored copy has %d (found %v)", keys[i], r.u[keys[i]], v, found)})
			}
		})
	}
	return lost, anomalies
}

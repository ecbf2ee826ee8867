package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cortado-db/cortado/internal/keys"
)

// FormatVersion is the layout of a storage node's keyspace this binary
// writes, recorded in the engine (keys.Engine("format")) when it opens:
//
//   - 1: the commit log in the log space (keys.LogSpace, 2026-11-27); a
//     log found inside a partition's range, as before, is moved there
//     when the partition opens (migrateLog).
//
// A binary opens a keyspace of its own version or an earlier one, which
// it brings to its own as it goes, and refuses a later one
// (ErrNewerFormat): a release that reads a layout it does not know finds
// no commit log, or misreads it, and would serve and replicate from what
// it misread. Releases from before the record do not look for it; those
// from before 2026-11-27 do not read the log space (docs/operations.md,
// "Rolling upgrades").
const FormatVersion uint32 = 1

// ErrNewerFormat is returned by Open for a data directory written by a
// later release, in a layout this binary does not know.
var ErrNewerFormat = errors.New("storage: the data directory was written by a newer release")

var formatKey = keys.Engine("format")

// checkFormat refuses a keyspace of a later FormatVersion and records
// this binary's in one of an earlier or none (a new data directory, or
// one from before the record).
func checkFormat(db *pebble.DB, dir string) error {
	v, ok, err := engineRecord(db, formatKey)
	if err != nil {
		return fmt.Errorf("open pebble in %s: read the storage format: %w", dir, err)
	}
	if ok {
		if len(v) != 4 {
			return fmt.Errorf("open pebble in %s: the storage format's record is %d bytes, not 4: %w", dir, len(v), keys.ErrCorrupt)
		}
		stored := binary.BigEndian.Uint32(v)
		if stored > FormatVersion {
			return fmt.Errorf("%w: %s holds storage format %d, and this binary reads formats up to %d; run that release or a later one", ErrNewerFormat, dir, stored, FormatVersion)
		}
		if stored == FormatVersion {
			return nil
		}
	}
	if err := db.Set(formatKey, binary.BigEndian.AppendUint32(nil, FormatVersion), pebble.Sync); err != nil {
		return fmt.Errorf("open pebble in %s: record the storage format: %w", dir, err)
	}
	return nil
}

// engineRecord reads an engine-wide record (keys.Engine): a copy of its
// value, and whether there is one.
func engineRecord(db *pebble.DB, key []byte) ([]byte, bool, error) {
	v, closer, err := db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	defer closer.Close()
	return bytes.Clone(v), true, nil
}

// ErrOtherCluster is returned by Open for a data directory recorded for
// another cluster than Options.ClusterID.
var ErrOtherCluster = errors.New("storage: the data directory belongs to another cluster")

var clusterKey = keys.Engine("cluster")

// checkCluster records id (when given) in a keyspace that has no cluster
// recorded, and refuses one recorded for another, unless adopt.
func checkCluster(db *pebble.DB, dir, id string, adopt bool, log *slog.Logger) error {
	if id == "" {
		return nil
	}
	v, ok, err := engineRecord(db, clusterKey)
	if err != nil {
		return fmt.Errorf("open pebble in %s: read the cluster's identity: %w", dir, err)
	}
	if ok {
		stored := string(v)
		if stored == id {
			return nil
		}
		if !adopt {
			return fmt.Errorf("%w: %s holds the data of cluster %s, and this process joins cluster %s: give it its own directory, or an empty one; only if this directory is this cluster's and its etcd was rebuilt, start once with --adopt-data", ErrOtherCluster, dir, stored, id)
		}
		log.Warn("the data directory was recorded for another cluster; adopting it", "dir", dir, "was", stored, "cluster", id)
	}
	if err := db.Set(clusterKey, []byte(id), pebble.Sync); err != nil {
		return fmt.Errorf("open pebble in %s: record the cluster's identity: %w", dir, err)
	}
	return nil
}

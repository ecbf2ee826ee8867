package wire

import "fmt"

// Protocol versions. Version 1 reads commit logs by long polls (Log);
// version 2 adds StreamLog; version 3 adds Snapshot and trimmed logs (an
// answer that says trimmed also says the source does not hold the asker's
// SCN, so a version-2 slave whose position was trimmed waits, unharmed,
// until it is upgraded and rebuilds); version 4 adds queries (Scan's query
// and sort: a node of an older version would ignore them and answer a
// plain scan, so a router sends a query only to a node that speaks 4);
// version 5 reads escapes in patch paths (`\.`, `\\`: a node of an
// older version would take the backslash for part of a map key, so a
// router sends an escaped path only to a node that speaks 5); version 6
// adds the keepMark operation a restore writes (an older node would
// refuse it as unknown, so a router sends it only to a node that speaks
// 6); version 7 adds a snapshot that waits until its commits are
// replicated, as a read does (a backup's: an older node streams at once,
// and says it did not wait); version 8 reports in a partition's status
// the minInSync its node counts acknowledgements by, which the
// controller waits for before a raised minInSync counts in a failover
// (a router raises minInSync only when every storage node and
// controller registered speaks 8). MultiGetRequest's and ScanRequest's
// max_stale_nanos came without a version: an older slave ignores them
// and refuses the read as not master, which a router takes as a slave
// that cannot answer, and an older master answers as it always did;
// ScanResult's stale_nanos likewise (an older slave that answers a
// page sends none, and the page's Age then counts its documents only). A
// binary speaks [MinVersion, Version]; two binaries use the highest
// version both speak, so adjacent releases interoperate during a rolling
// upgrade.
const (
	MinVersion uint32 = 1
	Version    uint32 = 8
)

// Negotiate returns the highest version in both ranges, or an error when
// they do not overlap (a binary too old or too new to talk to).
func Negotiate(ourMin, ourMax, theirMin, theirMax uint32) (uint32, error) {
	v := min(ourMax, theirMax)
	if v < max(ourMin, theirMin) {
		return 0, fmt.Errorf("protocol versions do not overlap: this side speaks %d–%d, the other %d–%d", ourMin, ourMax, theirMin, theirMax)
	}
	return v, nil
}

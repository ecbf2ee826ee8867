package node

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/cortado-db/cortado/internal/keys"
	"github.com/cortado-db/cortado/internal/storage"
	"github.com/cortado-db/cortado/internal/wire"
)

// TestLargestCommitFitsAMessage: a log answer holds up to MaxLogBytes of
// commits and then one more, which may be as large as a commit gets
// (storage.MaxCommitBytes by Commit.Size). On the wire that must fit one
// message. The worst case is many tiny events, where the encoding's
// overhead per event weighs most: a collection's delete of documents of
// a byte each.
func TestLargestCommitFitsAMessage(t *testing.T) {
	c := storage.Commit{SCN: storage.SCN{Gen: 1 << 20, Seq: 1 << 40}, Timestamp: time.Now()}
	for i := range 1000 {
		c.Events = append(c.Events, storage.Event{Op: storage.OpDelete, Table: "T", Key: keys.Encode([]keys.Part{keys.S("g"), keys.I(int64(i))}),
			PrevVersion: 1000, PrevValue: []byte{1}, PrevSCN: storage.SCN{Gen: 1 << 20, Seq: 1 << 40}, PrevModified: time.Now(), WholeCollection: true})
	}
	onWire := proto.Size(commitTo(&c))
	ratio := float64(onWire) / float64(c.Size())
	largest := ratio*storage.MaxCommitBytes + MaxLogBytes*max(ratio, 1)
	if largest > wire.MaxMessageBytes {
		t.Fatalf("a commit of %d bytes by Commit.Size takes %d on the wire (%.2f×): a log answer may reach %.0f bytes, over the message bound of %d",
			c.Size(), onWire, ratio, largest, wire.MaxMessageBytes)
	}
	t.Logf("%.2f bytes on the wire a byte of Commit.Size; the largest log answer %.1f MiB of %d", ratio, largest/(1<<20), wire.MaxMessageBytes>>20)
}

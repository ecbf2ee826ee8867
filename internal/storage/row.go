package storage

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"strconv"
	"time"
)

// rowFormat is the first byte of every stored row; bump it to change the
// header layout.
const rowFormat = 1

// headerLen is the size of a row header:
// format(1) version(2) generation(4) sequence(8) modified(8) crc(4).
const headerLen = 27

// ErrCorruptRow is returned when a row fails its CRC or header check.
var ErrCorruptRow = errors.New("storage: corrupt document row")

// Doc is a stored document: its header and its Avro bytes, tagged with the
// schema version they were written with.
type Doc struct {
	Version  int
	SCN      SCN
	Modified time.Time
	// CRC is the CRC-32 (IEEE) of Value.
	CRC   uint32
	Value []byte
}

// ETag renders the entity tag of the document: the SCN of the commit
// that wrote it and the CRC of its bytes, in hex ("1.2f.41d912ff"). The
// SCN names one version for good: commits are numbered along the
// partition's timeline, and a read never shows a commit a failover could
// undo, so two versions never share a tag — as two with the same CRC-32
// did, by chance one in 2³² or by a writer who chose its bytes (CRC-32 is
// linear), letting an If-Match write over a version it was not read from.
// The CRC tells apart what one transaction wrote twice to a key.
func (d *Doc) ETag() string {
	var b [40]byte
	t := append(b[:0], '"')
	t = strconv.AppendUint(t, uint64(d.SCN.Gen), 16)
	t = append(t, '.')
	t = strconv.AppendUint(t, d.SCN.Seq, 16)
	t = append(t, '.')
	const hex = "0123456789abcdef"
	for i := 7; i >= 0; i-- {
		t = append(t, hex[d.CRC>>(4*i)&0xf])
	}
	return string(append(t, '"'))
}

func encodeRow(dst []byte, d *Doc) []byte {
	dst = append(dst, rowFormat)
	dst = binary.BigEndian.AppendUint16(dst, uint16(d.Version))
	dst = binary.BigEndian.AppendUint32(dst, d.SCN.Gen)
	dst = binary.BigEndian.AppendUint64(dst, d.SCN.Seq)
	dst = binary.BigEndian.AppendUint64(dst, uint64(d.Modified.UnixNano()))
	dst = binary.BigEndian.AppendUint32(dst, d.CRC)
	return append(dst, d.Value...)
}

// encodeRow encodes d for a batch, which copies it, into the partition's
// buffer (a buffer grown past a large document's size is not kept). The
// caller holds mu; the bytes are good until its next call.
func (p *Partition) encodeRow(d *Doc) []byte {
	b := encodeRow(p.row[:0], d)
	p.row = b
	if cap(b) > 64<<10 {
		p.row = nil
	}
	return b
}

// decodeRow parses a row; Value aliases b.
func decodeRow(b []byte) (Doc, error) {
	if len(b) < headerLen || b[0] != rowFormat {
		return Doc{}, ErrCorruptRow
	}
	d := Doc{
		Version:  int(binary.BigEndian.Uint16(b[1:])),
		SCN:      SCN{Gen: binary.BigEndian.Uint32(b[3:]), Seq: binary.BigEndian.Uint64(b[7:])},
		Modified: time.Unix(0, int64(binary.BigEndian.Uint64(b[15:]))),
		CRC:      binary.BigEndian.Uint32(b[23:]),
		Value:    b[headerLen:],
	}
	if crc32.ChecksumIEEE(d.Value) != d.CRC {
		return Doc{}, ErrCorruptRow
	}
	return d, nil
}

// AppendRow appends d as a stored row (its header, then its bytes): the
// form a document takes outside the store too (the Redis cache tier).
func AppendRow(dst []byte, d *Doc) []byte { return encodeRow(dst, d) }

// DecodeRow parses a row AppendRow made, checking its header and CRC;
// Value aliases b.
func DecodeRow(b []byte) (Doc, error) { return decodeRow(b) }

package storage

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
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
	// CRC is the CRC-32 (IEEE) of Value; the ETag.
	CRC   uint32
	Value []byte
}

// ETag renders the entity tag of the document.
func (d *Doc) ETag() string {
	const hex = "0123456789abcdef"
	b := [10]byte{0: '"', 9: '"'}
	for i := range 8 {
		b[8-i] = hex[d.CRC>>(4*i)&0xf]
	}
	return string(b[:])
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

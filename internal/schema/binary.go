package schema

import (
	"encoding/binary"
	"errors"
	"math"
)

// errShort is returned when Avro bytes end in the middle of a value.
var errShort = errors.New("avro data truncated")

// errLength is returned for a negative or absurd length prefix.
var errLength = errors.New("avro length out of range")

// decoder walks Avro binary. It never allocates.
type decoder struct {
	b []byte
	i int
}

func (d *decoder) long() (int64, error) {
	v, n := binary.Uvarint(d.b[d.i:])
	if n <= 0 {
		return 0, errShort
	}
	d.i += n
	return int64(v>>1) ^ -int64(v&1), nil
}

func (d *decoder) need(n int) error {
	if n < 0 || d.i+n > len(d.b) || d.i+n < d.i {
		return errShort
	}
	return nil
}

func (d *decoder) bytes() ([]byte, error) {
	n, err := d.long()
	if err != nil {
		return nil, err
	}
	if n < 0 || n > int64(len(d.b)) {
		return nil, errLength
	}
	if err := d.need(int(n)); err != nil {
		return nil, err
	}
	b := d.b[d.i : d.i+int(n)]
	d.i += int(n)
	return b, nil
}

func (d *decoder) fixed(n int) ([]byte, error) {
	if err := d.need(n); err != nil {
		return nil, err
	}
	b := d.b[d.i : d.i+n]
	d.i += n
	return b, nil
}

func (d *decoder) float() (float32, error) {
	b, err := d.fixed(4)
	if err != nil {
		return 0, err
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(b)), nil
}

func (d *decoder) double() (float64, error) {
	b, err := d.fixed(8)
	if err != nil {
		return 0, err
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(b)), nil
}

// blockCount reads an array or map block header. A negative count is followed
// by the block's size in bytes, which callers may use to skip the block.
func (d *decoder) blockCount() (count int64, size int64, err error) {
	count, err = d.long()
	if err != nil {
		return 0, 0, err
	}
	if count < 0 {
		if count == math.MinInt64 {
			return 0, 0, errLength
		}
		count = -count
		if size, err = d.long(); err != nil {
			return 0, 0, err
		}
		if size < 0 {
			return 0, 0, errLength
		}
	}
	// Every item takes at least zero bytes, so a count cannot be checked
	// against the remaining length; cap it to keep loops bounded.
	if count > int64(len(d.b))*8+1024 {
		return 0, 0, errLength
	}
	return count, size, nil
}

func appendLong(dst []byte, v int64) []byte {
	return binary.AppendUvarint(dst, uint64(v<<1)^uint64(v>>63))
}

func appendBytes(dst, b []byte) []byte {
	dst = appendLong(dst, int64(len(b)))
	return append(dst, b...)
}

func appendFloat(dst []byte, f float32) []byte {
	return binary.LittleEndian.AppendUint32(dst, math.Float32bits(f))
}

func appendDouble(dst []byte, f float64) []byte {
	return binary.LittleEndian.AppendUint64(dst, math.Float64bits(f))
}

package schema

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
)

// errShort is returned when Avro bytes end in the middle of a value.
var errShort = errors.New("avro data truncated")

// errVarint is returned for a varint longer than ten bytes. (hamba/avro's
// skip stops after the maximum length and reads on from the middle.)
var errVarint = errors.New("avro varint too long")

// errIntRange is returned for an int, enum index or union index whose
// varint does not fit 32 bits. (hamba/avro silently wraps such values.)
var errIntRange = errors.New("avro int out of 32-bit range")

// errBadBool is returned for a boolean byte other than 0 or 1. (hamba/avro
// refuses it when reading but not when skipping.)
var errBadBool = errors.New("avro boolean is neither 0 nor 1")

// boolean reads one boolean.
func (d *decoder) boolean() (bool, error) {
	b, err := d.fixed(1)
	if err != nil {
		return false, err
	}
	if b[0] > 1 {
		return false, errBadBool
	}
	return b[0] == 1, nil
}

// errNegativeLength is returned for a negative bytes or string length.
// (hamba/avro reads it as empty.)
var errNegativeLength = errors.New("avro negative length")

// errBlockSize is returned when an array or map block's recorded byte size
// disagrees with its items. (hamba/avro ignores the size when decoding.)
var errBlockSize = errors.New("avro block size disagrees with its items")

// errLength is returned for an absurd length or block count.
var errLength = errors.New("avro length out of range")

// decoders are pooled: a decoder escapes to the heap (plans are chains of
// closures), and a read path that allocates nothing per document needs
// them reused.
var decoders = sync.Pool{New: func() any { return new(decoder) }}

func getDecoder(b []byte) *decoder {
	d := decoders.Get().(*decoder)
	d.b, d.i, d.depth, d.utf8, d.limit, d.items = b, 0, 0, false, MaxDepth(), 0
	return d
}

func putDecoder(d *decoder) {
	d.b = nil
	decoders.Put(d)
}

// decoder walks Avro binary. It never allocates.
type decoder struct {
	b     []byte
	i     int
	depth int // records, arrays and maps entered (see nest)
	limit int // MaxDepth when the decoder was taken
	// utf8 makes strings and map keys that are not valid UTF-8 an
	// error (validating input) instead of U+FFFD in JSON (reading).
	utf8 bool
	// items counts the array and map items the blocks read so far claim
	// (see blockCount).
	items int64
}

// DefaultMaxDepth is how deeply records, arrays and maps may nest in a
// document unless SetMaxDepth says otherwise: every path that decodes,
// validates, converts or writes a document refuses more (ErrTooDeep), so
// no input can exhaust the stack or make one request cost memory in
// proportion to its nesting.
const DefaultMaxDepth = 100

// maxDepth is the limit in force, for the whole process: documents
// accepted under it must stay readable, so it is set once at start.
var maxDepth atomic.Int64

func init() { maxDepth.Store(DefaultMaxDepth) }

// SetMaxDepth sets the nesting limit (8 to 1000) for the process; call it
// before serving.
func SetMaxDepth(n int) error {
	if n < 8 || n > 1000 {
		return fmt.Errorf("the nesting limit must be between 8 and 1000, got %d", n)
	}
	maxDepth.Store(int64(n))
	return nil
}

// MaxDepth returns the nesting limit in force.
func MaxDepth() int { return int(maxDepth.Load()) }

// ErrTooDeep is returned for a document nested deeper than MaxDepth.
var ErrTooDeep = errors.New("document nests records, arrays and maps deeper than the limit")

// tooDeep names the limit in force.
func tooDeep(path string) *FieldError {
	return fieldErr(path, "%v (%d levels)", ErrTooDeep, MaxDepth())
}

// errNotUTF8 is a string or map key of an incoming document that is not
// valid UTF-8 (Avro strings are UTF-8; storing it would store something
// else than reads give back).
var errNotUTF8 = errors.New("string is not valid UTF-8")

// nest counts one level of nesting around f (a record, array or map).
func nest(path string, f func(*decoder, []byte) ([]byte, error)) func(*decoder, []byte) ([]byte, error) {
	return func(d *decoder, dst []byte) ([]byte, error) {
		if d.depth >= d.limit {
			return dst, tooDeep(path)
		}
		d.depth++
		out, err := f(d, dst)
		d.depth--
		return out, err
	}
}

// nestSkip is nest for a step over a discarded or copied value.
func nestSkip(f skipFn) skipFn {
	return func(d *decoder) error {
		if d.depth >= d.limit {
			return tooDeep("")
		}
		d.depth++
		err := f(d)
		d.depth--
		return err
	}
}

func (d *decoder) long() (int64, error) {
	v, n := binary.Uvarint(d.b[d.i:])
	if n == 0 {
		if len(d.b)-d.i >= binary.MaxVarintLen64 {
			// Ten bytes, each saying another follows: too long,
			// whatever comes after them.
			return 0, errVarint
		}
		return 0, errShort
	}
	if n < 0 {
		return 0, errVarint
	}
	d.i += n
	return int64(v>>1) ^ -int64(v&1), nil
}

// int reads a long that must fit an Avro int (also enum and union indexes)
// in at most five bytes.
func (d *decoder) int() (int64, error) {
	start := d.i
	if rest := d.b[d.i:]; len(rest) >= 5 && rest[0]&rest[1]&rest[2]&rest[3]&rest[4]&0x80 != 0 {
		return 0, errIntRange // not terminated within five bytes
	}
	v, err := d.long()
	if err == nil && (v < math.MinInt32 || v > math.MaxInt32 || d.i-start > 5) {
		return 0, errIntRange
	}
	return v, err
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
	if n < 0 {
		return nil, errNegativeLength
	}
	if n > int64(len(d.b)-d.i) {
		return nil, errShort
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
	// Every item takes at least zero bytes (a null, an empty record), so
	// a count cannot be checked against the remaining length; the items
	// of all the document's blocks together are capped to keep loops
	// bounded (maxItems). A cap per block let a body of 5.5 KB of block
	// headers, each claiming the most, claim 44 million nulls: 13 s and
	// 2.9 GB.
	if count > maxItems(len(d.b))-d.items { // compared so, the sum cannot overflow
		return 0, 0, errLength
	}
	d.items += count
	return count, size, nil
}

// maxItems is the most array and map items a document of n bytes may
// hold: one a byte, and 1,024 more. Only an item of no bytes (a null, a
// record of no fields) can make a document hold more, and the shortest
// encoding of more than 1,024 of them is refused too, wherever it is
// decoded again (the router's conversion writes one block of them, which
// the storage node validates). Eight a byte let a padded body of 2 MB
// claim 16 million nulls, rendered and converted at 1.2 GB.
func maxItems(n int) int64 { return int64(n) + 1024 }

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

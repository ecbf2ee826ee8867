package changes

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"hash/fnv"
	"slices"

	"github.com/cortado-db/cortado/internal/storage"
)

// Position is where a consumer is in one partition's timeline: every
// event up to SCN delivered, and the first Skip events of the commit after
// it (a stream cut inside a transaction resumes inside it, without
// repeating what was delivered).
type Position struct {
	SCN  storage.SCN
	Skip int
}

// Token is a consumer's resume point: a position per partition. Its text
// form is opaque to consumers: a version byte, a hash of the database
// name (a token is refused on another database), then (partition,
// generation, sequence, skip) varints, in base64url.
type Token map[int]Position

const tokenVersion = 1

// MaxTokenBytes bounds a token's text (4096 partitions fit).
const MaxTokenBytes = 96 << 10

// ErrBadToken is returned for a token that is not one this database's
// stream gave.
var ErrBadToken = errors.New("not a change-stream token of this database")

func dbHash(db string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(db))
	return h.Sum32()
}

// Encode returns the token's text.
func (t Token) Encode(db string) string {
	parts := make([]int, 0, len(t))
	for p := range t {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	w := tokenWriter{hash: dbHash(db)}
	return string(w.encode(parts, func(p int) Position { return t[p] }))
}

// tokenWriter encodes tokens, reusing its buffers: a stream encodes one
// per event.
type tokenWriter struct {
	hash     uint32
	raw, out []byte
}

// encode returns the text of the token holding pos(p) for each of parts
// (ascending); it is valid until the next call.
func (w *tokenWriter) encode(parts []int, pos func(int) Position) []byte {
	b := append(w.raw[:0], tokenVersion)
	b = binary.BigEndian.AppendUint32(b, w.hash)
	for _, p := range parts {
		at := pos(p)
		b = binary.AppendUvarint(b, uint64(p))
		b = binary.AppendUvarint(b, uint64(at.SCN.Gen))
		b = binary.AppendUvarint(b, at.SCN.Seq)
		b = binary.AppendUvarint(b, uint64(at.Skip))
	}
	w.raw = b
	w.out = base64.RawURLEncoding.AppendEncode(w.out[:0], b)
	return w.out
}

// ParseToken reads a token of database db with partitions partitions.
func ParseToken(db string, partitions int, text string) (Token, error) {
	if len(text) > MaxTokenBytes {
		return nil, ErrBadToken
	}
	b, err := base64.RawURLEncoding.DecodeString(text)
	if err != nil || len(b) < 5 || b[0] != tokenVersion || binary.BigEndian.Uint32(b[1:]) != dbHash(db) {
		return nil, ErrBadToken
	}
	b = b[5:]
	t := Token{}
	next := func() (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	for len(b) > 0 {
		p, ok1 := next()
		gen, ok2 := next()
		seq, ok3 := next()
		skip, ok4 := next()
		if !ok1 || !ok2 || !ok3 || !ok4 || p >= uint64(partitions) || gen > 1<<32-1 || skip > 1<<31 {
			return nil, ErrBadToken
		}
		if _, dup := t[int(p)]; dup {
			return nil, ErrBadToken
		}
		t[int(p)] = Position{SCN: storage.SCN{Gen: uint32(gen), Seq: seq}, Skip: int(skip)}
	}
	return t, nil
}

package client

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// decodeEvent reads one change-stream line. Its documents (before and
// after, nearly all of an event's bytes) become slices of the event's one
// copy of the line, found by a single scan that checks their JSON; the
// envelope's small members are read as encoding/json reads them. A line
// the scan does not expect (escaped names, deep nesting, bad JSON) is read
// by json.Unmarshal instead, which says what is wrong with it: the result
// is the same either way (TestDecodeEventMatchesUnmarshal), at about a
// quarter of the cost (BenchmarkDecodeEvent).
func decodeEvent(line []byte) (*ChangeEvent, error) {
	raw := append(json.RawMessage(nil), line...)
	e := &ChangeEvent{Raw: raw}
	if scanEvent(raw, e) {
		return e, nil
	}
	*e = ChangeEvent{Raw: raw}
	if err := json.Unmarshal(raw, e); err != nil {
		return nil, err
	}
	return e, nil
}

// scanEvent fills e from b, reporting false where it cannot vouch for the
// result.
func scanEvent(b []byte, e *ChangeEvent) bool {
	end, ok := eachMember(b, skipSpace(b, 0), e.set)
	return ok && skipSpace(b, end) == len(b)
}

// eachMember passes the object at b[i], calling set with each member's
// name and value (valid JSON) until set refuses one; it returns the
// object's end and whether it was one and every member was taken. Names
// are plain ASCII without escapes.
func eachMember(b []byte, i int, set func(name, v []byte) bool) (int, bool) {
	if i >= len(b) || b[i] != '{' {
		return i, false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, true
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return i, false
		}
		start := i + 1
		i = start
		for i < len(b) && b[i] != '"' {
			if c := b[i]; c == '\\' || c < 0x20 || c >= 0x80 {
				return i, false
			}
			i++
		}
		if i >= len(b) {
			return i, false
		}
		name := b[start:i]
		i = skipSpace(b, i+1)
		if i >= len(b) || b[i] != ':' {
			return i, false
		}
		i = skipSpace(b, i+1)
		end, ok := skipValue(b, i, 0)
		if !ok || !set(name, b[i:end]) {
			return i, false
		}
		i = skipSpace(b, end)
		if i >= len(b) {
			return i, false
		}
		if b[i] == '}' {
			return i + 1, true
		}
		if b[i] != ',' {
			return i, false
		}
		i = skipSpace(b, i+1)
	}
}

// otherName reports whether a name none of a struct's fields takes is
// ignored: unless it is one of known in other letter cases, which
// encoding/json would take for it.
func otherName(name []byte, known []string) bool {
	for _, k := range known {
		if bytes.EqualFold(name, []byte(k)) {
			return false
		}
	}
	return true
}

// set stores one member's value v (valid JSON) as json.Unmarshal would.
func (e *ChangeEvent) set(name, v []byte) bool {
	isNull := string(v) == "null"
	switch string(name) {
	case "before":
		e.Before = v
		return true
	case "after":
		e.After = v
		return true
	case "type":
		return isNull || plainString(v, &e.Type)
	case "op":
		return isNull || plainString(v, &e.Op)
	case "token":
		return isNull || plainString(v, &e.Token)
	case "status":
		return isNull || plainString(v, &e.Status)
	case "id":
		return isNull || plainString(v, &e.ID)
	case "ts_ms":
		if isNull {
			return true
		}
		n, err := strconv.ParseInt(string(v), 10, 64)
		e.TsMs = n
		return err == nil
	case "source":
		return isNull || object(v, e.Source.set)
	case "transaction":
		if isNull {
			e.Transaction = nil
			return true
		}
		if e.Transaction == nil {
			e.Transaction = &ChangeTransaction{}
		}
		return object(v, e.Transaction.set)
	case "event_count":
		return json.Unmarshal(v, &e.EventCount) == nil
	}
	return otherName(name, eventNames)
}

var eventNames = []string{"before", "after", "type", "op", "token", "status", "id", "ts_ms", "source", "transaction", "event_count"}

func (t *ChangeTransaction) set(name, v []byte) bool {
	if string(v) == "null" {
		return true
	}
	var err error
	switch string(name) {
	case "id":
		return plainString(v, &t.ID)
	case "total_order":
		t.TotalOrder, err = strconv.Atoi(string(v))
	case "data_collection_order":
		t.DataCollectionOrder, err = strconv.Atoi(string(v))
	default:
		return otherName(name, transactionNames)
	}
	return err == nil
}

var transactionNames = []string{"id", "total_order", "data_collection_order"}

// object passes the object v, all of it, to set member by member.
func object(v []byte, set func(name, v []byte) bool) bool {
	end, ok := eachMember(v, 0, set)
	return ok && end == len(v)
}

func (s *ChangeSource) set(name, v []byte) bool {
	if string(v) == "null" {
		// null empties the key and leaves the other fields as they are.
		if bytes.EqualFold(name, []byte("key")) {
			s.Key = nil
		}
		return true
	}
	var err error
	switch string(name) {
	case "db":
		return plainString(v, &s.DB)
	case "table":
		return plainString(v, &s.Table)
	case "scn":
		return plainString(v, &s.SCN)
	case "snapshot":
		return plainString(v, &s.Snapshot)
	case "partition":
		s.Partition, err = strconv.Atoi(string(v))
	case "schemaVersion":
		s.SchemaVersion, err = strconv.Atoi(string(v))
	case "ts_ms":
		s.TsMs, err = strconv.ParseInt(string(v), 10, 64)
	case "sequence":
		s.Sequence, err = strconv.ParseUint(string(v), 10, 64)
	case "generation":
		var n uint64
		n, err = strconv.ParseUint(string(v), 10, 32)
		s.Generation = uint32(n)
	case "key":
		return s.scanKey(v)
	default:
		return otherName(name, sourceNames)
	}
	return err == nil
}

var sourceNames = []string{"db", "table", "key", "partition", "scn", "generation", "sequence", "schemaVersion", "ts_ms", "snapshot"}

// scanKey reads a key of plain strings and integers (as encoding/json
// reads them into a Key: strings and float64s).
func (s *ChangeSource) scanKey(v []byte) bool {
	k := Key{}
	ok := scanArray(v, func(part []byte) bool {
		if part[0] == '"' {
			var str string
			if !plainString(part, &str) {
				return false
			}
			k = append(k, str)
			return true
		}
		n, err := strconv.ParseInt(string(part), 10, 64)
		if err != nil || n > 1<<53 || n < -(1<<53) || n == 0 && part[0] == '-' {
			return false // a float64 would round it, or it is -0
		}
		k = append(k, float64(n))
		return true
	})
	if ok {
		s.Key = k
	}
	return ok
}

// plainString reads a JSON string without escapes or non-ASCII bytes.
func plainString(v []byte, dst *string) bool {
	if len(v) < 2 || v[0] != '"' {
		return false
	}
	for _, c := range v[1 : len(v)-1] {
		if c == '\\' || c >= 0x80 {
			return false
		}
	}
	*dst = string(v[1 : len(v)-1])
	return true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// maxScanDepth bounds the nesting the scan follows; deeper values go to
// json.Unmarshal.
const maxScanDepth = 64

// skipValue returns the end of the JSON value at b[i], and whether it is
// one.
func skipValue(b []byte, i, depth int) (int, bool) {
	if i >= len(b) || depth > maxScanDepth {
		return i, false
	}
	switch c := b[i]; {
	case c == '"':
		return skipString(b, i)
	case c == '{' || c == '[':
		closing := byte('}')
		if c == '[' {
			closing = ']'
		}
		i = skipSpace(b, i+1)
		if i < len(b) && b[i] == closing {
			return i + 1, true
		}
		for {
			if c == '{' {
				end, ok := skipString(b, i)
				if !ok {
					return i, false
				}
				i = skipSpace(b, end)
				if i >= len(b) || b[i] != ':' {
					return i, false
				}
				i = skipSpace(b, i+1)
			}
			end, ok := skipValue(b, i, depth+1)
			if !ok {
				return i, false
			}
			i = skipSpace(b, end)
			if i >= len(b) {
				return i, false
			}
			if b[i] == closing {
				return i + 1, true
			}
			if b[i] != ',' {
				return i, false
			}
			i = skipSpace(b, i+1)
		}
	case c == 't':
		return literal(b, i, "true")
	case c == 'f':
		return literal(b, i, "false")
	case c == 'n':
		return literal(b, i, "null")
	default:
		return skipNumber(b, i)
	}
}

func literal(b []byte, i int, word string) (int, bool) {
	if len(b)-i >= len(word) && string(b[i:i+len(word)]) == word {
		return i + len(word), true
	}
	return i, false
}

// skipString passes a string, checking its escapes and that it holds no
// control characters. Other bytes pass as encoding/json's scanner lets
// them, invalid UTF-8 too: a raw value keeps them as they are, and a
// string decoded into a Go string goes through plainString, which takes
// ASCII only, or json.Unmarshal, which replaces invalid bytes.
func skipString(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '"' {
		return i, false
	}
	for i++; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1, true
		case c < 0x20:
			return i, false
		case c == '\\':
			i++
			if i >= len(b) {
				return i, false
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if len(b)-i < 5 {
					return i, false
				}
				for _, h := range b[i+1 : i+5] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return i, false
					}
				}
				i += 4
			default:
				return i, false
			}
		}
	}
	return i, false
}

// skipNumber passes a number in JSON's grammar.
func skipNumber(b []byte, i int) (int, bool) {
	digits := func() bool {
		start := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i > start
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	if i < len(b) && b[i] == '0' {
		i++
	} else if !digits() {
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if !digits() {
			return i, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if !digits() {
			return i, false
		}
	}
	return i, true
}

package client

import (
	"encoding/json"
	"strconv"
)

// scanPage fills pj from a page b as the server writes it, reporting
// false where it cannot vouch for the result; parsePage then decodes b
// with encoding/json, which says what is wrong with it. The result is
// the same either way (TestParsePageMatchesDecoder). Documents, nearly
// all of a page's bytes, are found by one scan that checks their JSON
// and copied once each, where encoding/json scanned each twice: half of
// an embedded client's small query was its page's decoding.
func scanPage(b []byte, pj *pageJSON) bool {
	var seen members
	end, ok := eachMember(b, skipSpace(b, 0), func(name, v []byte) bool {
		isNull := string(v) == "null"
		switch string(name) {
		case "documents":
			if !seen.first(0) {
				return false // encoding/json merges a repeated array into the first
			}
			if isNull {
				return true
			}
			return scanArray(v, func(item []byte) bool {
				var d docJSON
				if !scanDoc(item, &d) {
					return false
				}
				pj.Documents = append(pj.Documents, d)
				return true
			})
		case "next":
			return seen.first(1) && (isNull || anyString(v, &pj.Next))
		case "missing":
			return seen.first(2) && decodeNumbers(v, &pj.Missing)
		case "missingPartitions":
			return seen.first(3) && json.Unmarshal(v, &pj.MissingPartitions) == nil
		case "replica":
			return seen.first(4) && (isNull || anyString(v, &pj.Replica))
		case "age":
			return seen.first(5) && json.Unmarshal(v, &pj.Age) == nil
		}
		return otherName(name, pageNames)
	})
	return ok && end > 0
}

// members records which of an object's known members a scan has met: a
// repeated one is left to encoding/json, which merges or replaces as it
// does.
type members uint8

// first reports whether member i is met for the first time.
func (m *members) first(i uint) bool {
	was := *m&(1<<i) != 0
	*m |= 1 << i
	return !was
}

var (
	pageNames = []string{"documents", "next", "missing", "missingPartitions", "replica", "age"}
	docNames  = []string{"key", "etag", "scn", "lastModified", "document"}
)

// decodeNumbers decodes v as parsePage's decoder does (numbers as
// json.Number).
func decodeNumbers(v []byte, dst any) bool {
	dec := json.NewDecoder(bytesReader(v))
	dec.UseNumber()
	return dec.Decode(dst) == nil
}

// scanDoc reads one document of a page.
func scanDoc(b []byte, d *docJSON) bool {
	var seen members
	return object(b, func(name, v []byte) bool {
		isNull := string(v) == "null"
		switch string(name) {
		case "key":
			return seen.first(0) && !isNull && scanPageKey(v, &d.Key)
		case "etag":
			return seen.first(1) && (isNull || anyString(v, &d.ETag))
		case "scn":
			return seen.first(2) && (isNull || anyString(v, &d.SCN))
		case "lastModified":
			return seen.first(3) && d.LastModified.UnmarshalJSON(v) == nil
		case "document":
			if !seen.first(4) {
				return false
			}
			d.Document = append(json.RawMessage(nil), v...)
			return true
		}
		return otherName(name, docNames)
	})
}

// scanPageKey reads a key of strings and integers, as the decoder and
// Key.normalize leave it: strings, and int64s.
func scanPageKey(v []byte, k *Key) bool {
	out := Key{}
	ok := scanArray(v, func(part []byte) bool {
		if part[0] == '"' {
			var s string
			if !anyString(part, &s) {
				return false
			}
			out = append(out, s)
			return true
		}
		n, err := strconv.ParseInt(string(part), 10, 64)
		out = append(out, n)
		return err == nil
	})
	*k = out
	return ok
}

// anyString reads a JSON string, with escapes (an ETag's quotes) or not.
func anyString(v []byte, dst *string) bool {
	return plainString(v, dst) || len(v) > 0 && v[0] == '"' && json.Unmarshal(v, dst) == nil
}

// scanArray passes each item of the array v, all of it, to item.
func scanArray(v []byte, item func([]byte) bool) bool {
	if len(v) < 2 || v[0] != '[' {
		return false
	}
	i := skipSpace(v, 1)
	if i < len(v) && v[i] == ']' {
		return i+1 == len(v)
	}
	for i < len(v) {
		end, ok := skipValue(v, i, 0)
		if !ok || !item(v[i:end]) {
			return false
		}
		i = skipSpace(v, end)
		if i < len(v) && v[i] == ']' {
			return i+1 == len(v)
		}
		if i >= len(v) || v[i] != ',' {
			return false
		}
		i = skipSpace(v, i+1)
	}
	return false
}

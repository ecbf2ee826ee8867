package schema

import (
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestHostile runs testdata/hostile: inputs a hostile client can send,
// each of which must end in a clear error (or ok) in bounded time and
// memory, never a crash, a hang or a silently different stored value.
//
//	version          one schema text: NewVersion
//	evolve           schema texts separated by ~~~: each version, each
//	                 evolution and the plans both ways
//	json             a schema, ~~~, a JSON document: DecodeJSON+EncodeJSON
//	max-depth n=N    SetMaxDepth(N) for the cases that follow
//	avro             a schema, ~~~, a document as hex: Version.Validate
//	deep-schema n=N  a record whose field is N nested arrays
//	dag-schema n=N   N records, each with two fields of the one before:
//	                 two versions, their compatibility, the plans both ways
//	nested-json n=N  a Node {v, next} schema's document N levels deep, as JSON
//	nested-avro n=N  the same as Avro binary: validation, the JSON writer,
//	                 and a plan to a later version
func TestHostile(t *testing.T) {
	const node = `{"type":"record","name":"Node","fields":[{"name":"v","type":"int"},{"name":"next","type":["null","Node"],"default":null}]}`
	const node2 = `{"type":"record","name":"Node","fields":[{"name":"v","type":"long"},{"name":"next","type":["null","Node"],"default":null},{"name":"w","type":"int","default":1}]}`
	defer SetMaxDepth(DefaultMaxDepth)
	datadriven.RunTest(t, "testdata/hostile", func(t *testing.T, d *datadriven.TestData) string {
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		out := run(t, d, node, node2)
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
			t.Fatalf("%s: allocated %d MB", d.Pos, grew>>20)
		}
		return out + "\n"
	})
}

func run(t *testing.T, d *datadriven.TestData, node, node2 string) string {
	result := func(err error) string {
		if err != nil {
			return "error: " + err.Error()
		}
		return "ok"
	}
	switch d.Cmd {
	case "version":
		_, err := NewVersion(1, d.Input)
		return result(err)
	case "evolve":
		var vs []*Version
		for i, text := range strings.Split(d.Input, "~~~") {
			v, err := NewVersion(i+1, text)
			if err != nil {
				return fmt.Sprintf("version %d: %s", i+1, result(err))
			}
			vs = append(vs, v)
		}
		for i := 1; i < len(vs); i++ {
			if err := CheckLevel(Full, vs[i-1:i], vs[i]); err != nil {
				return fmt.Sprintf("evolve %d→%d: %s", i, i+1, result(err))
			}
			if _, err := NewPlan(vs[i-1].Schema, vs[i].Schema); err != nil {
				return fmt.Sprintf("plan %d→%d: %s", i, i+1, result(err))
			}
			if _, err := NewPlan(vs[i].Schema, vs[i-1].Schema); err != nil {
				return fmt.Sprintf("plan %d→%d: %s", i+1, i, result(err))
			}
		}
		return "ok"
	case "json":
		text, doc, _ := strings.Cut(d.Input, "~~~")
		v, err := NewVersion(1, text)
		if err != nil {
			return "schema: " + result(err)
		}
		tree, err := DecodeJSON([]byte(strings.TrimSpace(doc)))
		if err != nil {
			return result(err)
		}
		b, err := EncodeJSON(nil, v.Schema, tree)
		if err != nil {
			return result(err)
		}
		js, err := v.JSON.Append(nil, b)
		if err != nil {
			return result(err)
		}
		return "ok " + string(js)
	case "max-depth":
		var n int
		d.ScanArgs(t, "n", &n)
		return result(SetMaxDepth(n))
	case "avro":
		text, hexBytes, _ := strings.Cut(d.Input, "~~~")
		v, err := NewVersion(1, text)
		if err != nil {
			return "schema: " + result(err)
		}
		b, err := hex.DecodeString(strings.TrimSpace(hexBytes))
		if err != nil {
			t.Fatal(err)
		}
		return result(v.Validate(b))
	case "deep-schema":
		var n int
		d.ScanArgs(t, "n", &n)
		text := `{"type":"record","name":"R","fields":[{"name":"a","type":` + strings.Repeat(`{"type":"array","items":`, n) + `"int"` + strings.Repeat(`}`, n) + `}]}`
		_, err := NewVersion(1, text)
		return result(err)
	case "dag-schema":
		// Each record holds two fields of the record before: 2^n paths
		// through a text of n lines. Whatever walks it by expansion
		// never ends; registration, evolution and plans must not.
		var n int
		d.ScanArgs(t, "n", &n)
		dag := func(extra string) string {
			s := `{"type":"record","name":"R0","fields":[{"name":"x","type":"int"}` + extra + `]}`
			for i := 1; i <= n; i++ {
				s = fmt.Sprintf(`{"type":"record","name":"R%d","fields":[{"name":"a","type":%s},{"name":"b","type":"R%d"}%s]}`, i, s, i-1, extra)
			}
			return s
		}
		v1, err := NewVersion(1, dag(""))
		if err != nil {
			return result(err)
		}
		v2, err := NewVersion(2, dag(`,{"name":"y","type":"long","default":0}`))
		if err != nil {
			return result(err)
		}
		if err := CheckLevel(Full, []*Version{v1}, v2); err != nil {
			return result(err)
		}
		if _, err := NewPlan(v1.Schema, v2.Schema); err != nil {
			return result(err)
		}
		_, err = NewPlan(v2.Schema, v1.Schema)
		return result(err)
	case "nested-json":
		var n int
		d.ScanArgs(t, "n", &n)
		v, _ := NewVersion(1, node)
		doc := strings.Repeat(`{"v":1,"next":`, n) + `{"v":1,"next":null}` + strings.Repeat(`}`, n)
		tree, err := DecodeJSON([]byte(doc))
		if err != nil {
			return result(err)
		}
		_, err = EncodeJSON(nil, v.Schema, tree)
		return result(err)
	case "nested-avro":
		var n int
		d.ScanArgs(t, "n", &n)
		v1, _ := NewVersion(1, node)
		v2, _ := NewVersion(2, node2)
		// Each level: v=1 (zigzag 2), union branch 1 (zigzag 2); then the
		// last v and branch 0 (null).
		b := strings.Repeat("\x02\x02", n) + "\x02\x00"
		var out []string
		out = append(out, "validate: "+result(v1.Validate([]byte(b))))
		_, err := v1.JSON.Append(nil, []byte(b))
		out = append(out, "json: "+result(err))
		p, err := NewPlan(v1.Schema, v2.Schema)
		if err != nil {
			return result(err)
		}
		_, err = p.Apply(nil, []byte(b))
		out = append(out, "plan: "+result(err))
		return strings.Join(out, "\n")
	}
	t.Fatalf("unknown command %s", d.Cmd)
	return ""
}

// TestItemsOfNoBytes: items that take no bytes (nulls, records of no
// fields) are counted across all of a document's blocks. A body of 5.5
// KB of block headers, each claiming the most items its remaining bytes
// allowed, claimed 44 million nulls (13 s and 2.9 GB in a server before
// the count was the document's); now it is refused at once. Documents
// whose items take a byte or more are never near the bound.
func TestItemsOfNoBytes(t *testing.T) {
	v, err := NewVersion(1, `{"type":"record","name":"N","fields":[{"name":"a","type":{"type":"array","items":"null"}},{"name":"b","type":{"type":"array","items":"boolean"},"default":[]}]}`)
	if err != nil {
		t.Fatal(err)
	}
	// Back to front, so that each count is the most the bytes after it
	// allowed per block.
	body := appendLong(appendLong(nil, 0), 0)
	for range 2000 {
		body = append(appendLong(nil, maxItems(len(body))), body...)
	}
	if err := v.Validate(body); !errors.Is(err, errLength) {
		t.Fatalf("%d bytes of block headers: %v", len(body), err)
	}
	// 1,024 nulls in one block are a document; more are not.
	for n, ok := range map[int64]bool{1024: true, 1030: false} {
		body := appendLong(appendLong(appendLong(nil, n), 0), 0)
		if err := v.Validate(body); (err == nil) != ok {
			t.Errorf("%d nulls: %v", n, err)
		}
	}
	// In JSON, the field is named where the document arrives.
	for n, ok := range map[int]bool{1000: true, 1100: false} {
		_, err := EncodeJSON(nil, v.Schema, map[string]any{"a": make([]any, n)})
		var fe *FieldError
		if (err == nil) != ok || !ok && (!errors.As(err, &fe) || fe.Path != "a") {
			t.Errorf("%d nulls in JSON: %v", n, err)
		}
	}
	// A million booleans, a byte each, are a document.
	body = appendLong(appendLong(nil, 0), 1000000)
	for range 1000000 {
		body = append(body, 1)
	}
	if err := v.Validate(append(body, 0)); err != nil {
		t.Fatalf("a million booleans: %v", err)
	}
}

// TestShowName: a name from a request is shown as it is when valid, and
// otherwise quoted and cut, so that an error naming it stays short
// whatever was asked for.
func TestShowName(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"demo", "demo"},
		{"", `""`},
		{"a b", `"a b"`},
		{"0" + strings.Repeat("\xce", 200), `"0` + strings.Repeat(`\xce`, 36) + `"…`},
		{strings.Repeat("x", 129), `"` + strings.Repeat("x", 37) + `"…`},
	} {
		if got := ShowName(c.in); got != c.want {
			t.Errorf("ShowName(%.50q) = %s, want %s", c.in, got, c.want)
		}
	}
}

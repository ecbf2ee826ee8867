package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/hamba/avro/v2"

	"github.com/cortado-db/cortado/internal/keys"
)

func mustVersion(t testing.TB, n int, file string) *Version {
	t.Helper()
	text, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewVersion(n, string(text))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func profileTable(t testing.TB) *Table {
	return &Table{Database: "d", Name: "Profile", Key: []KeyPart{{Name: "id", Type: "string"}},
		Versions: []*Version{
			mustVersion(t, 1, "testdata/profile_v1.avsc"),
			mustVersion(t, 2, "testdata/profile_v2.avsc"),
			mustVersion(t, 3, "testdata/profile_v3.avsc"),
		}}
}

func encodeFile(t testing.TB, s avro.Schema, file string) []byte {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	v, err := DecodeJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	b, err := EncodeJSON(nil, s, v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func jsonEqual(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, got)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

func TestJSONRoundTrip(t *testing.T) {
	tbl := profileTable(t)
	v1 := tbl.Version(1)
	b := encodeFile(t, v1.Schema, "testdata/profile.json")
	// The bytes must be what hamba's own encoder accepts as valid Avro.
	var generic any
	if err := avro.Unmarshal(v1.Schema, b, &generic); err != nil {
		t.Fatalf("hamba cannot decode our encoding: %v", err)
	}
	out, err := v1.JSON.Append(nil, b)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile("testdata/profile.json")
	jsonEqual(t, out, string(want))
	// Field order is the schema's.
	if !bytes.HasPrefix(out, []byte(`{"firstName":`)) {
		t.Fatalf("field order lost: %s", out)
	}
}

// TestEvolution reads version-1 bytes as versions 2 and 3, and checks the
// plan against hamba's Resolve + decode of the same bytes.
func TestEvolution(t *testing.T) {
	tbl := profileTable(t)
	b1 := encodeFile(t, tbl.Version(1).Schema, "testdata/profile.json")
	plans := NewPlans(16)
	for _, rv := range []int{2, 3} {
		p, err := plans.Plan(tbl, 1, rv, nil)
		if err != nil {
			t.Fatal(err)
		}
		out, err := p.Apply(nil, b1)
		if err != nil {
			t.Fatalf("v1→v%d: %v", rv, err)
		}
		reader := tbl.Version(rv).Schema
		resolved, err := avro.NewSchemaCompatibility().Resolve(reader, tbl.Version(1).Schema)
		if err != nil {
			t.Fatal(err)
		}
		var ref, ours any
		if err := avro.Unmarshal(resolved, b1, &ref); err != nil {
			t.Fatal(err)
		}
		if err := avro.Unmarshal(reader, out, &ours); err != nil {
			t.Fatalf("plan output is not valid v%d Avro: %v", rv, err)
		}
		if !reflect.DeepEqual(ref, ours) {
			t.Fatalf("v1→v%d differs from hamba:\nours %v\nref  %v", rv, ours, ref)
		}
	}
	// Version 3 view of a version 1 document: nickname dropped, age
	// promoted, connections and tags defaulted.
	p, _ := plans.Plan(tbl, 1, 3, []string{"age", "connections", "tags", "lastName"})
	out, err := p.Apply(nil, b1)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := plans.Reader(tbl, 3, []string{"age", "connections", "tags", "lastName"})
	j, _ := js.JSON.Append(nil, out)
	jsonEqual(t, j, `{"lastName":"Lovelace <&>","age":36,"connections":0,"tags":[]}`)
	// And down: version 3 bytes read as version 1: nickname gets its
	// default, the promoted age narrows back to int.
	p13, _ := plans.Plan(tbl, 1, 3, nil)
	b3, _ := p13.Apply(nil, b1)
	p31, err := plans.Plan(tbl, 3, 1, []string{"nickname", "age"})
	if err != nil {
		t.Fatal(err)
	}
	out, err = p31.Apply(nil, b3)
	if err != nil {
		t.Fatal(err)
	}
	js, _ = plans.Reader(tbl, 1, []string{"nickname", "age"})
	j, _ = js.JSON.Append(nil, out)
	jsonEqual(t, j, `{"age":36,"nickname":"none"}`)
	// A long that no longer fits an int fails, naming the field.
	big := encodeFile(t, tbl.Version(3).Schema, "testdata/profile_v3_bigage.json")
	if _, err := p31.Apply(nil, big); err == nil || err.(*FieldError).Path != "age" {
		t.Fatalf("narrowing an out-of-range long: %v", err)
	}
}

func TestIdentityPlanCopies(t *testing.T) {
	tbl := profileTable(t)
	p, err := NewPlan(tbl.Version(1).Schema, tbl.Version(1).Schema)
	if err != nil || !p.Identity() {
		t.Fatalf("same schema should give an identity plan: %v", err)
	}
}

func TestValidationNamesField(t *testing.T) {
	v1 := profileTable(t).Version(1)
	base, _ := os.ReadFile("testdata/profile.json")
	cases := []struct {
		name, patch, path string
	}{
		{"wrong type", `{"age":"old"}`, "age"},
		{"int overflow", `{"age":3000000000}`, "age"},
		{"fraction for int", `{"age":1.5}`, "age"},
		{"unknown field", `{"shoeSize":44}`, "shoeSize"},
		{"nested wrong type", `{"positions":{"p1":{"title":1,"company":"c","years":1}}}`, "positions.p1.title"},
		{"nested missing", `{"education":[{"degree":"BA"}]}`, "education[0].school"},
		{"bad enum", `{"status":"GONE"}`, "status"},
		{"bad base64", `{"avatar":"!!"}`, "avatar"},
		{"bare general union", `{"extra":5}`, "extra"},
		{"null for required", `{"lastName":null}`, "lastName"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var doc, patch map[string]any
			json.Unmarshal(base, &doc)
			json.Unmarshal([]byte(tc.patch), &patch)
			for k, v := range patch {
				doc[k] = v
			}
			raw, _ := json.Marshal(doc)
			v, err := DecodeJSON(raw)
			if err != nil {
				t.Fatal(err)
			}
			_, err = EncodeJSON(nil, v1.Schema, v)
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Path != tc.path {
				t.Fatalf("want error at %s, got %v", tc.path, err)
			}
		})
	}
	var doc map[string]any
	json.Unmarshal(base, &doc)
	delete(doc, "lastName")
	raw, _ := json.Marshal(doc)
	v, _ := DecodeJSON(raw)
	if _, err := EncodeJSON(nil, v1.Schema, v); err == nil || err.(*FieldError).Path != "lastName" {
		t.Fatalf("missing required field: %v", err)
	}
	if _, err := DecodeJSON([]byte(`{"a":`)); err == nil {
		t.Fatal("malformed JSON accepted")
	}
}

func TestEvolutionUnderFull(t *testing.T) {
	tbl := profileTable(t)
	for i := 1; i < 3; i++ {
		if err := checkFull(tbl.Version(i).Schema, tbl.Version(i+1).Schema); err != nil {
			t.Fatalf("v%d→v%d: %v", i, i+1, err)
		}
	}
	bad := []struct{ text, path string }{
		// New required field without default.
		{`{"type":"record","name":"Profile","namespace":"demo","fields":[{"name":"lastName","type":"string"},{"name":"x","type":"int"}]}`, "x"},
		// Type narrowed.
		{`{"type":"record","name":"Profile","namespace":"demo","fields":[{"name":"lastName","type":"int"}]}`, "lastName"},
	}
	prev := mustParse(t, `{"type":"record","name":"Profile","namespace":"demo","fields":[{"name":"lastName","type":"string"}]}`)
	for _, b := range bad {
		err := checkFull(prev, mustParse(t, b.text))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Path != b.path {
			t.Fatalf("want refusal naming %s, got %v", b.path, err)
		}
	}
	// Removing a required field (no default) breaks old readers.
	old := mustParse(t, `{"type":"record","name":"R","fields":[{"name":"a","type":"int"},{"name":"b","type":"int"}]}`)
	next := mustParse(t, `{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}`)
	if err := checkFull(old, next); err == nil || err.(*FieldError).Path != "b" {
		t.Fatalf("removing a required field: %v", err)
	}
}

// checkFull checks next against prev under FULL, the default level.
func checkFull(prev, next avro.Schema) error {
	return CheckLevel(Full, []*Version{{Number: 1, Schema: prev}}, &Version{Number: 2, Schema: next})
}

func mustParse(t testing.TB, text string) avro.Schema {
	t.Helper()
	s, err := Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The partitioning function is part of the on-disk and wire contract:
// changing it moves every document. These values must never change.
func TestPartitionOfIsStable(t *testing.T) {
	d := &Database{Partitions: 64}
	got := []int{d.PartitionOf(keys.S("alice")), d.PartitionOf(keys.S("bob")), d.PartitionOf(keys.I(42)), d.PartitionOf(keys.S(""))}
	want := []int{46, 1, 61, 20}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("partition function changed: got %v, want %v", got, want)
	}
}

// PartitionOf's hash is hash/fnv's FNV-1a written out, for every key
// (long strings, NUL bytes, negative and extreme integers), and costs no
// allocation for a key whose encoding fits its buffer.
func TestPartitionOfIsFNV1a(t *testing.T) {
	d := &Database{Partitions: 64}
	r := rand.New(rand.NewPCG(1, 2))
	parts := []keys.Part{keys.I(0), keys.I(-1), keys.I(math.MinInt64), keys.I(math.MaxInt64), keys.S(""), keys.S("a\x00b"), keys.S(strings.Repeat("x", 300))}
	for range 2000 {
		parts = append(parts, keys.I(int64(r.Uint64())))
		b := make([]byte, r.IntN(100))
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		parts = append(parts, keys.S(string(b)))
	}
	for _, p := range parts {
		h := fnv.New32a()
		h.Write(keys.AppendPart(nil, p))
		if got, want := d.PartitionOf(p), int(h.Sum32()%64); got != want {
			t.Fatalf("PartitionOf(%v) = %d, hash/fnv gives %d", p, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { d.PartitionOf(keys.S("alice")); d.PartitionOf(keys.I(42)) }); n != 0 {
		t.Fatalf("PartitionOf allocated %v times a call", n)
	}
}

// TestJSONWriterMatchesReference checks the direct Avro→JSON writer
// against hamba/avro decode + encoding/json on whole documents.
func TestJSONWriterMatchesReference(t *testing.T) {
	for _, tc := range []struct{ schema, doc string }{
		{"testdata/profile_v1.avsc", "testdata/profile.json"},
		{"testdata/bench_profile_v1.avsc", "testdata/bench_profile.json"},
	} {
		v := mustVersion(t, 1, tc.schema)
		b := encodeFile(t, v.Schema, tc.doc)
		js, err := v.JSON.Append(nil, b)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := referenceJSON(nil, v.Schema, b)
		if err != nil {
			t.Fatal(err)
		}
		var got any
		if err := json.Unmarshal(js, &got); err != nil {
			t.Fatalf("%s: not JSON: %v", tc.doc, err)
		}
		if !reflect.DeepEqual(got, ref) {
			t.Fatalf("%s: JSON writer and hamba+encoding/json differ", tc.doc)
		}
	}
}

// TestRangePartitioning checks range partitions: a boundary begins its
// partition, keys order as their encoding does, and bad definitions are
// refused.
func TestRangePartitioning(t *testing.T) {
	d := &Database{Name: "r", Partitioning: "range", Boundaries: []json.RawMessage{[]byte(`"g"`), []byte(` "n"`), []byte(`"t"`)}}
	if err := d.Normalize(); err != nil {
		t.Fatal(err)
	}
	if d.Partitions != 4 || string(d.Boundaries[1]) != `"n"` {
		t.Fatalf("normalized to %d partitions, boundaries %s", d.Partitions, d.Boundaries)
	}
	for k, want := range map[string]int{"": 0, "alice": 0, "g": 1, "gz": 1, "m": 1, "n": 2, "nancy": 2, "t": 3, "zed": 3} {
		if got := d.PartitionOf(keys.S(k)); got != want {
			t.Errorf("partition of %q = %d, want %d", k, got, want)
		}
	}
	n := &Database{Name: "n", Partitioning: "range", Boundaries: []json.RawMessage{[]byte(`-5`), []byte(`100`)}}
	if err := n.Normalize(); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[int64]int{-6: 0, -5: 1, 0: 1, 99: 1, 100: 2, 1 << 40: 2} {
		if got := n.PartitionOf(keys.I(k)); got != want {
			t.Errorf("partition of %d = %d, want %d", k, got, want)
		}
	}
	if err := n.CheckPartitionKey(KeyPart{Name: "id", Type: keys.String}); err == nil {
		t.Error("a string partition key was accepted for integer boundaries")
	}
	if err := n.CheckPartitionKey(KeyPart{Name: "id", Type: keys.Long}); err != nil {
		t.Error(err)
	}
	for _, bad := range []string{`{"partitioning":"range"}`, `{"partitioning":"range","boundaries":["b","a"]}`,
		`{"partitioning":"range","boundaries":["a",1]}`, `{"partitioning":"range","boundaries":[1.5]}`,
		`{"partitioning":"range","boundaries":["a"],"partitions":3}`, `{"boundaries":["a"]}`, `{"partitioning":"list"}`} {
		var d Database
		if err := json.Unmarshal([]byte(bad), &d); err != nil {
			t.Fatal(err)
		}
		d.Name = "x"
		if err := d.Normalize(); err == nil {
			t.Errorf("%s was accepted", bad)
		}
	}
}

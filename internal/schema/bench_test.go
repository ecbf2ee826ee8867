package schema

import (
	"encoding/json"
	"testing"

	"github.com/hamba/avro/v2"
)

// benchProfile is a ~20 KB profile-like document (40 top-level fields,
// locale maps, a map of positions, an array of education records) written
// with version 1 of testdata/bench_profile_v*.avsc.
func benchProfile(b *testing.B) (*Table, []byte) {
	b.Helper()
	t := &Table{Database: "bench", Name: "Profile", Key: []KeyPart{{Name: "id", Type: "long"}},
		Versions: []*Version{
			mustVersion(b, 1, "testdata/bench_profile_v1.avsc"),
			mustVersion(b, 2, "testdata/bench_profile_v2.avsc"),
			mustVersion(b, 3, "testdata/bench_profile_v3.avsc"),
		}}
	return t, encodeFile(b, t.Version(1).Schema, "testdata/bench_profile.json")
}

func benchPlan(b *testing.B, w, r int, fields []string) {
	t, doc := benchProfile(b)
	p, err := NewPlans(16).Plan(t, w, r, fields)
	if err != nil {
		b.Fatal(err)
	}
	out := make([]byte, 0, len(doc)+1024)
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if out, err = p.Apply(out[:0], doc); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkProjectThreeFields projects three top-level fields of the 20 KB
// document, binary to binary.
func BenchmarkProjectThreeFields(b *testing.B) {
	benchPlan(b, 1, 1, []string{"firstName", "headline", "industry"})
}

// BenchmarkProjectPositionsTitle projects one field of every value of a
// map of records.
func BenchmarkProjectPositionsTitle(b *testing.B) {
	benchPlan(b, 1, 1, []string{"positions.title"})
}

// BenchmarkUpconvertV1ToV3 up-converts the whole document from version 1
// to version 3 (a removed field, an added field, a promotion).
func BenchmarkUpconvertV1ToV3(b *testing.B) { benchPlan(b, 1, 3, nil) }

// BenchmarkUpconvertV1ToV3ToJSON is a read of an old document as the
// latest version in JSON: up-conversion then the JSON writer.
func BenchmarkUpconvertV1ToV3ToJSON(b *testing.B) {
	t, doc := benchProfile(b)
	p, _ := NewPlans(16).Plan(t, 1, 3, nil)
	js := t.Version(3).JSON
	var buf, out []byte
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		var err error
		if buf, err = p.Apply(buf[:0], doc); err != nil {
			b.Fatal(err)
		}
		if out, err = js.Append(out[:0], buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkJSONWriter writes the whole document as JSON from its bytes.
func BenchmarkJSONWriter(b *testing.B) {
	t, doc := benchProfile(b)
	js := t.Version(1).JSON
	var out []byte
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		var err error
		if out, err = js.Append(out[:0], doc); err != nil {
			b.Fatal(err)
		}
	}
}

// benchHamba measures hamba/avro's generic path for reading the document
// as reader: Resolve (once), then decode into map[string]any per document.
func benchHamba(b *testing.B, reader func(*Table) avro.Schema) {
	t, doc := benchProfile(b)
	resolved, err := avro.NewSchemaCompatibility().Resolve(reader(t), t.Version(1).Schema)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		var v any
		if err := avro.Unmarshal(resolved, doc, &v); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHambaUpconvertReference is the generic path for
// BenchmarkUpconvertV1ToV3.
func BenchmarkHambaUpconvertReference(b *testing.B) {
	benchHamba(b, func(t *Table) avro.Schema { return t.Version(3).Schema })
}

func projected(fields ...string) func(*Table) avro.Schema {
	return func(t *Table) avro.Schema {
		s, err := Project(t.Version(1).Schema, fields)
		if err != nil {
			panic(err)
		}
		return s
	}
}

// BenchmarkHambaProjectThreeFieldsReference is the generic path for
// BenchmarkProjectThreeFields.
func BenchmarkHambaProjectThreeFieldsReference(b *testing.B) {
	benchHamba(b, projected("firstName", "headline", "industry"))
}

// BenchmarkHambaProjectPositionsTitleReference is the generic path for
// BenchmarkProjectPositionsTitle.
func BenchmarkHambaProjectPositionsTitleReference(b *testing.B) {
	benchHamba(b, projected("positions.title"))
}

// BenchmarkHambaDecodeJSONReference is the generic path to JSON: hamba
// decode into map[string]any, then encoding/json.
func BenchmarkHambaDecodeJSONReference(b *testing.B) {
	t, doc := benchProfile(b)
	s := t.Version(1).Schema
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		var v any
		if err := avro.Unmarshal(s, doc, &v); err != nil {
			b.Fatal(err)
		}
		if _, err := json.Marshal(v); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncodeJSON validates and encodes the JSON document (the write
// path of a PUT).
func BenchmarkEncodeJSON(b *testing.B) {
	t, doc := benchProfile(b)
	js, _ := t.Version(1).JSON.Append(nil, doc)
	s := t.Version(1).Schema
	var out []byte
	b.SetBytes(int64(len(js)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		v, err := DecodeJSON(js)
		if err != nil {
			b.Fatal(err)
		}
		if out, err = EncodeJSON(out[:0], s, v); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRegisterRecursiveSchema parses two versions of a recursive
// record (a linked list, v promoted int → long and a field added) and
// checks the evolution under FULL_TRANSITIVE: what registering it costs.
// (Before the visited set was keyed by type names, this never finished.)
func BenchmarkRegisterRecursiveSchema(b *testing.B) {
	v1 := `{"type":"record","name":"Node","fields":[{"name":"v","type":"int"},{"name":"next","type":["null","Node"],"default":null},{"name":"kids","type":{"type":"array","items":"Node"},"default":[]}]}`
	v2 := `{"type":"record","name":"Node","fields":[{"name":"v","type":"long"},{"name":"next","type":["null","Node"],"default":null},{"name":"kids","type":{"type":"array","items":"Node"},"default":[]},{"name":"tag","type":"string","default":""}]}`
	b.ReportAllocs()
	for range b.N {
		a, err := NewVersion(1, v1)
		if err != nil {
			b.Fatal(err)
		}
		c, err := NewVersion(2, v2)
		if err != nil {
			b.Fatal(err)
		}
		if err := CheckLevel(FullTransitive, []*Version{a}, c); err != nil {
			b.Fatal(err)
		}
	}
}

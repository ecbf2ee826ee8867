package client

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// pageBodies are pages as servers send them, and pages no server should
// send.
var pageBodies = []string{
	`{"documents":[{"key":["alice",1],"etag":"\"903fa68d\"","scn":"1:1","lastModified":"2026-11-29T18:15:29.080312524Z","document":{"subject":"hello world 1"}},{"key":["alice",2],"etag":"\"0c3bf395+v2\"","scn":"1:2","lastModified":"2026-11-29T18:15:29.089545006Z","document":{"subject":"hello","n":[1,2.5e-3,-0,true,null,{"b":"\u00e9\n\"q\""}]}}],"next":"AWJuvrkAAY"}`,
	`{"documents":[{"key":["été","a\u0000b",-7],"etag":"\"1\"","scn":"2:9","lastModified":"2026-01-02T03:04:05Z","document":null}],"missing":[["x",3],[9223372036854775807]],"missingPartitions":[3,7]}`,
	`{"documents":[]}`, `{"documents":null}`, `{}`, ` { "documents" : [ { "key" : [ 1 ] , "document" : { } } ] } `,
	`{"documents":[],"missing":[],"replica":"slave","age":3}`, `{"replica":null,"age":-4}`, `{"age":99999999999999999}`, `{"age":1.5}`,
	`{"replica":"a","replica":"b"}`, `{"Replica":"slave","AGE":2}`,
	`{"documents":[]} trailing`, `{"documents":[]}x`, `{"Documents":[]}`, `{"documents":[{"KEY":[1]}]}`, `{"documents":[{"Document":{}}]}`,
	`{"documents":[{"key":[1]}],"documents":[{"etag":"\"x\""}]}`, `{"documents":[{"key":[1],"key":["a"]}]}`,
	`{"documents":[{"etag":"a","etag":"b"}]}`, `{"next":"a","next":null}`, `{"missing":[],"missing":null}`,
	`{"documents":[null]}`, `{"documents":[1]}`, `{"documents":[[]]}`, `{"documents":{}}`, `{"documents":"x"}`,
	`{"documents":[{"key":null}]}`, `{"documents":[{"key":[]}]}`, `{"documents":[{"key":[1.5]}]}`, `{"documents":[{"key":[1e2]}]}`,
	`{"documents":[{"key":[99999999999999999999]}]}`, `{"documents":[{"key":[-0]}]}`, `{"documents":[{"key":[true,null,{}]}]}`,
	`{"documents":[{"key":["\ud800"]}]}`, `{"documents":[{"key":["` + "\xff" + `"]}]}`, `{"documents":[{"key":[1,]}]}`,
	`{"documents":[{"etag":null,"scn":null,"lastModified":null,"document":null,"key":["a"]}]}`,
	`{"documents":[{"etag":1}]}`, `{"documents":[{"etag":"\u0041"}]}`, `{"documents":[{"scn":"é"}]}`,
	`{"documents":[{"lastModified":"yesterday"}]}`, `{"documents":[{"lastModified":5}]}`, `{"documents":[{"lastModified":"2026-11-29T18:15:29+01:00"}]}`,
	`{"documents":[{"document":01}]}`, `{"documents":[{"document":{"a":}}]}`, `{"documents":[{"document":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}]}`,
	`{"documents":[{"document":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `,"key":[1]}]}`,
	`{"missing":[[1.5]]}`, `{"missing":[["a"]],"x":{"y":[[[1]]]}}`, `{"missing":{}}`, `{"missingPartitions":[1.5]}`, `{"missingPartitions":null}`,
	`{"next":1}`, `{"next":"\n"}`, `{"unknown":1,"documents":[{"other":[1],"key":[2]}]}`, `{"documents":[{"keý":[1]}]}`,
	`[]`, `"x"`, ``, `{`, `{"documents"`, `{"documents":[`, `{"documents":[{"key":[1]}`, `{"documents":[{"key":[1]},]}`, `{"a":1 "b":2}`,
}

// decodePage is parsePage as encoding/json alone does it.
func decodePage(b []byte) (*Page, error) {
	var pj pageJSON
	dec := json.NewDecoder(bytesReader(b))
	dec.UseNumber()
	if err := dec.Decode(&pj); err != nil {
		return nil, err
	}
	p := &Page{Next: pj.Next, MissingPartitions: pj.MissingPartitions, Replica: pj.Replica, Age: seconds(pj.Age)}
	for _, k := range pj.Missing {
		p.Missing = append(p.Missing, k.normalize())
	}
	for _, d := range pj.Documents {
		p.Documents = append(p.Documents, *d.document())
	}
	return p, nil
}

func checkPage(t *testing.T, body string) {
	got, gotErr := parsePage([]byte(body), "")
	want, wantErr := decodePage([]byte(body))
	if (gotErr != nil) != (wantErr != nil) {
		t.Fatalf("%.200q: parsePage error %v, encoding/json error %v", body, gotErr, wantErr)
	}
	if wantErr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%.200q:\nparsePage     %+v\nencoding/json %+v", body, got, want)
	}
}

func TestParsePageMatchesDecoder(t *testing.T) {
	scanned := 0
	for _, b := range pageBodies {
		checkPage(t, b)
		if scanPage([]byte(b), &pageJSON{}) {
			scanned++
		}
	}
	// The pages servers send take the scan.
	for _, b := range pageBodies[:3] {
		if !scanPage([]byte(b), &pageJSON{}) {
			t.Fatalf("%.100q: not scanned", b)
		}
	}
	t.Logf("%d of %d pages scanned", scanned, len(pageBodies))
}

func FuzzParsePage(f *testing.F) {
	for _, b := range pageBodies {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body string) { checkPage(t, body) })
}

func BenchmarkParsePage(b *testing.B) {
	// A page of 20 documents of 40 fields, as a query answers.
	var doc strings.Builder
	doc.WriteString(`{"key":["L01",1234],"etag":"\"903fa68d\"","scn":"1:1234","lastModified":"2026-11-29T18:15:29.080312524Z","document":{`)
	for i := range 40 {
		if i > 0 {
			doc.WriteByte(',')
		}
		doc.WriteString(`"f` + strings.Repeat("x", i%7) + `":"value-12-345 with some words in it"`)
	}
	doc.WriteString(`}}`)
	page := []byte(`{"documents":[` + strings.TrimSuffix(strings.Repeat(doc.String()+",", 20), ",") + `],"next":"AWJuvrkAAY8GAAEB"}`)
	b.SetBytes(int64(len(page)))
	b.Run("parsePage", func(b *testing.B) {
		for b.Loop() {
			if _, err := parsePage(page, ""); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		for b.Loop() {
			if _, err := decodePage(page); err != nil {
				b.Fatal(err)
			}
		}
	})
}

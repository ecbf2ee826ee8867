package client

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// eventLines are change-stream lines as servers send them, and lines no
// server should send.
var eventLines = []string{
	`{"type":"change","op":"c","before":null,"after":{"n":1,"payload":"xx"},"source":{"connector":"cortado","db":"bench","table":"Doc","key":[1],"partition":7,"scn":"1:236","generation":1,"sequence":236,"schemaVersion":1,"ts_ms":1795518420913,"snapshot":"false"},"ts_ms":1795518496489,"transaction":{"id":"1:236","total_order":1,"data_collection_order":1},"token":"AWJuvrkAAY"}`,
	`{"type":"change","op":"u","before":{"a":[1,2.5e-3,-0,true,false,null,{"b":"\u00e9\n\"q\""}]},"after":{"a":[]},"source":{"db":"d","key":["k",2],"partition":0,"scn":"2:1","generation":2,"sequence":1},"ts_ms":5,"token":"x"}`,
	`{"type":"change","op":"r","before":null,"after":{"s":"é"},"source":{"db":"d","snapshot":"last"},"ts_ms":0,"token":"t"}`,
	`{"type":"transaction","status":"END","id":"1:2","event_count":3,"source":{"db":"d","partition":1},"token":"t"}`,
	`{"type":"resolved","source":{"db":"d","partition":3,"scn":"1:9","generation":1,"sequence":9},"token":"abc"}`,
	`{"type":"rollback","source":{"db":"d","partition":3,"scn":"1:4"},"token":"abc"}`,
	` { "type" : "change" , "after" : { } , "ts_ms" : -0 } `,
	`{}`,
	`{"Type":"change","AFTER":{"x":1},"Ts_Ms":3}`,
	`{"type":"change","type":"resolved","after":1,"after":{"y":2},"source":{"db":"a"},"source":{"partition":2}}`,
	`{"unknown":{"deep":[[[[1]]]]},"type":"change"}`,
	`{"type":null,"op":null,"ts_ms":null,"source":null,"transaction":null,"event_count":null,"before":null}`,
	`{"ts_ms":1.5}`, `{"ts_ms":"3"}`, `{"ts_ms":99999999999999999999}`, `{"type":3}`, `{"after":01}`, `{"after":1.}`,
	`{"after":-}`, `{"after":1e}`, `{"after":tru}`, `{"after":"\x"}`, `{"after":"\u12"}`, `{"after":"a` + "\x01" + `"}`,
	`{"after":"` + "\xff" + `"}`, `{"type":"` + "\xff" + `"}`, `{"after":[1,]}`, `{"after":{"a":1,}}`, `{"after":{"a"}}`,
	`{"after":{1:2}}`, `{"a":1 "b":2}`, `{"type":"x"} x`, `[]`, `"x"`, ``, `{`, `{"type"`, `{"type":`, `{"type":"a"`,
	`{"after":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`,
	`{"after":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`,
	`{"ty\u0070e":"change"}`, `{"typé":"change"}`,
	`{"source":{"key":[1,"a",-5,9007199254740993,1e2,-0,"\u0041",true]}}`, `{"source":{"key":[]}}`, `{"source":{"key":[1,]}}`,
	`{"source":{"key":["a"],"KEY":null,"Partition":3,"generation":-1,"sequence":1.0,"partition":1e1,"db":null,"x":{"y":[]}}}`,
	`{"transaction":{"id":"1:2","total_order":1,"TOTAL_ORDER":2}}`, `{"transaction":null}`, `{"transaction":{"id":"a"},"transaction":{"total_order":3}}`,
	`{"transaction":{"id":"a"},"transaction":null}`, `{"transaction":{"total_order":1.5}}`, `{"transaction":{"id":null,"x":[1]}}`, `{"transaction":[]}`,
	`{"source":{"generation":4294967296}}`, `{"source":{"generation":4294967295,"sequence":18446744073709551615,"partition":-3}}`,
	`{"source":{"key":["a"],"key":null}}`, `{"source":{"key":["a"],"key":[2]}}`, `{"source":[]}`, `{"source":{"db":"a"}}x`,
}

// checkDecode compares decodeEvent with json.Unmarshal on one line.
func checkDecode(t *testing.T, line string) {
	got, gotErr := decodeEvent([]byte(line))
	want := &ChangeEvent{}
	wantErr := json.Unmarshal([]byte(line), want)
	if (gotErr != nil) != (wantErr != nil) {
		t.Fatalf("%.200q: decodeEvent error %v, json.Unmarshal error %v", line, gotErr, wantErr)
	}
	if wantErr != nil {
		return
	}
	want.Raw = json.RawMessage(line)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%.200q:\ndecodeEvent  %+v\njson.Unmarshal %+v", line, got, want)
	}
}

func TestDecodeEventMatchesUnmarshal(t *testing.T) {
	for _, line := range eventLines {
		checkDecode(t, line)
	}
}

func FuzzDecodeEvent(f *testing.F) {
	for _, line := range eventLines {
		f.Add(line)
	}
	f.Fuzz(func(t *testing.T, line string) { checkDecode(t, line) })
}

func BenchmarkDecodeEvent(b *testing.B) {
	// A 1 KB document's insert with a 64-partition token, as a stream
	// sends it.
	line := []byte(`{"type":"change","op":"c","before":null,"after":{"n":15034,"payload":"` + strings.Repeat("x", 1024) +
		`"},"source":{"connector":"cortado","db":"bench","table":"Doc","key":[15034],"partition":7,"scn":"1:236","generation":1,"sequence":236,"schemaVersion":1,"ts_ms":1795518420913,"snapshot":"false"},"ts_ms":1795518496489,"transaction":{"id":"1:236","total_order":1,"data_collection_order":1},"token":"` +
		strings.Repeat("AWJuvrkAAY8GAAEB", 27) + `"}`)
	b.SetBytes(int64(len(line)))
	b.Run("decodeEvent", func(b *testing.B) {
		for b.Loop() {
			if _, err := decodeEvent(line); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Unmarshal", func(b *testing.B) {
		for b.Loop() {
			e := &ChangeEvent{}
			if err := json.Unmarshal(line, e); err != nil {
				b.Fatal(err)
			}
			e.Raw = append(json.RawMessage(nil), line...)
		}
	})
}

package backup

import (
	"reflect"
	"testing"
)

var lineSeeds = []string{
	`{"type":"row","table":"Message","key":["alice",5],"version":1,"ts_ms":1796029277280,"avro":"BmJvYghoaSAxCmhlbGxvAQIA"}`,
	`{"type":"mark","table":"Message","key":["alice",9]}`,
	` { "type" : "row" , "key" : [ ] , "avro" : "" } `,
	`{"type":"row","type":"mark"}`,
	`{"type":"row","Type":"mark"}`,
	`{"type":"r\u006fw","table":"T"}`,
	`{"type":"row","key":[1.0,1e3,-0,01]}`,
	`{"type":"row","version":99999999999999999999}`,
	`{"type":"row","avro":"!!"}`,
	`{"type":"row","avro":"AA=\n="}`,
	`{"type":"row","table":"ćwierć"}`,
	`{"type":"row"} x`,
	`{"type":"row","x":1}`,
	`{"avro":null}`,
	`{}`, `[]`, ``, `{"type":"row",}`,
}

// FuzzParseLine: a line the backup's own parser reads, the general JSON
// path reads the same; one it leaves, the general path decides.
func FuzzParseLine(f *testing.F) {
	for _, s := range lineSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		fast, ok := parseBackupLine(line)
		slow, err := parseJSONLine(line)
		if !ok {
			return
		}
		if err != nil {
			t.Fatalf("%q: the backup's parser read %+v, the JSON path refused it: %v", line, fast, err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("%q: the backup's parser read %+v, the JSON path %+v", line, fast, slow)
		}
	})
}

func TestParseLine(t *testing.T) {
	l, ok := parseBackupLine([]byte(lineSeeds[0]))
	if !ok || l.Type != "row" || l.Table != "Message" || len(l.RawKey) != 2 || l.Version != 1 || *l.TSms != 1796029277280 || string(l.Avro) != "\x06bob\x08hi 1\x0ahello\x01\x02\x00" {
		t.Fatalf("%+v %v", l, ok)
	}
	for _, s := range lineSeeds[3:] {
		if _, ok := parseBackupLine([]byte(s)); ok {
			t.Errorf("%q: taken by the backup's parser", s)
		}
	}
}

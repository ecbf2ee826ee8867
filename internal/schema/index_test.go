package schema

import (
	"strings"
	"testing"
)

func TestIndexAnnotations(t *testing.T) {
	v, err := NewVersion(1, `{"type":"record","name":"M","fields":[
		{"name":"subject","type":"string","index":"text"},
		{"name":"createdOn","type":"long","index":"attribute"},
		{"name":"isInbox","type":"boolean","index":"attribute"},
		{"name":"labels","type":{"type":"array","items":"string"},"index":"attribute"},
		{"name":"score","type":["null","double"],"default":null,"index":"attribute"},
		{"name":"folder","type":{"type":"enum","name":"F","symbols":["A","B"]},"index":"attribute"},
		{"name":"body","type":"string"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ix := range v.Indexes {
		got = append(got, ix.String())
	}
	want := "subject:string(text) createdOn:long(attribute) isInbox:boolean(attribute) labels:string[](attribute) score:double(attribute) folder:string(attribute)"
	if strings.Join(got, " ") != want {
		t.Fatalf("indexes: %s\nwant      %s", strings.Join(got, " "), want)
	}
	for _, bad := range []struct{ schema, field string }{
		{`{"type":"record","name":"M","fields":[{"name":"a","type":"long","index":"text"}]}`, "a"},
		{`{"type":"record","name":"M","fields":[{"name":"a","type":"string","index":"fulltext"}]}`, "a"},
		{`{"type":"record","name":"M","fields":[{"name":"a","type":{"type":"map","values":"string"},"index":"attribute"}]}`, "a"},
		{`{"type":"record","name":"M","fields":[{"name":"a","type":{"type":"record","name":"N","fields":[{"name":"b","type":"string","index":"attribute"}]}}]}`, "a.b"},
	} {
		_, err := NewVersion(1, bad.schema)
		fe, ok := err.(*FieldError)
		if !ok || fe.Path != bad.field {
			t.Errorf("%s: %v, want a field error on %s", bad.schema, err, bad.field)
		}
	}
}

func TestIndexState(t *testing.T) {
	v1, _ := NewVersion(1, `{"type":"record","name":"M","fields":[{"name":"a","type":"string","index":"attribute"},{"name":"b","type":"string"}]}`)
	v2, _ := NewVersion(2, `{"type":"record","name":"M","fields":[{"name":"a","type":"string","index":"attribute"},{"name":"b","type":"string","index":"attribute"}]}`)
	tb := &Table{Name: "M", Versions: []*Version{v1, v2}}
	if _, building, err := tb.IndexState("a"); err != nil || building {
		t.Fatalf("a: building %v, %v", building, err)
	}
	if _, building, err := tb.IndexState("b"); err != nil || !building {
		t.Fatalf("b (indexed from version 2): building %v, %v", building, err)
	}
	if _, _, err := tb.IndexState("c"); err == nil {
		t.Fatal("c: no error for an unindexed field")
	}
}

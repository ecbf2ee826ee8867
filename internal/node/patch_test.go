package node

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func tree(t *testing.T, s string) map[string]any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestPatchApply(t *testing.T) {
	cases := []struct {
		name, doc string
		patch     Patch
		want      string
		err       bool
	}{
		{"set nested creates", `{"a":1}`, Patch{Set: map[string]any{"b.c": json.Number("2")}}, `{"a":1,"b":{"c":2}}`, false},
		{"set parent then child", `{}`, Patch{Set: map[string]any{"a": map[string]any{}, "a.b": "x"}}, `{"a":{"b":"x"}}`, false},
		{"remove", `{"a":1,"m":{"k":1,"j":2}}`, Patch{Remove: []string{"m.k", "a"}}, `{"m":{"j":2}}`, false},
		{"remove under missing", `{}`, Patch{Remove: []string{"x.y"}}, ``, true},
		{"increment int", `{"n":41}`, Patch{Increment: map[string]any{"n": json.Number("1")}}, `{"n":42}`, false},
		{"increment missing from zero", `{}`, Patch{Increment: map[string]any{"n": json.Number("-3")}}, `{"n":-3}`, false},
		{"increment float", `{"n":1.5}`, Patch{Increment: map[string]any{"n": json.Number("1")}}, `{"n":2.5}`, false},
		{"increment overflow", `{"n":9223372036854775807}`, Patch{Increment: map[string]any{"n": json.Number("1")}}, ``, true},
		{"increment a string", `{"n":"x"}`, Patch{Increment: map[string]any{"n": json.Number("1")}}, ``, true},
		{"set through a non-object", `{"a":1}`, Patch{Set: map[string]any{"a.b": "x"}}, ``, true},
		{"set a key with a dot", `{"m":{"a":1}}`, Patch{Set: map[string]any{`m.example\.com`: "x"}}, `{"m":{"a":1,"example.com":"x"}}`, false},
		{"set a key with a backslash", `{}`, Patch{Set: map[string]any{`m.a\\b`: "x"}}, `{"m":{"a\\b":"x"}}`, false},
		{"remove a key with a dot", `{"m":{"a.b":1,"a":{"b":2}}}`, Patch{Remove: []string{`m.a\.b`}}, `{"m":{"a":{"b":2}}}`, false},
		{"increment under a key with dots", `{"m":{"x.y.z":{"n":1}}}`, Patch{Increment: map[string]any{`m.x\.y\.z.n`: json.Number("2")}}, `{"m":{"x.y.z":{"n":3}}}`, false},
		{"an escape of anything else", `{}`, Patch{Set: map[string]any{`m.a\b`: "x"}}, ``, true},
		{"a backslash at the end", `{}`, Patch{Set: map[string]any{`m.a\`: "x"}}, ``, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			doc := tree(t, tc.doc)
			err := tc.patch.apply(doc)
			if tc.err {
				if !errors.Is(err, ErrBadPatch) {
					t.Fatalf("want ErrBadPatch, got %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, _ := json.Marshal(doc)
			want, _ := json.Marshal(tree(t, tc.want))
			if string(got) != string(want) {
				t.Fatalf("got %s, want %s", got, want)
			}
		})
	}
}

// TestIncrementOutOfRange: an increment no double holds says so, rather
// than that it is not a number.
func TestIncrementOutOfRange(t *testing.T) {
	p := Patch{Increment: map[string]any{"d": json.Number("1e400")}}
	err := p.apply(tree(t, `{"d":1.5}`))
	if !errors.Is(err, ErrBadPatch) || !strings.Contains(err.Error(), "increment 1e400 is out of range") {
		t.Fatalf("increment by 1e400: %v", err)
	}
}

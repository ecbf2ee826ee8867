package schema

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
	"github.com/hamba/avro/v2"
)

// TestResolveDataDriven runs testdata/resolve. Each case gives a writer
// schema, a reader schema (default: the writer's) and a datum — JSON in the
// writer's form, or raw writer bytes in hex — and expects the reader's
// datum as JSON, or the error. Each case is checked three ways: the plan's
// output (the expected text), hamba/avro's Resolve + decode of the same
// bytes (must agree, unless the case says hamba-differs=<why>), and that the
// plan's output is valid Avro of the reader schema.
func TestResolveDataDriven(t *testing.T) {
	datadriven.RunTest(t, "testdata/resolve", func(t *testing.T, d *datadriven.TestData) string {
		if d.Cmd != "resolve" {
			return "unknown command " + d.Cmd
		}
		in := map[string]string{}
		for _, line := range strings.Split(d.Input, "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				in[strings.TrimSpace(k)] += strings.TrimSpace(v)
			}
		}
		writer := mustParse(t, in["writer"])
		reader := writer
		if in["reader"] != "" {
			reader = mustParse(t, in["reader"])
		}
		compareHamba := !d.HasArg("hamba-differs")
		var b []byte
		if h := in["hex"]; h != "" {
			var err error
			if b, err = hex.DecodeString(strings.ReplaceAll(h, " ", "")); err != nil {
				t.Fatal(err)
			}
		} else {
			v, err := DecodeJSON([]byte(in["datum"]))
			if err != nil {
				t.Fatal(err)
			}
			if b, err = EncodeJSON(nil, writer, v); err != nil {
				t.Fatalf("datum does not fit the writer: %v", err)
			}
		}
		p, err := NewPlan(writer, reader)
		if err != nil {
			if compareHamba {
				if _, herr := avro.NewSchemaCompatibility().Resolve(reader, writer); herr == nil {
					t.Errorf(d.Pos+": hamba resolves what the plan refused (%v)", err)
				}
			}
			return fmt.Sprintf("plan error: %v\n", err)
		}
		out, err := p.Apply(nil, b)
		if err != nil {
			if compareHamba {
				if ref, herr := referenceJSON(writer, reader, b); herr == nil {
					t.Errorf(d.Pos+": hamba decodes %v where the plan failed (%v)", ref, err)
				}
			}
			return fmt.Sprintf("error: %v\n", err)
		}
		var check any
		if err := avro.Unmarshal(reader, out, &check); err != nil {
			t.Errorf(d.Pos+": plan output is not valid reader Avro: %v", err)
		}
		js, err := NewJSONWriter(reader).Append(nil, out)
		if err != nil {
			t.Fatalf("JSON writer: %v", err)
		}
		if compareHamba {
			ref, err := referenceJSON(writer, reader, b)
			if err != nil {
				t.Errorf(d.Pos+": hamba failed where the plan succeeded: %v", err)
			} else {
				var got any
				json.Unmarshal(js, &got)
				if !reflect.DeepEqual(got, ref) {
					t.Errorf(d.Pos+": plan and hamba disagree:\nplan  %s\nhamba %v", js, ref)
				}
			}
		}
		return string(js) + "\n"
	})
}

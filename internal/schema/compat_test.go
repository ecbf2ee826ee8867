package schema

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestCompatibilityLevels runs testdata/compatibility: each case is a
// table's versions (oldest first, separated by ~~~); the output is the
// verdict on the last one under every level.
func TestCompatibilityLevels(t *testing.T) {
	datadriven.RunTest(t, "testdata/compatibility", func(t *testing.T, d *datadriven.TestData) string {
		var vs []*Version
		for i, text := range strings.Split(d.Input, "~~~") {
			v, err := NewVersion(i+1, text)
			if err != nil {
				t.Fatalf("version %d: %v", i+1, err)
			}
			vs = append(vs, v)
		}
		var out strings.Builder
		for _, c := range Levels {
			err := CheckLevel(c, vs[:len(vs)-1], vs[len(vs)-1])
			verdict := "ok"
			if err != nil {
				verdict = err.Error()
			}
			fmt.Fprintf(&out, "%s: %s\n", c, verdict)
		}
		return out.String()
	})
}

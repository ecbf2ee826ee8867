package schema

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestProjectDataDriven runs testdata/project: each case lists dot paths
// and expects the projected JSON of testdata/profile.json (written with
// version 1) read as the given version, or the error.
func TestProjectDataDriven(t *testing.T) {
	tbl := profileTable(t)
	doc := encodeFile(t, tbl.Version(1).Schema, "testdata/profile.json")
	plans := NewPlans(64)
	datadriven.RunTest(t, "testdata/project", func(t *testing.T, d *datadriven.TestData) string {
		version := 1
		if d.HasArg("version") {
			d.ScanArgs(t, "version", &version)
		}
		var paths []string
		for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
			if line = strings.TrimSpace(line); line != "" {
				paths = append(paths, line)
			}
		}
		switch d.Cmd {
		case "project":
			p, err := plans.Plan(tbl, 1, version, paths)
			if err != nil {
				return fmt.Sprintf("error: %v\n", err)
			}
			out, err := p.Apply(nil, doc)
			if err != nil {
				return fmt.Sprintf("error: %v\n", err)
			}
			r, _ := plans.Reader(tbl, version, paths)
			js, err := r.JSON.Append(nil, out)
			if err != nil {
				return fmt.Sprintf("error: %v\n", err)
			}
			return string(js) + "\n"
		case "schema":
			s, err := Project(tbl.Version(version).Schema, paths)
			if err != nil {
				return fmt.Sprintf("error: %v\n", err)
			}
			return s.String() + "\n"
		}
		return "unknown command " + d.Cmd
	})
}

// Package release owns what identifies this binary to operators: the
// commit it was built from, as Go's build information recorded it, shown
// by `cortado version`, the cortado_build_info metric and each storage
// node's entry in /_cluster, so that a rolling upgrade's mixed cluster can
// be told apart. It never changes what the binary does.
package release

import (
	"runtime/debug"
	"sync"
)

// Info is what the build recorded.
type Info struct {
	// Revision is the commit's first 12 hex digits, with "+" when the
	// tree held changes not committed; "devel" when the build recorded
	// none (go run, -buildvcs=false, a tree outside git).
	Revision string
	// Time is the commit's time (RFC 3339), "" when not recorded.
	Time string
	// Go is the Go release that built it.
	Go string
}

// Get returns this binary's Info.
var Get = sync.OnceValue(func() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Revision: "devel"}
	}
	return fromSettings(bi.GoVersion, bi.Settings)
})

func fromSettings(goVersion string, settings []debug.BuildSetting) Info {
	info := Info{Revision: "devel", Go: goVersion}
	modified := false
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value[:min(12, len(s.Value))]
		case "vcs.time":
			info.Time = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if modified && info.Revision != "devel" {
		info.Revision += "+"
	}
	return info
}

package release

import (
	"runtime/debug"
	"testing"
)

func TestFromSettings(t *testing.T) {
	for _, c := range []struct {
		name     string
		settings []debug.BuildSetting
		want     Info
	}{
		{"none recorded", nil, Info{Revision: "devel", Go: "go1.26"}},
		{"a commit", []debug.BuildSetting{{Key: "vcs.revision", Value: "ceb0b15f0123456789abcdef"}, {Key: "vcs.time", Value: "2026-12-01T17:20:00Z"}, {Key: "vcs.modified", Value: "false"}},
			Info{Revision: "ceb0b15f0123", Time: "2026-12-01T17:20:00Z", Go: "go1.26"}},
		{"changes not committed", []debug.BuildSetting{{Key: "vcs.revision", Value: "ceb0b15f0123456789abcdef"}, {Key: "vcs.modified", Value: "true"}},
			Info{Revision: "ceb0b15f0123+", Go: "go1.26"}},
		{"a short revision", []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}}, Info{Revision: "abc", Go: "go1.26"}},
		{"modified without a revision", []debug.BuildSetting{{Key: "vcs.modified", Value: "true"}}, Info{Revision: "devel", Go: "go1.26"}},
	} {
		if got := fromSettings("go1.26", c.settings); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

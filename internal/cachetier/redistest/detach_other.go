//go:build !linux

package redistest

import "os/exec"

// detach is a no-op where there is no parent-death signal.
func detach(*exec.Cmd) {}

//go:build !linux

package clustertest

import "os/exec"

// detach is a no-op where there is no /proc or parent-death signal.
func detach(*exec.Cmd) {}

// awaitStopped cannot see a process's threads without /proc: Pause
// returns once the signal is sent.
func awaitStopped(int) {}

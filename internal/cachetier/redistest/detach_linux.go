package redistest

import (
	"os/exec"
	"syscall"
)

// detach has the server killed when the test process dies (a test binary
// killed by its timeout left redis-server running).
func detach(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

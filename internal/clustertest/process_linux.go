package clustertest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

var markInherited sync.Once

// detach makes a child process independent of this test process's
// inherited pipes and bounds its life by this process's.
//
// A Go fuzz worker talks to its coordinator over file descriptors 3 and 4,
// which it inherited without close-on-exec. A server started by the fuzz
// target would inherit them too and, outliving a worker that crashed or
// hung, keep the coordinator waiting for their end forever: a bounded
// fuzz run that never ends. So every descriptor this process holds is
// marked close-on-exec before the first child starts, and the child is
// killed when its parent dies (strictly, when the OS thread that started
// it ends; Go ends a thread only with a goroutine locked to it, which the
// tests do not do).
func detach(cmd *exec.Cmd) {
	markInherited.Do(func() {
		entries, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			return
		}
		for _, e := range entries {
			if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
				syscall.CloseOnExec(fd)
			}
		}
	})
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}

// awaitStopped waits until every thread of process pid is stopped (state
// T in /proc), for at most 10 s.
func awaitStopped(pid int) {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return // gone
		}
		stopped := true
		for _, task := range tasks {
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
			// The state follows the command's closing parenthesis.
			if i := bytes.LastIndexByte(stat, ')'); err == nil && i >= 0 && i+2 < len(stat) && stat[i+2] != 'T' && stat[i+2] != 't' {
				stopped = false
				break
			}
		}
		if stopped {
			return
		}
	}
}

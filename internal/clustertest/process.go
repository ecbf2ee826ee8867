// Package clustertest holds the tests that run Cortado as real processes on
// loopback ports — black-box HTTP tests, crash recovery, the client suite
// against both transports — and the helpers that build the binary and
// start, kill and pause those processes, cut them off the network
// (NewLink, Cut, Mend) and keep a change-stream consumer's books
// (ChangeLog). Nothing here is imported by the product.
package clustertest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cortado-db/cortado/internal/coord"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// Binary builds cmd/cortado once per test process and returns its path.
//
// The binary has one place per checkout, beside those of other test
// processes (os.TempDir()/cortado-test-bin-<hash of the checkout's path>/
// cortado), so test runs do not leave a 50 MB binary each behind. Each
// process builds it anew (the build cache makes that a link) into a file
// of its own and renames that over the shared one: a process already
// running the old file keeps its inode.
func Binary(t testing.TB) string {
	t.Helper()
	skipUnderRace(t)
	buildOnce.Do(func() {
		binPath, buildErr = build()
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func build() (string, error) {
	_, self, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(filepath.Dir(self))) // internal/clustertest/process.go
	sum := sha256.Sum256([]byte(root))
	dir := filepath.Join(os.TempDir(), "cortado-test-bin-"+hex.EncodeToString(sum[:6]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, "cortado-*.building")
	if err != nil {
		return "", err
	}
	tmp.Close()
	defer os.Remove(tmp.Name()) // gone after the rename; left by a failed build
	// -buildvcs=auto: the commit goes into the binary (cortado version,
	// /_cluster) whatever GOFLAGS says, when git is there to ask.
	out, err := exec.Command("go", "build", "-buildvcs=auto", "-o", tmp.Name(), "github.com/cortado-db/cortado/cmd/cortado").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	path := filepath.Join(dir, "cortado")
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", err
	}
	return path, nil
}

// Serve is a running `cortado serve` process.
type Serve struct {
	t       testing.TB
	bin     string // the binary it runs; "" is this checkout's (Binary)
	cmd     *exec.Cmd
	exited  chan struct{}
	Dir     string
	URL     string
	args    []string
	logPath string
}

// ServeOptions configures StartServe.
type ServeOptions struct {
	// Dir is the data directory (default: a new temporary one).
	Dir string
	// Args are extra flags.
	Args []string
}

// skipUnderRace skips a test that runs Cortado in processes of its own
// when the test runs under the race detector: those processes are built
// without it, so the detector would watch only the test's HTTP clients
// (the run without it, in scripts/test, runs the test). It kept the race
// step of CI past its 20 minutes.
func skipUnderRace(t testing.TB) {
	t.Helper()
	if raceDetector {
		t.Skip("runs Cortado in processes built without the race detector; run without -race")
	}
}

// StartServe starts `cortado serve` on free loopback ports and waits until
// it serves HTTP.
func StartServe(t testing.TB, o ServeOptions) *Serve {
	t.Helper()
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	// A port found free can be taken by another test before etcd binds
	// it; try again with new ports.
	for attempt := 1; ; attempt++ {
		client, err := coord.FreeLoopbackURL()
		if err != nil {
			t.Fatal(err)
		}
		peer, err := coord.FreeLoopbackURL()
		if err != nil {
			t.Fatal(err)
		}
		args := append([]string{"serve", "--data-dir", o.Dir, "--listen", "127.0.0.1:0",
			"--etcd-client-url", client, "--etcd-peer-url", peer, "--log-level", "warn"}, o.Args...)
		s := &Serve{t: t, Dir: o.Dir, args: args, logPath: filepath.Join(o.Dir, "serve.log")}
		if err := s.tryStart(); err != nil {
			if coord.IsAddrInUse(err) && attempt < 5 {
				os.RemoveAll(filepath.Join(o.Dir, "etcd"))
				continue
			}
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Kill() })
		return s
	}
}

func (s *Serve) start() {
	s.t.Helper()
	if err := s.tryStart(); err != nil {
		s.t.Fatal(err)
	}
}

func (s *Serve) tryStart() error {
	// Before anything else: an earlier release's binary (bin) is not
	// built here, so Binary's skip would not come.
	skipUnderRace(s.t)
	ready := filepath.Join(s.Dir, "ready")
	os.Remove(ready)
	args := append(append([]string(nil), s.args...), "--ready-file", ready)
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	bin := s.bin
	if bin == "" {
		bin = Binary(s.t)
	}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	detach(s.cmd)
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.exited = make(chan struct{})
	go func() {
		s.cmd.Wait()
		logf.Close()
		close(s.exited)
	}()
	deadline := time.After(60 * time.Second)
	for {
		if b, err := os.ReadFile(ready); err == nil && len(b) > 0 {
			s.URL = strings.TrimSpace(string(b))
			if !strings.Contains(s.URL, "://") {
				s.URL = "http://" + s.URL
			}
			return nil
		}
		select {
		case <-s.exited:
			log, _ := os.ReadFile(s.logPath)
			return fmt.Errorf("cortado serve exited before it was ready:\n%s", log)
		case <-deadline:
			s.Kill()
			log, _ := os.ReadFile(s.logPath)
			return fmt.Errorf("cortado serve not ready after 60s; its log ends:\n%s", log[max(0, len(log)-4096):])
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// StartRole starts `cortado <role> args…` (a role against an external
// etcd) with its own data directory and waits until it serves HTTP.
func StartRole(t testing.TB, role string, args ...string) *Serve {
	t.Helper()
	return StartRoleOf(t, "", role, args...)
}

// StartRoleOf is StartRole running the binary bin ("" is this checkout's):
// an earlier release's, for an upgrade.
func StartRoleOf(t testing.TB, bin, role string, args ...string) *Serve {
	t.Helper()
	dir := t.TempDir()
	full := append([]string{role, "--listen", "127.0.0.1:0", "--log-level", "warn"}, args...)
	if role == "storage" {
		full = append(full, "--data-dir", dir)
	}
	s := &Serve{t: t, bin: bin, Dir: dir, args: full, logPath: filepath.Join(dir, role+".log")}
	s.start()
	t.Cleanup(func() { s.Kill() })
	return s
}

// StartProcess starts `cortado args…` with dir as its working data
// directory (for its log and ready file), waits until it is ready and
// kills it when the test ends. The caller passes every flag, data
// directories and listen addresses included.
func StartProcess(t testing.TB, dir, name string, args ...string) *Serve {
	t.Helper()
	return StartProcessOf(t, "", dir, name, args...)
}

// StartProcessOf is StartProcess running the binary bin ("" is this
// checkout's).
func StartProcessOf(t testing.TB, bin, dir, name string, args ...string) *Serve {
	t.Helper()
	s := &Serve{t: t, bin: bin, Dir: dir, args: args, logPath: filepath.Join(dir, name+".log")}
	s.start()
	t.Cleanup(func() { s.Kill() })
	return s
}

// Pid is the running process's ID.
func (s *Serve) Pid() int { return s.cmd.Process.Pid }

// Running reports whether the process is running (not killed, not
// exited).
func (s *Serve) Running() bool {
	if s.exited == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// Kill sends SIGKILL and waits for the process to be gone.
func (s *Serve) Kill() {
	if s.cmd == nil || s.cmd.Process == nil || !s.Running() {
		return
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
}

// Stop sends SIGTERM and waits for a clean exit.
func (s *Serve) Stop() {
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		s.t.Error("cortado serve did not stop on SIGTERM within 30s")
		s.Kill()
	}
}

// Restart starts the process again with the same data directory and ports.
func (s *Serve) Restart() {
	s.t.Helper()
	s.start()
}

// RestartWithout restarts the process without the flag name and its
// value: a new binary's defaults, for an upgrade.
func (s *Serve) RestartWithout(name string) {
	s.t.Helper()
	if i := slices.Index(s.args, name); i >= 0 {
		s.args = slices.Delete(slices.Clone(s.args), i, i+2)
	}
	s.start()
}

// RestartAs starts the stopped or killed process again with the binary
// bin ("" is this checkout's) and the same flags, data directory and
// ports: one process's step of an upgrade.
func (s *Serve) RestartAs(bin string) {
	s.t.Helper()
	s.bin = bin
	s.start()
}

// TryRestart is Restart that returns the error (e.g. the address is still
// in use) instead of failing the test.
func (s *Serve) TryRestart() error { return s.tryStart() }

// Log returns what the process wrote.
func (s *Serve) Log() string {
	b, _ := os.ReadFile(s.logPath)
	return string(b)
}

// Pause stops the process (SIGSTOP) without killing it: it neither
// answers nor renews its lease until Resume. It returns once every thread
// has stopped: a loaded machine lets a process run on for a millisecond
// or more after the signal, time enough to apply and acknowledge a write.
func (s *Serve) Pause() {
	s.cmd.Process.Signal(syscall.SIGSTOP)
	awaitStopped(s.cmd.Process.Pid)
}

// Resume continues a paused process (SIGCONT).
func (s *Serve) Resume() { s.cmd.Process.Signal(syscall.SIGCONT) }

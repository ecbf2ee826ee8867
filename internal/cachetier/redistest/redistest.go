// Package redistest starts a real Redis for tests: redis-server on a free
// loopback port, without persistence, in the test's temporary directory,
// killed when the test ends. It is test support; nothing in the product
// imports it.
//
// scripts/test installs redis-server and sets CORTADO_REQUIRE_REDIS, so
// there a missing binary fails the test; elsewhere the test is skipped.
package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Server is a redis-server process.
type Server struct {
	t    testing.TB
	Port int
	dir  string
	cmd  *exec.Cmd
}

// URL is the server's redis:// URL.
func (s *Server) URL() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", s.Port) }

// Start starts a Redis for t, killed when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CORTADO_REQUIRE_REDIS") != "" {
			t.Fatal("redis-server is not installed (scripts/test installs it: apt-get install -y redis-server)")
		}
		t.Skip("redis-server is not installed; scripts/test installs it")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := &Server{t: t, Port: port, dir: t.TempDir()}
	s.Restart()
	t.Cleanup(s.Kill)
	return s
}

// Restart starts the server again (empty: it keeps nothing) after Kill,
// and waits until it answers.
func (s *Server) Restart() {
	s.t.Helper()
	s.cmd = exec.Command("redis-server", "--port", fmt.Sprint(s.Port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", s.dir)
	detach(s.cmd)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if s.ping() {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redis-server on port %d did not answer within 10s", s.Port)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ping reports whether the server answers PING.
func (s *Server) ping() bool {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", s.Port), 200*time.Millisecond)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}

// Kill kills the server (SIGKILL) and waits for it.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Kill()
	s.cmd.Wait()
	s.cmd = nil
}

package wire

import (
	"io"
	"net"
	"runtime"
	"testing"
	"time"
)

// TestConnectionLimit: beyond the bound a connection is closed at once;
// closing one frees its place.
func TestConnectionLimit(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := LimitConns(raw, 2)
	defer ln.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	var held []net.Conn
	for range 2 {
		dial()
		held = append(held, <-accepted)
	}
	// The third is closed by the server: its client reads EOF (or a
	// reset) at once, and the listener counts it.
	third := dial()
	third.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := third.Read(make([]byte, 1)); err == nil {
		t.Fatal("a connection over the limit was kept")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("a connection over the limit was left waiting")
	}
	if ln.Refused() != 1 || ln.Open() != 2 {
		t.Fatalf("refused %d open %d, want 1 and 2", ln.Refused(), ln.Open())
	}
	held[0].Close()
	held[0].Close() // twice counts once
	fourth := dial()
	c := <-accepted
	fourth.Write([]byte("x"))
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatalf("a connection within the limit after one closed: %v", err)
	}
	if ln.Open() != 2 {
		t.Fatalf("open %d, want 2", ln.Open())
	}
}

// TestWaiting: the connections holding bytes the process has not read
// are counted; idle ones and closed ones are not; reading the bytes
// takes a connection out of the count. Above waitingSample connections
// the count is an estimate from a sample.
func TestWaiting(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("unread bytes are read with SIOCINQ, on Linux only")
	}
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := LimitConns(raw, 1000)
	defer ln.Close()
	// await polls Waiting (an estimate renewed every waitingEvery)
	// until it is within [lo, hi].
	await := func(lo, hi int64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			n := ln.Waiting()
			if n >= lo && n <= hi {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("waiting %d, want %d to %d", n, lo, hi)
			}
			time.Sleep(waitingEvery / 5)
		}
	}
	const n = 2 * waitingSample
	clients, servers := make([]net.Conn, n), make([]net.Conn, n)
	for i := range n {
		if clients[i], err = net.Dial("tcp", ln.Addr().String()); err != nil {
			t.Fatal(err)
		}
		defer clients[i].Close()
		if servers[i], err = ln.Accept(); err != nil {
			t.Fatal(err)
		}
		defer servers[i].Close()
	}
	await(0, 0) // all idle
	for i := range n / 2 {
		clients[i].Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	}
	// Half hold a request: a sample of 128 of 256 estimates 128, give
	// or take what sampling with replacement gives.
	await(n/2-40, n/2+40)
	for i := range n / 2 {
		if _, err := io.ReadFull(servers[i], make([]byte, len("GET / HTTP/1.1\r\n\r\n"))); err != nil {
			t.Fatal(err)
		}
	}
	await(0, 0) // read: none waits
	// Close all but a few, then let those few hold a request: every one
	// left is read, none of the closed.
	for i := 3; i < n; i++ {
		servers[i].Close()
	}
	for i := range 3 {
		clients[i].Write([]byte("x"))
	}
	await(3, 3)
	if ln.Open() != 3 {
		t.Fatalf("open %d, want 3", ln.Open())
	}
}

package wire

import (
	"io"
	"net"
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

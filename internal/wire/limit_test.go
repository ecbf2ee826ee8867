package wire

import (
	"net"
	"net/http"
	"testing"
	"time"
)

// TestConnectionLimit: beyond the bound a connection waits unaccepted
// until one closes; a full listener closes a connection idle long enough
// (never one idle a moment) to make room; Close ends a waiting Accept.
func TestConnectionLimit(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := LimitConns(raw, 2)
	ln.minIdle = 500 * time.Millisecond
	accepted := make(chan net.Conn, 8)
	acceptDone := make(chan error, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				acceptDone <- err
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
	notAccepted := func(what string) {
		t.Helper()
		select {
		case <-accepted:
			t.Fatalf("%s: accepted over the limit", what)
		case <-time.After(200 * time.Millisecond):
		}
	}
	var held []net.Conn
	for range 2 {
		dial()
		held = append(held, <-accepted)
	}
	dial()
	notAccepted("a third connection")
	if ln.Open() != 2 || ln.Full() != 1 {
		t.Fatalf("open %d full %d, want 2 and 1", ln.Open(), ln.Full())
	}
	// A connection idle a moment is not closed for it.
	ln.ConnState(held[0], http.StateIdle)
	notAccepted("with a connection idle 0 s")
	// Idle long enough: closed, and the third is accepted.
	third := <-accepted
	if ln.Evicted() != 1 {
		t.Fatalf("evicted %d, want 1", ln.Evicted())
	}
	if _, err := held[0].Write([]byte("x")); err == nil {
		if _, err := held[0].Read(make([]byte, 1)); err == nil {
			t.Fatal("the idle connection was not closed")
		}
	}
	// Closing one (twice counts once) lets the next in.
	third.Close()
	third.Close()
	dial()
	<-accepted
	if ln.Open() != 2 {
		t.Fatalf("open %d, want 2", ln.Open())
	}
	// Close ends an Accept waiting for a slot.
	dial()
	notAccepted("a fourth connection")
	ln.Close()
	select {
	case <-acceptDone:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the waiting Accept")
	}
}

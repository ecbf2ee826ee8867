package coord

import (
	"net"
	"net/url"
	"strconv"
	"testing"
)

// TestFreeLoopbackURL: the port is free to listen on, and below the
// kernel's ephemeral range, where no outgoing connection takes it as its
// source port between the pick and the listen.
func TestFreeLoopbackURL(t *testing.T) {
	lo, ok := ephemeralStart()
	if !ok {
		t.Skip("no /proc/sys/net/ipv4/ip_local_port_range here")
	}
	for range 20 {
		u, err := FreeLoopbackURL()
		if err != nil {
			t.Fatal(err)
		}
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(pu.Port())
		if pu.Hostname() != "127.0.0.1" || port < minFixedPort || port >= lo {
			t.Fatalf("%s: want a loopback port in [%d, %d)", u, minFixedPort, lo)
		}
		l, err := net.Listen("tcp", pu.Host)
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		l.Close()
	}
}

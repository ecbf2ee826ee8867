//go:build linux

package bench

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// bindNoPort has a socket bound to an address take its port at connect,
// where the kernel can pick one free for the destination, rather than at
// bind (a net.Dialer's Control).
var bindNoPort = func(_, _ string, c syscall.RawConn) error {
	var err error
	if cerr := c.Control(func(fd uintptr) {
		err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
	}); cerr != nil {
		return cerr
	}
	return err
}

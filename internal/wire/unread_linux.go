package wire

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// unread is how many bytes the kernel holds for c that nobody has read
// (SIOCINQ); ok false when c is not a socket that can tell.
func unread(c net.Conn) (n int, ok bool) {
	sc, is := c.(syscall.Conn)
	if !is {
		return 0, false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var ierr error
	if err := raw.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil || ierr != nil {
		return 0, false
	}
	return n, true
}

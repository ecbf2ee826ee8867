//go:build !linux

package wire

import "net"

// unread cannot tell on this platform (see the Linux version).
func unread(net.Conn) (int, bool) { return 0, false }

//go:build linux

package bench

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// socketQueues counts the established TCP connections of port holding
// unread bytes: on the server's side (local port port: requests no one
// has read) and on its clients' (remote port port: answers no one has
// read). It asks the kernel over netlink (sock_diag, as ss does): reading
// /proc/net/tcp, as it did first, cost the generator 0.3 of a core at 2C
// (profiled: the kernel formatting tens of thousands of lines every
// 250 ms), CPU the servers it measures share.
func socketQueues(port int) (requests, responses int, err error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, 0, fmt.Errorf("bench: sock_diag: %w", err)
	}
	defer unix.Close(fd)
	buf := make([]byte, 64<<10)
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		// struct nlmsghdr, then struct inet_diag_req_v2.
		var req [16 + 56]byte
		binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
		binary.NativeEndian.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
		binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
		req[16], req[17] = family, unix.IPPROTO_TCP
		binary.NativeEndian.PutUint32(req[20:], 1<<tcpEstablished) // idiag_states
		if err := unix.Sendto(fd, req[:], 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return 0, 0, fmt.Errorf("bench: sock_diag: %w", err)
		}
		for done := false; !done; {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				return 0, 0, fmt.Errorf("bench: sock_diag: %w", err)
			}
			var rq, rs int
			if rq, rs, done, err = countQueues(buf[:n], port); err != nil {
				return 0, 0, err
			}
			requests, responses = requests+rq, responses+rs
		}
	}
	return requests, responses, nil
}

// countQueues counts, in one read of a sock_diag dump (netlink messages
// of struct inet_diag_msg), the established connections of port holding
// unread bytes, as socketQueues does; done once the dump's end is in it.
func countQueues(b []byte, port int) (requests, responses int, done bool, err error) {
	for len(b) >= unix.NLMSG_HDRLEN {
		// struct nlmsghdr: length, type.
		size := int(binary.NativeEndian.Uint32(b))
		if size < unix.NLMSG_HDRLEN || size > len(b) {
			return 0, 0, false, fmt.Errorf("bench: sock_diag: a message of %d bytes in %d", size, len(b))
		}
		typ, d := binary.NativeEndian.Uint16(b[4:]), b[unix.NLMSG_HDRLEN:size]
		b = b[min(len(b), (size+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1)):]
		switch typ {
		case unix.NLMSG_DONE:
			return requests, responses, true, nil
		case unix.NLMSG_ERROR:
			return 0, 0, false, fmt.Errorf("bench: sock_diag: the kernel refused the dump")
		}
		// struct inet_diag_msg: state at 1, the ports (network order)
		// at 4 and 6, idiag_rqueue at 56.
		if len(d) < 60 || d[1] != tcpEstablished || binary.NativeEndian.Uint32(d[56:]) == 0 {
			continue
		}
		switch port {
		case int(binary.BigEndian.Uint16(d[4:])):
			requests++
		case int(binary.BigEndian.Uint16(d[6:])):
			responses++
		}
	}
	return requests, responses, false, nil
}

const tcpEstablished = 1

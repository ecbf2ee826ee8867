package bench

import (
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCountQueues: in a fixed sock_diag dump, only established
// connections of the port with unread bytes count, as requests on its
// side and answers on its clients'; a listening socket's backlog, other
// states and other ports do not. A dump ends at NLMSG_DONE, which may
// come in a later read, and a message longer than the read is an error.
func TestCountQueues(t *testing.T) {
	const port, listen, timeWait = 0x1F90, 10, 6
	msg := func(typ uint16, state uint8, local, remote uint16, rqueue uint32) []byte {
		b := make([]byte, unix.NLMSG_HDRLEN+72)
		binary.NativeEndian.PutUint32(b, uint32(len(b)))
		binary.NativeEndian.PutUint16(b[4:], typ)
		d := b[unix.NLMSG_HDRLEN:]
		d[0], d[1] = unix.AF_INET, state
		binary.BigEndian.PutUint16(d[4:], local)
		binary.BigEndian.PutUint16(d[6:], remote)
		binary.NativeEndian.PutUint32(d[56:], rqueue)
		return b
	}
	diag := func(state uint8, local, remote uint16, rqueue uint32) []byte {
		return msg(unix.SOCK_DIAG_BY_FAMILY, state, local, remote, rqueue)
	}
	var dump []byte
	for _, m := range [][]byte{
		diag(listen, port, 0, 5),                   // a backlog
		diag(tcpEstablished, port, 0xC350, 0x12),   // a request
		diag(tcpEstablished, port, 0xC351, 0),      // idle
		diag(tcpEstablished, port, 0xC354, 1),      // a request
		diag(tcpEstablished, 0xC350, port, 0x200),  // an answer
		diag(timeWait, 0xC352, port, 0x200),        // not established
		diag(tcpEstablished, port+1, 0xC353, 0x40), // another port
	} {
		dump = append(dump, m...)
	}
	if rq, rs, done, err := countQueues(dump, port); rq != 2 || rs != 1 || done || err != nil {
		t.Fatalf("fixed dump: %d unread requests, %d unread answers, done %v, %v; want 2 and 1, not done", rq, rs, done, err)
	}
	end := msg(unix.NLMSG_DONE, 0, 0, 0, 0)[:unix.NLMSG_HDRLEN+4]
	binary.NativeEndian.PutUint32(end, uint32(len(end)))
	if rq, rs, done, err := countQueues(append(diag(tcpEstablished, port, 1, 1), end...), port); rq != 1 || rs != 0 || !done || err != nil {
		t.Fatalf("the dump's last read: %d, %d, done %v, %v; want 1, 0, done", rq, rs, done, err)
	}
	if _, _, _, err := countQueues(diag(tcpEstablished, port, 1, 1)[:40], port); err == nil {
		t.Fatal("a message cut short was counted")
	}
}

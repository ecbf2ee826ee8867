//go:build !linux

package bench

import "syscall"

// bindNoPort is Linux's; elsewhere the generator dials from one address.
var bindNoPort func(network, address string, c syscall.RawConn) error

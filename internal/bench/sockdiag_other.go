//go:build !linux

package bench

import "errors"

// socketQueues needs Linux's sock_diag.
func socketQueues(port int) (requests, responses int, err error) {
	return 0, 0, errors.New("bench: socket queues are read on Linux only")
}

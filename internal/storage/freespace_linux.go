//go:build linux

package storage

import (
	"os"
	"syscall"
)

// freeBytes is how much the file system holding dir has free for this
// process: all of its free blocks for root, which may use the blocks ext4
// reserves for it, the blocks available to others otherwise.
func freeBytes(dir string) (int64, bool) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false
	}
	blocks := st.Bavail
	if os.Geteuid() == 0 {
		blocks = st.Bfree
	}
	return int64(blocks) * int64(st.Bsize), true
}

//go:build !linux

package storage

// freeBytes is unknown here: the free-space floor is not checked.
func freeBytes(string) (int64, bool) { return 0, false }

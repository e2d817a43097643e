//go:build unix

package fileopen

import "syscall"

const (
	// nonBlock opens a FIFO without waiting for a writer.
	nonBlock = syscall.O_NONBLOCK
	// dirOnly refuses to open anything but a directory.
	dirOnly = syscall.O_DIRECTORY
)

//go:build unix

package fileopen

import "syscall"

// nonBlock opens a FIFO without waiting for a writer.
const nonBlock = syscall.O_NONBLOCK

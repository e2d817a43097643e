//go:build unix

package fileopen

import (
	"errors"
	"os"
	"syscall"
)

// Read opens path for reading, as os.Open does: the same errors
// (*os.PathError with op "open"), close-on-exec, and a blocking
// descriptor. Like os.Open it blocks opening a FIFO that has no writer:
// a caller that must not block checks the file's type first.
func Read(path string) (*os.File, error) {
	for {
		fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: path, Err: err}
		}
		return os.NewFile(uintptr(fd), path), nil
	}
}

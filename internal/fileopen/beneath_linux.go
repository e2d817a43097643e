package fileopen

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// openNoLinks opens path for reading in one openat2 that refuses a
// symbolic link in any component: the file opened is then the one at that
// very path, so a clean path under the root cannot leave it. ok is false
// when the kernel cannot say (no openat2, or a link in the path — which a
// Root may still follow inside the root): the caller takes the Root's way.
func openNoLinks(path string) (f *os.File, ok bool, err error) {
	for {
		fd, err := unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{
			Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NONBLOCK | unix.O_NOCTTY,
			Resolve: unix.RESOLVE_NO_SYMLINKS,
		})
		switch {
		case err == nil:
			return os.NewFile(uintptr(fd), path), true, nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM), errors.Is(err, unix.E2BIG), errors.Is(err, unix.EINVAL):
			return nil, false, nil
		}
		return nil, true, &os.PathError{Op: "open", Path: path, Err: err}
	}
}

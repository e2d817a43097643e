package fileopen

import (
	"errors"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// openNoLinks opens path for reading in one openat2 that refuses a
// symbolic link in any component: the file opened is then the one at that
// very path, so a clean path under the root cannot leave it. ok is false
// when the kernel cannot say (no openat2, or a link in the path — which a
// Root may still follow inside the root): the caller takes the Root's way.
func openNoLinks(path string) (f *os.File, ok bool, err error) {
	fd, err := openat2NoLinks(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY)
	switch {
	case err == nil:
		return os.NewFile(uintptr(fd), path), true, nil
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM), errors.Is(err, unix.E2BIG), errors.Is(err, unix.EINVAL):
		return nil, false, nil
	}
	return nil, true, &os.PathError{Op: "open", Path: path, Err: err}
}

// NoLinks reports whether path exists and no component of it (the last
// included) is a symbolic link at this instant, in one openat2 (O_PATH,
// RESOLVE_NO_SYMLINKS) and a close. For a clean absolute path, true means
// that resolving every link in it (filepath.EvalSymlinks) gives the path
// itself; false says nothing (a link, a missing component, an error, no
// openat2): the caller resolves the path the long way.
func NoLinks(path string) bool {
	fd, err := openat2NoLinks(path, unix.O_PATH|unix.O_CLOEXEC)
	if err != nil {
		return false
	}
	_ = unix.Close(fd)
	return true
}

// NoLinksDir is NoLinks for a directory: true also says path is one.
func NoLinksDir(path string) bool {
	fd, err := DirNoLinks(path)
	if err != nil {
		return false
	}
	_ = unix.Close(fd)
	return true
}

// DirNoLinks opens the directory at path as an O_PATH descriptor in one
// openat2 that refuses a symbolic link in any component (ELOOP): the
// directory opened is the one at that very path now.
func DirNoLinks(path string) (int, error) {
	return openat2NoLinks(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC)
}

// openat2NoLinks is openat2(path, flags, RESOLVE_NO_SYMLINKS), retried
// when interrupted.
func openat2NoLinks(path string, flags uint64) (int, error) {
	for {
		fd, err := unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{Flags: flags, Resolve: unix.RESOLVE_NO_SYMLINKS})
		if !errors.Is(err, unix.EINTR) {
			return fd, err
		}
	}
}

// rootAtPath checks that r, opened from root, is the directory found at
// root with no symbolic link in any component now (openat2
// RESOLVE_NO_SYMLINKS, compared by device and inode): os.OpenRoot follows
// links in the root's own path, so a root flipped with a link could
// otherwise be opened at the link's target. A kernel without openat2
// keeps os.OpenRoot's answer.
func rootAtPath(r *os.Root, root string) error {
	fd, err := DirNoLinks(root)
	switch {
	case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM), errors.Is(err, unix.E2BIG), errors.Is(err, unix.EINVAL):
		return nil
	case errors.Is(err, unix.ELOOP):
		return &os.PathError{Op: "open", Path: root, Err: ErrEscapes}
	case err != nil:
		return &os.PathError{Op: "open", Path: root, Err: err}
	}
	var st unix.Stat_t
	err = unix.Fstat(fd, &st)
	_ = unix.Close(fd)
	if err != nil {
		return &os.PathError{Op: "stat", Path: root, Err: err}
	}
	fi, err := r.Stat(".")
	if err != nil {
		return err
	}
	if sys, ok := fi.Sys().(*syscall.Stat_t); !ok || uint64(sys.Dev) != uint64(st.Dev) || sys.Ino != st.Ino {
		return &os.PathError{Op: "open", Path: root, Err: ErrEscapes}
	}
	return nil
}

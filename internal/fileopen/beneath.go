package fileopen

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// ErrEscapes is why an open under a root was refused: at the moment of the
// open a component of the path was a symbolic link (or "..") leading out
// of the root — typically swapped in after the path was checked.
var ErrEscapes = errors.New("a symbolic link in the path now leads out of the workspace")

// OpenRoot opens root as an *os.Root and returns path (absolute, clean, at
// or under root) relative to it. Every operation through the Root resolves
// the path one component at a time relative to the directory opened
// before, following a symbolic link only while it stays inside root, so a
// directory replaced by a link after a check cannot take the operation
// elsewhere. An empty root is "/" (no confinement, the same code path).
//
// root must be a real path (no symbolic link in it, as the file tools'
// resolved roots are): on Linux the directory opened must be the one at
// that very path with no link in any component, checked after the open,
// so a root or an ancestor of it swapped for a link (by whoever can write
// its parent) is ErrEscapes, never followed.
func OpenRoot(root, path string) (*os.Root, string, error) {
	root = orSlash(root)
	rel, err := relUnder(root, path)
	if err != nil {
		return nil, "", err
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, "", err
	}
	if err := rootAtPath(r, root); err != nil {
		r.Close()
		return nil, "", err
	}
	return r, rel, nil
}

func orSlash(root string) string {
	if root == "" {
		return string(filepath.Separator)
	}
	return root
}

// relUnder is path relative to root, refused when it is not at or under
// root.
func relUnder(root, path string) (string, error) {
	rel, err := filepath.Rel(root, path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
		return "", &os.PathError{Op: "open", Path: path, Err: ErrEscapes}
	}
	return rel, nil
}

// Escapes returns err with an *os.Root's refusal of a path that leaves the
// root replaced by ErrEscapes (os keeps its own error unexported: it is
// the one failure of a Root operation that is not the kernel's errno).
func Escapes(err error) error {
	var pe *os.PathError
	if err == nil || !errors.As(err, &pe) {
		return err
	}
	var errno syscall.Errno
	if errors.As(pe.Err, &errno) || errors.Is(pe.Err, ErrEscapes) {
		return err
	}
	return &os.PathError{Op: pe.Op, Path: pe.Path, Err: ErrEscapes}
}

// Beneath opens path, at or under root, for reading through OpenRoot's
// Root: never outside root, whatever was swapped into the path after it
// was checked. It does not block on a FIFO (the open is non-blocking);
// read only what the file's Stat says is a regular file.
//
// On Linux a path with no symbolic link in it (a resolved one, as the
// file tools pass) opens in one openat2 that refuses any link, which
// confines it as well (the file is the one at that clean path under
// root); a link in the path, or a kernel without openat2, takes the Root.
func Beneath(root, path string) (*os.File, error) {
	if _, err := relUnder(orSlash(root), path); err != nil {
		return nil, err
	}
	if filepath.Clean(path) == path {
		if f, ok, err := openNoLinks(path); ok {
			return f, err
		}
	}
	r, rel, err := OpenRoot(root, path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return In(r, rel)
}

// EvalSymlinks is filepath.EvalSymlinks(path), answered by one NoLinks
// (on Linux one openat2 and a close) when path is absolute, clean and has
// no symbolic link in any component: its resolution is then path itself.
// Anything else — a link, a missing component, a relative or unclean path,
// no openat2 — takes filepath.EvalSymlinks (a Lstat per component), with
// its answer and its error.
func EvalSymlinks(path string) (string, error) {
	if filepath.IsAbs(path) && filepath.Clean(path) == path && NoLinks(path) {
		return path, nil
	}
	return filepath.EvalSymlinks(path)
}

// NoLinksFile opens path (absolute and clean) for reading, as Beneath
// does, when no component of it is a symbolic link at this instant: on
// Linux one openat2 (RESOLVE_NO_SYMLINKS, non-blocking). The file opened
// is then the one at that very path, so it lies under every directory the
// path lies under lexically. ok is false on any failure — a link in the
// path, a missing file, any error, no openat2 — and nothing is open: the
// caller takes its long way, which gives the failure its own answer.
func NoLinksFile(path string) (f *os.File, ok bool) {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return nil, false
	}
	f, ok, err := openNoLinks(path)
	if !ok || err != nil {
		return nil, false
	}
	return f, true
}

// ReadDirIn lists the directory rel through r, sorted by name as
// os.ReadDir does. It opens rel as a directory without blocking, so a FIFO
// swapped in for the directory is an error (ENOTDIR), not a wait for a
// writer (an *os.Root's FS opens directories with a plain blocking open).
func ReadDirIn(r *os.Root, rel string) ([]fs.DirEntry, error) {
	f, err := r.OpenFile(rel, os.O_RDONLY|nonBlock|dirOnly, 0)
	if err != nil {
		return nil, Escapes(err)
	}
	defer f.Close()
	ents, err := f.ReadDir(-1)
	slices.SortFunc(ents, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return ents, err
}

// In opens rel for reading through r, as Beneath does.
func In(r *os.Root, rel string) (*os.File, error) {
	f, err := r.OpenFile(rel, os.O_RDONLY|nonBlock, 0)
	if err != nil {
		return nil, Escapes(err)
	}
	return f, nil
}

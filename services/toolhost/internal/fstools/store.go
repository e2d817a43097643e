package fstools

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/dsh-dev/dsh/internal/fileopen"
)

// Version is an opaque freshness token: a hash of the file's bytes, so a
// rewrite with identical content keeps the version and any change, however
// quick, alters it (mtime granularity cannot fool it).
type Version string

func versionOf(b []byte) Version {
	sum := sha256.Sum256(b)
	return Version(hex.EncodeToString(sum[:16]))
}

// Observed is the read-before-write policy state: per session, the version of
// every file the session read, wrote or edited. State lives in memory and
// ends with the host.
type Observed struct {
	mu sync.Mutex
	m  map[string]map[string]Version // session → real path → version
}

// NewObserved returns empty policy state.
func NewObserved() *Observed { return &Observed{m: map[string]map[string]Version{}} }

// Record notes that session saw path at version v.
func (o *Observed) Record(session, path string, v Version) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.m[session]
	if s == nil {
		s = map[string]Version{}
		o.m[session] = s
	}
	s[path] = v
}

// Get returns the version session last saw of path.
func (o *Observed) Get(session, path string) (Version, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	v, ok := o.m[session][path]
	return v, ok
}

// pathLocks serialises mutations of one file inside this host: the version
// check, the match and the atomic replace form one critical section.
type pathLocks struct {
	mu sync.Mutex
	m  map[string]*lockEntry
}

type lockEntry struct {
	mu   sync.Mutex
	refs int
}

func (l *pathLocks) lock(p string) (unlock func()) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*lockEntry{}
	}
	e := l.m[p]
	if e == nil {
		e = &lockEntry{}
		l.m[p] = e
	}
	e.refs++
	l.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		l.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(l.m, p)
		}
		l.mu.Unlock()
	}
}

// open opens t for reading beneath its root (fileopen.Beneath): never a
// file outside it, whatever was swapped into the path since t was
// resolved, and never blocking on a FIFO. The caller checks the type.
func (t Target) open() (*os.File, error) {
	f, err := fileopen.Beneath(t.Root, t.Real)
	if err != nil {
		return nil, t.IOError("open", err)
	}
	return f, nil
}

// IOError is the tool error of a failed operation on t: a path that a
// symbolic link now leads out of t's root is refused with t's denial code,
// a missing file is CodeNotFound, anything else CodeIOError.
func (t Target) IOError(op string, err error) error {
	switch {
	case errors.Is(err, fileopen.ErrEscapes):
		return fsError(t.denied, "%s changed while it was in use: a symbolic link in its path now leads out of the workspace %s", t.Display, t.Root)
	case errors.Is(err, fs.ErrNotExist):
		return fsError(CodeNotFound, "file not found: %s", t.Display)
	}
	return fsError(CodeIOError, "%s %s: %v", op, t.Display, err)
}

// readCurrent returns a regular file's bytes, or (nil, false) when absent.
func readCurrent(t Target) ([]byte, bool, error) {
	f, err := fileopen.Beneath(t.Root, t.Real)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, t.IOError("open", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, true, t.IOError("stat", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, true, fsError(CodeNotRegularFile, "%s is not a regular file", t.Display)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, true, t.IOError("read", err)
	}
	return b, true, nil
}

// atomicWrite replaces t with b through a temporary file in the same
// directory and a rename, keeping the old file's permission bits. Every
// step (the missing directories, the temporary file, the rename) goes
// through an os.Root of t's root, so none of them can land outside it.
func atomicWrite(t Target, b []byte) (err error) {
	r, rel, err := fileopen.OpenRoot(t.Root, t.Real)
	if err != nil {
		return fsError(CodeIOError, "write %s: %v", t.Display, err)
	}
	defer r.Close()
	defer func() {
		// A missing directory here is an I/O failure of the write, not
		// a file not found: only a link out of the root is refused.
		if err = fileopen.Escapes(err); errors.Is(err, fileopen.ErrEscapes) {
			err = t.IOError("write", err)
		} else if err != nil {
			err = fsError(CodeIOError, "write %s: %v", t.Display, err)
		}
	}()
	mode := fs.FileMode(0o644)
	if fi, err := r.Stat(rel); err == nil {
		mode = fi.Mode().Perm()
	}
	dir := filepath.Dir(rel)
	if err := r.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+filepath.Base(rel)+".dsh-"+rand.Text())
	f, err := r.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			r.Remove(tmp)
		}
	}()
	if _, err := f.Write(b); err != nil {
		return err
	}
	if err := f.Chmod(mode); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := r.Rename(tmp, rel); err != nil {
		return err
	}
	ok = true
	return nil
}

func isBinary(b []byte) bool {
	if len(b) > 8000 {
		b = b[:8000]
	}
	return bytes.IndexByte(b, 0) >= 0
}

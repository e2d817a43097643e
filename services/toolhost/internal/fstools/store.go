package fstools

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
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

// readCurrent returns a regular file's bytes, or (nil, false) when absent.
func readCurrent(p string) ([]byte, bool, error) {
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fsError(CodeIOError, "stat %s: %v", p, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, true, fsError(CodeNotRegularFile, "%s is not a regular file", p)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, true, fsError(CodeIOError, "read %s: %v", p, err)
	}
	return b, true, nil
}

// atomicWrite replaces p with b through a temporary file in the same
// directory and a rename, keeping the old file's permission bits.
func atomicWrite(p string, b []byte) error {
	mode := fs.FileMode(0o644)
	if fi, err := os.Stat(p); err == nil {
		mode = fi.Mode().Perm()
	}
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fsError(CodeIOError, "create directory %s: %v", dir, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(p)+".dsh-*")
	if err != nil {
		return fsError(CodeIOError, "write %s: %v", p, err)
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(b); err != nil {
		return fsError(CodeIOError, "write %s: %v", p, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		return fsError(CodeIOError, "chmod %s: %v", p, err)
	}
	if err := tmp.Sync(); err != nil {
		return fsError(CodeIOError, "sync %s: %v", p, err)
	}
	if err := tmp.Close(); err != nil {
		return fsError(CodeIOError, "close %s: %v", p, err)
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return fsError(CodeIOError, "replace %s: %v", p, err)
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

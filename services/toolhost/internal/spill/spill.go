// Package spill keeps the full output of tool calls whose inline result was
// capped: one private directory (mode 0700) per host, one subdirectory per
// session (named by a hash of the session id, so ids never become paths),
// files created exclusively with mode 0600. The paths go into tool results so
// the model can read the rest with read, grep or bash.
package spill

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
)

// Dir is a host's spill directory.
type Dir struct {
	root string
}

// New creates (or reuses) root with mode 0700.
func New(root string) (*Dir, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("spill dir %q must be absolute", root)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("create spill dir: %w", err)
	}
	if err := os.Chmod(root, 0o700); err != nil {
		return nil, fmt.Errorf("chmod spill dir: %w", err)
	}
	// Its real path: the sandbox opens a session's directory with no
	// symbolic link in its path (a link there fails the call closed).
	real, err := filepath.EvalSymlinks(root)
	if err != nil {
		return nil, fmt.Errorf("spill dir: %w", err)
	}
	return &Dir{root: real}, nil
}

// Root is the directory's absolute real path (no symbolic link in it).
func (d *Dir) Root() string { return d.root }

// unsafeName matches what a spill file's name may not hold, compiled on
// first use.
var unsafeName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`[^A-Za-z0-9._-]+`) })

// SessionDir is the directory of a session's spill files (it may not
// exist yet).
func (d *Dir) SessionDir(sessionID string) string {
	sum := sha256.Sum256([]byte(sessionID))
	return filepath.Join(d.root, "session-"+hex.EncodeToString(sum[:8]))
}

// Create opens a new private file for a session; name is a hint only.
func (d *Dir) Create(sessionID, name string) (*os.File, error) {
	dir := d.SessionDir(sessionID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create spill session dir: %w", err)
	}
	safe := strings.ReplaceAll(unsafeName().ReplaceAllString(name, "_"), "..", "_")
	if len(safe) > 80 {
		safe = safe[:80]
	}
	f, err := os.CreateTemp(dir, "*-"+safe)
	if err != nil {
		return nil, fmt.Errorf("create spill file: %w", err)
	}
	return f, nil
}

// WriteText stores content in a new file and returns its path.
func (d *Dir) WriteText(sessionID, name, content string) (string, error) {
	f, err := d.Create(sessionID, name)
	if err != nil {
		return "", err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		os.Remove(f.Name())
		return "", fmt.Errorf("write spill file: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("close spill file: %w", err)
	}
	return f.Name(), nil
}

// Package fstools holds the built-in file tools read, write and edit, with the
// read-before-write policy of the original harness: a write over an existing
// file or an edit needs a prior read (or write, or edit) of the unchanged
// file in the same session, else FS_NOT_OBSERVED or FS_STALE_VERSION.
//
// Paths resolve against the session's cwd and are confined to the workspace
// root (FS_PERMISSION_DENIED for "../" and symlink escapes). Writes and edits
// are atomic (temporary file + rename) and serialised per file inside the
// host, so of two concurrent edits based on the same read exactly one wins
// and the other gets FS_STALE_VERSION.
package fstools

import (
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

// Limits of the read tool (the original's defaults).
const (
	ReadLimit         = 2000
	ReadMaxLineLength = 2000
	ReadMaxBytes      = 51200
)

// FS is the file-tool family sharing one policy state.
type FS struct {
	conf     *Confiner
	observed *Observed
	locks    pathLocks
}

// New returns the file tools over a confiner.
func New(conf *Confiner) *FS {
	return &FS{conf: conf, observed: NewObserved()}
}

// Tools returns read, write and edit.
func (f *FS) Tools() []toolsdk.Tool {
	return []toolsdk.Tool{f.readTool(), f.writeTool(), f.editTool()}
}

// Observed exposes the policy state (tests, diagnostics).
func (f *FS) Observed() *Observed { return f.observed }

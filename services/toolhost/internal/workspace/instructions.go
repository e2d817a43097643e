package workspace

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"unicode/utf8"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/fileopen"
)

// InstructionNames are the instruction file names by precedence: a
// directory contributes its AGENTS.md, else its CLAUDE.md.
var InstructionNames = []string{"AGENTS.md", "CLAUDE.md"}

// dirsDown lists the directories from project down to cwd, outermost first.
func dirsDown(project, cwd string) []string {
	var up []string
	for d := cwd; ; d = filepath.Dir(d) {
		up = append(up, d)
		if d == project || d == filepath.Dir(d) {
			break
		}
	}
	out := make([]string, len(up))
	for i, d := range up {
		out[len(up)-1-i] = d
	}
	return out
}

// instructions reads the instruction files from project down to cwd within
// the caps.
func (r *Reader) instructions(project, cwd string) ([]*toolsv1.InstructionFile, []*toolsv1.WorkspaceNotice) {
	var files []*toolsv1.InstructionFile
	var notices []*toolsv1.WorkspaceNotice
	budget := r.cfg.MaxTotalBytes
	note := func(path, format string, args ...any) {
		notices = append(notices, &toolsv1.WorkspaceNotice{Path: path, Message: fmt.Sprintf(format, args...)})
	}
	for _, dir := range dirsDown(project, cwd) {
		for _, name := range InstructionNames {
			path := filepath.Join(dir, name)
			if _, err := os.Lstat(path); err != nil {
				continue
			}
			f, skip := r.readInstruction(path)
			if skip != "" {
				note(path, "%s skipped: %s", name, skip)
				break
			}
			if budget <= 0 {
				note(path, "%s skipped: the total cap of %d bytes is used up", name, r.cfg.MaxTotalBytes)
				break
			}
			limit, why := r.cfg.MaxFileBytes, fmt.Sprintf("the per-file cap of %d bytes", r.cfg.MaxFileBytes)
			if budget < limit {
				limit, why = budget, fmt.Sprintf("the total cap of %d bytes", r.cfg.MaxTotalBytes)
			}
			if len(f.Content) > limit {
				f.Content, f.Truncated = cutUTF8(f.Content, limit), true
				note(path, "%s truncated to %d of %d bytes (%s)", name, len(f.Content), f.SizeBytes, why)
			}
			budget -= len(f.Content)
			files = append(files, f)
			break
		}
	}
	return files, notices
}

// readInstruction reads one file, or says why it is skipped.
func (r *Reader) readInstruction(path string) (*toolsv1.InstructionFile, string) {
	b, err := r.readFile(path, true)
	switch {
	case err != nil: // errOutside's text says it resolves outside the workspace
		return nil, err.Error()
	case !utf8.Valid(b):
		return nil, "not UTF-8 text"
	}
	return &toolsv1.InstructionFile{Path: path, Content: string(b), SizeBytes: int64(len(b))}, ""
}

// errOutside: the path resolves outside the workspace.
var errOutside = errors.New("it is a symlink that resolves outside the workspace")

// readFile reads a regular file of at most MaxReadBytes. A confined path
// (a workspace file, the reader not Unconfined) must resolve inside the
// workspace and is then opened beneath its real root (fileopen.Beneath), so
// a link swapped into the path after that check cannot lead the read out
// of it; no open blocks on a FIFO. A file that grew since its stat is cut,
// never read unbounded.
func (r *Reader) readFile(path string, confined bool) ([]byte, error) {
	// open tries the one-openat2 open first and otherwise resolves the
	// path and opens it beneath the root (a link swapped in after that is
	// refused); unconfined paths (the deployment's own skill homes, which
	// may well be reached through links) are resolved, never refused.
	confined = confined && !r.cfg.Unconfined
	f, err := r.open(path, confined)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	switch {
	case err != nil:
		return nil, fmt.Errorf("cannot stat: %w", err)
	case !fi.Mode().IsRegular():
		return nil, errors.New("not a regular file")
	case fi.Size() > r.cfg.MaxReadBytes:
		return nil, fmt.Errorf("%d bytes is more than the %d bytes read at most", fi.Size(), r.cfg.MaxReadBytes)
	}
	b, err := io.ReadAll(io.LimitReader(f, r.cfg.MaxReadBytes))
	if err != nil {
		return nil, fmt.Errorf("cannot read: %w", err)
	}
	return b, nil
}

// open opens path for readFile. A path with no symbolic link in it —
// lexically inside the workspace's real root when confined — opens in one
// openat2 refusing links (fileopen.NoLinksFile): it is its own resolution,
// inside the root, and that open is the one Beneath would make. Anything
// else is resolved first and opened beneath the root, as before.
func (r *Reader) open(path string, confined bool) (*os.File, error) {
	if !confined || fileopen.Within(path, r.realRoot) {
		if f, ok := fileopen.NoLinksFile(path); ok {
			return f, nil
		}
	}
	// Here the one openat2 failed or path is outside: no shortcut is left.
	real, err := filepath.EvalSymlinks(path)
	switch {
	case err != nil && confined: // as inside: what does not resolve is not inside
		return nil, errOutside
	case err != nil:
		return nil, fmt.Errorf("cannot resolve: %w", err)
	case confined && !fileopen.Within(real, r.realRoot):
		return nil, errOutside
	}
	root := ""
	if confined {
		root = r.realRoot
	}
	f, err := fileopen.Beneath(root, real)
	if errors.Is(err, fileopen.ErrEscapes) {
		return nil, errOutside
	}
	if err != nil {
		return nil, fmt.Errorf("cannot open: %w", err)
	}
	return f, nil
}

// cutUTF8 cuts s to at most n bytes without splitting a code point.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

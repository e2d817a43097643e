package fstools

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/dsh-dev/dsh/internal/fileopen"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

// Confiner resolves tool paths against the session's cwd and confines them
// to the workspace root, following symlinks so that a link pointing out of
// the workspace is refused like a "../" path.
type Confiner struct {
	// Root is the host's absolute workspace root.
	Root string
	// ReadOnly are extra absolute roots readable but not writable (the
	// host's spill directory, so capped outputs can be read back).
	ReadOnly []string
	// Unconfined disables confinement (paths still resolve against cwd).
	Unconfined bool
	// Scope, when set, gives each call's confinement from its sandbox
	// policy (ResolveCall); Root, ReadOnly and Unconfined are then unused.
	Scope func(*toolsdk.Call) (Scope, error)

	once sync.Once
	real map[string]string // resolved Root and ReadOnly, computed once
}

// realRoot resolves a root, from the cache for the configured ones.
func (c *Confiner) realRoot(r string) (string, error) {
	c.once.Do(func() {
		c.real = map[string]string{}
		for _, p := range append([]string{c.Root}, c.ReadOnly...) {
			if rp, err := realPath(filepath.Clean(p)); err == nil {
				c.real[p] = rp
			}
		}
	})
	if rp, ok := c.real[r]; ok {
		return rp, nil
	}
	return realPath(filepath.Clean(r))
}

// Scope is one call's file-tool confinement, the in-process twin of the
// launcher's Landlock rules.
type Scope struct {
	// Mode names the sandbox mode in messages.
	Mode string
	// Unconfined (danger-full-access): any path.
	Unconfined bool
	// ReadOnly: every write is FS_SANDBOX_DENIED.
	ReadOnly bool
	// Root is the session's real workspace root; Read are extra readable
	// real roots (the session's spill directory).
	Root string
	Read []string
}

// ResolveCall resolves p for a call under its scope (Scope set), else as
// Resolve with the call's workspace root. Paths outside the scope are
// FS_SANDBOX_DENIED, checked on the fully symlink-resolved path.
func (c *Confiner) ResolveCall(call *toolsdk.Call, p string, write bool) (Target, error) {
	if c.Scope == nil {
		return c.Resolve(call.Cwd, call.WorkspaceRoot, p, write)
	}
	sc, err := c.Scope(call)
	if err != nil {
		return Target{}, err
	}
	return resolveScoped(call.Cwd, sc, p, write)
}

// OpenRead is ResolveCall(call, p, false) followed by Target.open, for a
// tool that reads the file. Under a confined scope, a path that lies
// lexically in one of its roots and has no symbolic link in any component
// (the usual case) opens in one openat2 refusing links
// (fileopen.NoLinksFile): its resolution is then itself, so it is confined
// to that root exactly as ResolveCall would find, and the open is the one
// Target.open makes — without the separate probe of the path ResolveCall
// needs to resolve it. Anything else (a link, a missing file, any error, a
// path outside) takes ResolveCall and Target.open, with their answers.
func (c *Confiner) OpenRead(call *toolsdk.Call, p string) (Target, *os.File, error) {
	if c.Scope == nil {
		return c.openResolved(c.Resolve(call.Cwd, call.WorkspaceRoot, p, false))
	}
	sc, err := c.Scope(call)
	if err != nil {
		return Target{}, nil, err
	}
	if !sc.Unconfined && p != "" {
		abs := p
		if !filepath.IsAbs(abs) {
			abs = filepath.Join(call.Cwd, p)
		}
		abs = filepath.Clean(abs)
		if r, ok := lexicalRoot(abs, sc); ok {
			if f, ok := fileopen.NoLinksFile(abs); ok {
				return Target{Display: abs, Real: abs, Root: r, denied: CodeSandboxDenied}, f, nil
			}
		}
	}
	return c.openResolved(resolveScoped(call.Cwd, sc, p, false))
}

// lexicalRoot is the first of sc's readable roots abs lies in, lexically:
// the root ResolveCall confines abs to when abs is its own resolution.
func lexicalRoot(abs string, sc Scope) (string, bool) {
	if fileopen.Within(abs, sc.Root) {
		return sc.Root, true
	}
	for _, r := range sc.Read {
		if fileopen.Within(abs, r) {
			return r, true
		}
	}
	return "", false
}

func (c *Confiner) openResolved(t Target, err error) (Target, *os.File, error) {
	if err != nil {
		return Target{}, nil, err
	}
	f, err := t.open()
	if err != nil {
		return Target{}, nil, err
	}
	return t, f, nil
}

// resolveScoped is ResolveCall under the call's scope sc.
func resolveScoped(cwd string, sc Scope, p string, write bool) (Target, error) {
	t, err := target(cwd, p)
	if err != nil || sc.Unconfined {
		return t, err
	}
	t.denied = CodeSandboxDenied
	if write && sc.ReadOnly {
		return Target{}, fsError(CodeSandboxDenied, "%s: writes are denied under %s mode", t.Display, sc.Mode)
	}
	roots := []string{sc.Root}
	if !write {
		roots = append(roots, sc.Read...)
	}
	for _, r := range roots {
		if fileopen.Within(t.Real, r) {
			t.Root = r
			return t, nil
		}
	}
	if fileopen.Within(t.Display, sc.Root) {
		return Target{}, fsError(CodeSandboxDenied, "%s resolves through a symlink to %s, outside the workspace %s (%s mode)", t.Display, t.Real, sc.Root, sc.Mode)
	}
	return Target{}, fsError(CodeSandboxDenied, "%s is outside the workspace %s (%s mode)", t.Display, sc.Root, sc.Mode)
}

func target(cwd, p string) (Target, error) {
	if p == "" {
		return Target{}, fsError(CodeNotFound, "empty path")
	}
	abs := p
	if !filepath.IsAbs(abs) {
		abs = filepath.Join(cwd, p)
	}
	abs = filepath.Clean(abs)
	real, err := realPath(abs)
	if err != nil {
		return Target{}, fsError(CodeIOError, "resolve %s: %v", abs, err)
	}
	return Target{Display: abs, Real: real, denied: CodePermissionDenied}, nil
}

// Target is a resolved path.
type Target struct {
	// Display is the cleaned absolute path as the model named it.
	Display string
	// Real is the path with every symlink resolved; I/O uses it.
	Real string
	// Root is the real root Real was confined to ("" when unconfined):
	// I/O opens Real beneath it (fileopen.Beneath), so a link swapped
	// into the path after the check cannot lead the I/O out of it.
	Root string
	// denied is the code of a refusal to leave Root.
	denied string
}

// Resolve resolves p for a call. root is the call's workspace root (empty:
// the confiner's). write refuses the read-only roots.
func (c *Confiner) Resolve(cwd, root, p string, write bool) (Target, error) {
	t, err := target(cwd, p)
	if err != nil {
		return Target{}, err
	}
	abs, real := t.Display, t.Real
	if c.Unconfined {
		return t, nil
	}
	if root == "" {
		root = c.Root
	}
	roots := []string{root}
	if !write {
		roots = append(roots, c.ReadOnly...)
	}
	lexical := false
	for _, r := range roots {
		rr, err := c.realRoot(r)
		if err != nil {
			continue
		}
		if fileopen.Within(abs, r) || fileopen.Within(abs, rr) {
			lexical = true
		}
		if fileopen.Within(real, rr) {
			t.Root = rr
			return t, nil
		}
	}
	if lexical {
		return Target{}, fsError(CodePermissionDenied, "%s resolves through a symlink to %s, outside the workspace %s", abs, real, root)
	}
	return Target{}, fsError(CodePermissionDenied, "%s is outside the workspace %s", abs, root)
}

// realPath resolves every symlink in an absolute clean path, including a
// dangling final link; components past the first missing one are kept
// lexically. A path that exists with no link in it is its own resolution,
// confirmed in one openat2 (fileopen.NoLinks) instead of a Lstat per
// component; anything else takes the walk.
func realPath(p string) (string, error) {
	if filepath.IsAbs(p) && fileopen.NoLinks(p) {
		return p, nil
	}
	parts := splitPath(p)
	cur := string(filepath.Separator)
	for hops := 0; len(parts) > 0; {
		next := filepath.Join(cur, parts[0])
		parts = parts[1:]
		fi, err := os.Lstat(next)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrInvalid) || isNotDir(err) {
			return filepath.Join(append([]string{next}, parts...)...), nil
		}
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if hops++; hops > 40 {
			return "", fmt.Errorf("too many levels of symbolic links")
		}
		target, err := os.Readlink(next)
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			cur = string(filepath.Separator)
		}
		parts = append(splitPath(target), parts...)
	}
	return cur, nil
}

func isNotDir(err error) bool {
	var pe *fs.PathError
	return errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "not a directory")
}

func splitPath(p string) []string {
	var out []string
	for _, s := range strings.Split(p, string(filepath.Separator)) {
		if s != "" && s != "." {
			out = append(out, s)
		}
	}
	return out
}

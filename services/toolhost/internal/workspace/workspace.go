// Package workspace reads the context a session gets from the workspace it
// works in (semantics.md §7.8, round2.md §4): the instruction files
// (AGENTS.md, else CLAUDE.md, from the project root down to the cwd, capped
// per file and in total) and the skill catalog (the local skill roots by
// rank), plus the `skill` tool that loads one skill for the model.
//
// Nothing here fails a session over a bad file: an instruction file that is
// not UTF-8, too big, or a symlink out of the workspace is skipped with a
// notice; a skill with malformed frontmatter or a bad name is listed as an
// error and not offered. Only a cwd outside the workspace is refused
// (ErrOutside).
package workspace

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/proto"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/fileopen"
)

// Defaults of the caps.
const (
	DefaultMaxFileBytes  = 32 << 10
	DefaultMaxTotalBytes = 64 << 10
	// DefaultMaxReadBytes is the size above which a file is not read at all.
	DefaultMaxReadBytes = 1 << 20
)

// ErrOutside is the error of a cwd that is not inside the workspace root.
var ErrOutside = errors.New("cwd is outside the workspace")

// Config configures a Reader.
type Config struct {
	// Root is the absolute workspace root; every project file read must
	// resolve inside it.
	Root string
	// Unconfined accepts any cwd (the host's --unconfined); project files
	// must still resolve inside the project root.
	Unconfined bool
	// DshHome, when set, adds the <DshHome>/skills root (rank 400).
	DshHome string
	// AgentsHome, when set, adds the <AgentsHome>/skills root (rank 500).
	AgentsHome string
	// CustomSkillDirs are extra skill roots (rank 300), in order.
	CustomSkillDirs []string
	// MaxFileBytes caps one instruction file; zero means DefaultMaxFileBytes.
	MaxFileBytes int
	// MaxTotalBytes caps all instruction files together; zero means
	// DefaultMaxTotalBytes.
	MaxTotalBytes int
	// MaxReadBytes: larger files are skipped unread; zero means
	// DefaultMaxReadBytes.
	MaxReadBytes int64
}

// Reader reads workspace contexts. It keeps no state between calls: every
// call re-reads the files, so the version always reflects the disk.
type Reader struct {
	cfg      Config
	realRoot string
}

// New validates cfg.
func New(cfg Config) (*Reader, error) {
	if !filepath.IsAbs(cfg.Root) {
		return nil, fmt.Errorf("workspace root %q must be an absolute path", cfg.Root)
	}
	cfg.Root = filepath.Clean(cfg.Root)
	real, err := filepath.EvalSymlinks(cfg.Root)
	if err != nil {
		return nil, fmt.Errorf("workspace root: %w", err)
	}
	if cfg.MaxFileBytes <= 0 {
		cfg.MaxFileBytes = DefaultMaxFileBytes
	}
	if cfg.MaxTotalBytes <= 0 {
		cfg.MaxTotalBytes = DefaultMaxTotalBytes
	}
	if cfg.MaxReadBytes <= 0 {
		cfg.MaxReadBytes = DefaultMaxReadBytes
	}
	return &Reader{cfg: cfg, realRoot: real}, nil
}

// Bounds are what one call of the skill tool, or one workspace context, is
// confined to: Root, the
// clean absolute root as the call names it (its cwd must lie inside it
// lexically), and Real, Root's resolution (the cwd, the project root and
// every project file must resolve inside it). A toolhost passes a
// session's vetted workspace root, so a session of ws/a reads nothing of
// ws/b or of ws itself even on a host whose root is ws.
type Bounds struct{ Root, Real string }

// confinedTo returns a Reader confined to b instead of the host's root, or
// ErrOutside when b is not inside the host's root (lexically and
// resolved). An empty b is the host's root.
func (r *Reader) confinedTo(b Bounds) (*Reader, error) {
	if b.Root == "" {
		return r, nil
	}
	if !filepath.IsAbs(b.Root) || filepath.Clean(b.Root) != b.Root || !filepath.IsAbs(b.Real) || filepath.Clean(b.Real) != b.Real {
		return nil, fmt.Errorf("%w: the session root %q (resolved %q) is not a clean absolute path", ErrOutside, b.Root, b.Real)
	}
	if !r.cfg.Unconfined && (!fileopen.Within(b.Root, r.cfg.Root) || !fileopen.Within(b.Real, r.realRoot)) {
		return nil, fmt.Errorf("%w: the session root %s is not inside %s", ErrOutside, b.Root, r.cfg.Root)
	}
	c := *r
	c.cfg.Root, c.realRoot = b.Root, b.Real
	return &c, nil
}

// at returns the Reader confined to b (empty: the host's root) and cwd
// checked inside it (clean), or ErrOutside.
func (r *Reader) at(b Bounds, cwd string) (*Reader, string, error) {
	r, err := r.confinedTo(b)
	if err != nil {
		return nil, "", err
	}
	cwd, err = r.checkCwd(cwd)
	return r, cwd, err
}

// Context reads the instruction files and the skill catalog of cwd,
// confined to b: a GetWorkspaceContext's session root, vetted by the
// toolhost (empty: the host's root). The project-root search stops at
// b.Root, and every instruction file and project skill must resolve
// inside b.Real.
func (r *Reader) Context(b Bounds, cwd string) (*toolsv1.GetWorkspaceContextResponse, error) {
	r, cwd, err := r.at(b, cwd)
	if err != nil {
		return nil, err
	}
	project := r.projectRoot(cwd)
	resp := &toolsv1.GetWorkspaceContextResponse{ProjectRoot: project, OwnsWorkspace: true}
	resp.Instructions, resp.Notices = r.instructions(project, cwd)
	cat := r.catalog(project)
	resp.Skills, resp.SkillErrors = cat.summaries(), cat.errors
	resp.Version = version(resp)
	return resp, nil
}

// checkCwd cleans cwd and refuses one outside the workspace (or missing).
func (r *Reader) checkCwd(cwd string) (string, error) {
	if !filepath.IsAbs(cwd) {
		return "", fmt.Errorf("%w: %q is not an absolute path", ErrOutside, cwd)
	}
	cwd = filepath.Clean(cwd)
	if !r.cfg.Unconfined && !fileopen.Within(cwd, r.cfg.Root) {
		return "", fmt.Errorf("%w: %s is not inside %s", ErrOutside, cwd, r.cfg.Root)
	}
	fi, err := os.Stat(cwd)
	if err != nil || !fi.IsDir() {
		return "", fmt.Errorf("%w: %s is not a directory", ErrOutside, cwd)
	}
	if real, err := fileopen.EvalSymlinks(cwd); err != nil || (!r.cfg.Unconfined && !fileopen.Within(real, r.realRoot)) {
		return "", fmt.Errorf("%w: %s resolves outside %s", ErrOutside, cwd, r.cfg.Root)
	}
	return cwd, nil
}

// projectRoot is the nearest ancestor of cwd (itself included) holding
// .git, searched no higher than the workspace root; else cwd.
func (r *Reader) projectRoot(cwd string) string {
	for d := cwd; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(filepath.Join(d, ".git")); err == nil {
			return d
		}
		if d == r.cfg.Root || d == filepath.Dir(d) || (!r.cfg.Unconfined && !fileopen.Within(filepath.Dir(d), r.cfg.Root)) {
			return cwd
		}
	}
}

// version is a digest of everything a context says.
func version(resp *toolsv1.GetWorkspaceContextResponse) string {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(resp)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

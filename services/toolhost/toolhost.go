// Package toolhost is dsh's built-in toolhost: the coding tools (bash and its
// background-task tools, read, write, edit, glob, grep, todo_write, skill) served
// over the dsh.tools.v1.ToolHost gRPC service with the Go tool SDK.
//
// File tools are confined to the workspace root (the host's, or the call's
// own root when it lies inside the host's) and follow the read-before-write
// policy per session. bash runs each call in its own process group, killed
// with everything it started on timeout or cancellation.
//
// # Shutdown
//
// Close kills every background task (TERM, then KILL after the grace) and
// waits for them, then removes the spill directory if the service created
// it. Stop the gRPC server first so no call starts a new task meanwhile.
//
// # Sessions
//
// Background tasks belong to the session that started them and die with it:
// the agent calls EndSession when a session leaves it (disposed, unloaded or
// at shutdown), and the host kills that session's tasks, whole process trees,
// leaving other sessions' tasks running.
package toolhost

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/fileopen"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/dsh-dev/dsh/services/toolhost/internal/bash"
	"github.com/dsh-dev/dsh/services/toolhost/internal/fstools"
	"github.com/dsh-dev/dsh/services/toolhost/internal/sandbox"
	"github.com/dsh-dev/dsh/services/toolhost/internal/search"
	"github.com/dsh-dev/dsh/services/toolhost/internal/spill"
	"github.com/dsh-dev/dsh/services/toolhost/internal/todo"
	"github.com/dsh-dev/dsh/services/toolhost/internal/workspace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Config configures the built-in toolhost.
type Config struct {
	// WorkspaceRoot is the absolute directory file tools are confined to.
	// Required; it must exist.
	WorkspaceRoot string
	// Unconfined makes danger-full-access the default of calls that carry
	// no sandbox policy (file tools then reach any path). Off by default.
	Unconfined bool
	// DefaultMode is the sandbox mode of calls that carry no policy (an
	// agent always sends one); empty means workspace-write.
	DefaultMode sandbox.Mode
	// DefaultNetworkOff turns the network off for calls that carry no
	// policy.
	DefaultNetworkOff bool
	// Limits are the per-call resource limits; zero fields take the
	// sandbox defaults.
	Limits sandbox.Limits
	// ToolEnv names host environment variables passed through to tool
	// processes (besides PATH, HOME, LANG and co.).
	ToolEnv []string
	// SpillDir holds capped outputs; empty means a fresh private temporary
	// directory removed by Close.
	SpillDir string
	// MaxArgumentBytes bounds one call's argument text; zero means 1 MiB.
	MaxArgumentBytes int
	// KillGrace is the TERM→KILL grace of bash kills; zero means 3 s.
	KillGrace time.Duration
	// Environ is the host environment the tool allow-list picks from; nil
	// means os.Environ().
	Environ []string
	// Now stamps background tasks; nil means time.Now.
	Now func() time.Time
	// ServerOptions are added to the gRPC server Serve builds: TLS
	// credentials and the peer check (internal/auth.ServerFlags).
	ServerOptions []grpc.ServerOption
	// DshHome and AgentsHome, when set, add their skills/ folders as skill
	// roots (ranks 400 and 500); SkillDirs are extra roots (rank 300).
	DshHome, AgentsHome string
	SkillDirs           []string
	// SandboxVerdictDir, when set, keeps the sandbox probe's verdict for
	// this boot, so a later start with the same kernel, binaries and limits
	// skips the probe (a cached verdict still fails closed per call); see
	// SandboxVerdictDir. Empty: probe at every start.
	SandboxVerdictDir string
}

// Service is the built-in toolhost.
type Service struct {
	host       *toolsdk.Host
	tasks      *bash.Tasks
	spill      *spill.Dir
	ownSpill   bool
	root       string
	realRoot   string
	log        *slog.Logger
	unconfined bool
	srvOpts    []grpc.ServerOption
	sandbox    *sandbox.Sandbox
	defPolicy  sandbox.Policy
	workspace  *workspace.Reader
}

// New validates cfg and builds the service.
func New(cfg Config, logger *slog.Logger) (*Service, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.WorkspaceRoot == "" {
		return nil, errors.New("toolhost: workspace root is required")
	}
	if !filepath.IsAbs(cfg.WorkspaceRoot) {
		return nil, fmt.Errorf("toolhost: workspace root %q must be an absolute path", cfg.WorkspaceRoot)
	}
	root := filepath.Clean(cfg.WorkspaceRoot)
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("toolhost: workspace root %s is not a directory", root)
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return nil, fmt.Errorf("toolhost: workspace root: %w", err)
	}
	s := &Service{root: root, realRoot: realRoot, log: logger, unconfined: cfg.Unconfined, srvOpts: cfg.ServerOptions}
	s.defPolicy = sandbox.Policy{Mode: cfg.DefaultMode, Network: !cfg.DefaultNetworkOff}
	switch {
	case cfg.Unconfined:
		s.defPolicy.Mode = sandbox.DangerFullAccess
	case s.defPolicy.Mode == "":
		s.defPolicy.Mode = sandbox.WorkspaceWrite
	}
	spillDir := cfg.SpillDir
	if spillDir == "" {
		d, err := os.MkdirTemp("", "dsh-toolhost-spill-")
		if err != nil {
			return nil, fmt.Errorf("toolhost: spill dir: %w", err)
		}
		spillDir, s.ownSpill = d, true
	}
	sp, err := spill.New(spillDir)
	if err != nil {
		return nil, fmt.Errorf("toolhost: %w", err)
	}
	s.spill = sp
	environ := cfg.Environ
	if environ == nil {
		environ = os.Environ()
	}
	s.sandbox, err = sandbox.New(sandbox.Config{
		HostRoot: realRoot, SpillRoot: sp.Root(), Limits: cfg.Limits, Environ: environ, ToolEnv: cfg.ToolEnv, Logger: logger,
		VerdictDir: cfg.SandboxVerdictDir,
	})
	if err != nil {
		return nil, fmt.Errorf("toolhost: %w", err)
	}
	conf := &fstools.Confiner{Root: root, ReadOnly: []string{sp.Root()}, Unconfined: cfg.Unconfined, Scope: s.scope}
	x := &bash.Executor{Spill: sp, Env: sandbox.Environ(environ, cfg.ToolEnv), Grace: cfg.KillGrace, Sandbox: s.sandbox, Limits: s.sandbox.Limits()}
	s.tasks = bash.NewTasks(cfg.Now)
	shell := bash.New(x, s.tasks)
	shell.Resolve = s.effective
	tools := append(shell.Tools(), fstools.New(conf).Tools()...)
	tools = append(tools, search.New(conf, sp).Tools()...)
	tools = append(tools, todo.Tool())
	wcfg := workspace.Config{Root: root, Unconfined: cfg.Unconfined, DshHome: cfg.DshHome, AgentsHome: cfg.AgentsHome, CustomSkillDirs: cfg.SkillDirs}
	if s.workspace, err = workspace.New(wcfg); err != nil {
		return nil, fmt.Errorf("toolhost: %w", err)
	}
	tools = append(tools, s.workspace.Tool(s.skillBounds))
	s.host, err = toolsdk.NewHost(toolsdk.HostConfig{
		Logger:           logger,
		MaxArgumentBytes: cfg.MaxArgumentBytes,
		VetContext:       s.vetContext,
		// Asked per ListTools/WatchTools: the sandbox probe runs in the
		// background and the answer waits for it.
		SandboxSupportFunc:     s.support,
		WorkspaceContextWithin: s.workspaceContext,
		EndSession:             s.endSession,
	}, tools...)
	if err != nil {
		return nil, fmt.Errorf("toolhost: %w", err)
	}
	return s, nil
}

// endSession kills the session's background tasks (each a whole process
// tree: its PID namespace when confined, its process group otherwise).
func (s *Service) endSession(_ context.Context, sessionID string) (int, error) {
	n := s.tasks.EndSession(sessionID)
	if n > 0 {
		s.log.Info("session ended: background tasks stopped", "session", sessionID, "tasks", n)
	}
	return n, nil
}

// vetContext refuses a call whose workspace root lies outside the host's,
// lexically or once symlinks are resolved: a session may narrow its
// confinement, never widen it. The checked resolution is what the call
// carries (toolsdk.Call.Vetted) and what effective confines it to: one
// resolution per call, and the one checked is the one used. It also
// refuses a cwd outside that root (sessionCwd), a first layer: the skill
// tool reads its cwd's catalog confined to the same root (skillBounds).
func (s *Service) vetContext(tc *toolsv1.ToolContext) (any, error) {
	wr := tc.GetWorkspaceRoot()
	if wr == "" || s.unconfined {
		return nil, nil
	}
	return s.vetRoot(callFields, filepath.Clean(wr), filepath.Clean(tc.GetCwd()))
}

// fields names a request's session root and cwd in refusals.
type fields struct{ root, cwd string }

var (
	// callFields are an Execute's (vetContext, effective).
	callFields = fields{"execution.context.workspace_root", "execution.context.cwd"}
	// contextFields are a GetWorkspaceContextRequest's.
	contextFields = fields{"workspace_root", "cwd"}
)

// vetRoot is vetContext's check of a clean session root wr and cwd (f
// names them in a refusal): wr inside the host's root and cwd inside wr,
// lexically and resolved.
func (s *Service) vetRoot(f fields, wr, cwd string) (*vettedRoot, error) {
	if cwd != wr && filepath.IsAbs(cwd) && fileopen.Within(cwd, wr) && fileopen.Within(wr, s.root) && fileopen.NoLinks(cwd) {
		// No component of cwd is a link, so none of wr's, its ancestor:
		// both are their own resolution, cwd inside wr — one openat2
		// where sessionRoot and sessionCwd take one each.
		if err := s.realInside(f, wr, wr); err != nil {
			return nil, err
		}
		return &vettedRoot{root: wr, real: wr}, nil
	}
	real, err := s.sessionRoot(f, wr)
	if err != nil {
		return nil, err
	}
	if err := sessionCwd(f, cwd, wr, real); err != nil {
		return nil, err
	}
	return &vettedRoot{root: wr, real: real}, nil
}

// sessionCwd refuses a cwd outside the session's workspace root wr (real:
// its resolution), lexically or once resolved: a session of ws/a working
// in ws/b (or in a link of ws/a to it) would have the skill tool load
// ws/b's skills. The usual cwd, the root itself, costs nothing; another
// one resolution. A missing cwd (it or an ancestor does not exist) is left
// to the tools, which confine every path they resolve against it to the
// session's root on their own; any other failure to resolve it (a file
// on the way, a link loop, no permission) is refused.
func sessionCwd(f fields, cwd, wr, real string) error {
	if cwd == wr {
		return nil
	}
	if !fileopen.Within(cwd, wr) {
		return fmt.Errorf("%s %s is outside %s %s: %s", f.cwd, cwd, f.root, wr, cwdFix)
	}
	rc, err := fileopen.EvalSymlinks(cwd)
	switch {
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s %s cannot be resolved inside %s %s: %v; %s", f.cwd, cwd, f.root, wr, err, cwdFix)
	case err == nil && rc != real && !fileopen.Within(rc, real):
		return fmt.Errorf("%s %s resolves to %s, which is outside %s %s: %s", f.cwd, cwd, rc, f.root, wr, cwdFix)
	}
	return nil
}

// cwdFix is what the caller of a refused cwd can do about it.
const cwdFix = "a session's cwd must be a directory inside its workspace root and cannot be changed; create a new session with a cwd inside its workspace root"

// vettedRoot is a call's workspace root as vetContext resolved and checked
// it.
type vettedRoot struct{ root, real string }

// sessionRoot resolves a session's clean workspace root and refuses one
// outside the host's, lexically or once resolved. It runs once per call
// that sends a workspace_root (and once per GetWorkspaceContext that names
// one, contextBounds): vetContext's answer, checked, is the one
// effective confines the call to (a call run without it — Host.Run,
// another root — resolves afresh, and a call that sends none resolves the
// host's root in each effective). A
// root swapped for a link after that (by whoever can write its parent) is
// caught where the root is used: the file tools and the sandbox's rules
// open it with links refused (fileopen), failing closed.
func (s *Service) sessionRoot(f fields, wr string) (string, error) {
	if wr != s.root && !fileopen.Within(wr, s.root) {
		return "", fmt.Errorf("%s %s is outside this host's workspace %s", f.root, wr, s.root)
	}
	real, err := resolveRoot(wr)
	if err != nil {
		return "", fmt.Errorf("%s %s: %v", f.root, wr, err)
	}
	return real, s.realInside(f, wr, real)
}

// realInside refuses a session root wr whose resolution real lies outside
// the host's real root.
func (s *Service) realInside(f fields, wr, real string) error {
	if real != s.realRoot && !fileopen.Within(real, s.realRoot) {
		return fmt.Errorf("%s %s resolves to %s, outside this host's workspace %s", f.root, wr, real, s.realRoot)
	}
	return nil
}

// support is what the host declares: it enforces every policy it is sent
// when the sandbox works on this machine.
func (s *Service) support() toolsv1.SandboxSupport {
	if s.sandbox.Support().Unavailable != nil {
		return toolsv1.SandboxSupport_SANDBOX_SUPPORT_UNSPECIFIED
	}
	return toolsv1.SandboxSupport_SANDBOX_SUPPORT_ENFORCED
}

// effective resolves a call's confinement: its policy over the host's
// default, its real workspace root, its own spill directory. A call
// without a root of its own is confined to the host's workspace, resolved
// and checked afresh like a session's (the host's own directory can be
// swapped for a link too).
func (s *Service) effective(call *toolsdk.Call) (sandbox.Effective, error) {
	eff := sandbox.Effective{Policy: sandbox.FromProto(call.Sandbox, s.defPolicy), Root: s.realRoot, SpillDir: s.spill.SessionDir(call.SessionID)}
	wr := s.root
	if call.WorkspaceRoot != "" {
		wr = filepath.Clean(call.WorkspaceRoot)
	}
	var real string
	var err error
	switch {
	case !s.unconfined:
		if v, ok := call.Vetted.(*vettedRoot); ok && call.WorkspaceRoot != "" && v.root == wr {
			real = v.real
			break
		}
		real, err = s.sessionRoot(callFields, wr)
	case call.WorkspaceRoot != "":
		real, err = resolveRoot(wr)
	default:
		return eff, nil
	}
	if err != nil {
		return eff, toolsdk.NewError("SandboxError", "SANDBOX_UNAVAILABLE", err.Error(), err)
	}
	eff.Root = real
	return eff, nil
}

// resolveRoot is filepath.EvalSymlinks of a session's clean workspace root,
// asked afresh on every call (sessionRoot, once per call): a
// resolution remembered across calls would let a root or an ancestor
// swapped for a link later (by a session whose root is the parent, a
// danger-full-access session, any process of the user) reach the
// sandbox's rules, which open the root by path. A root with no link in it
// — the usual case — is confirmed in one openat2 (fileopen.NoLinksDir: then
// its resolution is itself, and a directory) instead of one Lstat per
// component; any link or error takes EvalSymlinks, with its answer and its
// error, and a root that is not a directory is refused.
func resolveRoot(root string) (string, error) {
	if fileopen.NoLinksDir(root) {
		return root, nil
	}
	real, err := filepath.EvalSymlinks(root)
	if err != nil {
		return "", err
	}
	// A root must be a directory: a file named as one got the file tools'
	// "outside the workspace" and the sandbox's Landlock error before.
	if fi, err := os.Stat(real); err != nil {
		return "", err
	} else if !fi.IsDir() {
		return "", fmt.Errorf("%s is not a directory", real)
	}
	return real, nil
}

// skillBounds is the skill tool's confinement: the call's real workspace
// root as effective resolves it for the file tools (vetted once per call;
// the host's own root when the call sends none). The cwd, its project root
// (the .git search stops there) and the project's skill roots must all lie
// inside it: vetContext's cwd check is the first layer, this the one at
// the point of use, which a cwd swapped for a link after the vetting
// cannot get past.
func (s *Service) skillBounds(call *toolsdk.Call) (workspace.Bounds, error) {
	eff, err := s.effective(call)
	if err != nil {
		return workspace.Bounds{}, err
	}
	wr := s.root
	if call.WorkspaceRoot != "" {
		wr = filepath.Clean(call.WorkspaceRoot)
	}
	return workspace.Bounds{Root: wr, Real: eff.Root}, nil
}

// scope is the file tools' view of a call's confinement.
func (s *Service) scope(call *toolsdk.Call) (fstools.Scope, error) {
	eff, err := s.effective(call)
	if err != nil {
		return fstools.Scope{}, err
	}
	return fstools.Scope{
		Mode: string(eff.Mode), Unconfined: !eff.Mode.Confined(), ReadOnly: eff.Mode == sandbox.ReadOnly,
		Root: eff.Root, Read: []string{eff.SpillDir},
	}, nil
}

// Sandbox reports what the machine offers (for banners and tests).
func (s *Service) Sandbox() sandbox.Support { return s.sandbox.Support() }

// workspaceContext answers GetWorkspaceContext, read within the session's
// root wr when the request names one (contextBounds), else the host's. A
// root outside the host's, or a cwd outside the root or the workspace, is
// INVALID_ARGUMENT.
func (s *Service) workspaceContext(_ context.Context, cwd, wr string) (*toolsv1.GetWorkspaceContextResponse, error) {
	b, err := s.contextBounds(cwd, wr)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	resp, err := s.workspace.Context(b, cwd)
	if errors.Is(err, workspace.ErrOutside) {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return resp, err
}

// contextBounds vets a GetWorkspaceContext's session root wr (clean, or
// empty: the host's root) and its cwd as vetContext vets a call's, and
// returns the bounds its context is read in: a session of ws/a on a host
// of ws reads no AGENTS.md or skill of ws/b (through a link in ws/a) or
// of ws (a .git above ws/a). The reader checks every file against them
// again where it opens it. An unconfined host resolves the root only, as
// effective does for its calls.
func (s *Service) contextBounds(cwd, wr string) (workspace.Bounds, error) {
	if wr == "" {
		return workspace.Bounds{}, nil
	}
	if s.unconfined {
		real, err := resolveRoot(wr)
		if err != nil {
			return workspace.Bounds{}, fmt.Errorf("%s %s: %v", contextFields.root, wr, err)
		}
		return workspace.Bounds{Root: wr, Real: real}, nil
	}
	v, err := s.vetRoot(contextFields, wr, cwd)
	if err != nil {
		return workspace.Bounds{}, err
	}
	return workspace.Bounds{Root: v.root, Real: v.real}, nil
}

// WorkspaceContext is the workspace context of cwd within the host's root,
// as GetWorkspaceContext answers it without a session root
// (errors.Is(err, workspace.ErrOutside) for a cwd outside).
func (s *Service) WorkspaceContext(cwd string) (*toolsv1.GetWorkspaceContextResponse, error) {
	return s.workspace.Context(workspace.Bounds{}, cwd)
}

// Register registers the ToolHost service on a gRPC server.
func (s *Service) Register(gs grpc.ServiceRegistrar) { s.host.Register(gs) }

// Host is the underlying SDK host (to add more tools at runtime).
func (s *Service) Host() *toolsdk.Host { return s.host }

// WorkspaceRoot is the confined root.
func (s *Service) WorkspaceRoot() string { return s.root }

// Close kills background tasks and removes a self-made spill directory.
func (s *Service) Close() error {
	s.tasks.Close()
	_ = s.sandbox.Close()
	if s.ownSpill {
		if err := os.RemoveAll(s.spill.Root()); err != nil {
			return fmt.Errorf("toolhost: remove spill dir: %w", err)
		}
	}
	return nil
}

// The sandbox vocabulary for binaries that embed the toolhost (cmd/dsh).
type (
	// SandboxMode is a file-effect confinement mode.
	SandboxMode = sandbox.Mode
	// Limits are the per-call resource limits.
	Limits = sandbox.Limits
)

// ParseSandboxMode parses read-only, workspace-write or danger-full-access.
func ParseSandboxMode(s string) (SandboxMode, error) { return sandbox.ParseMode(s) }

// SandboxVerdictDir is where a host keeps its sandbox probe's verdict:
// $XDG_RUNTIME_DIR/dsh (per user, per boot) when set, else fallback.
func SandboxVerdictDir(getenv func(string) string, fallback string) string {
	return sandbox.VerdictDir(getenv, fallback)
}

// ParseNetwork parses "on" or "off" and reports whether it is off.
func ParseNetwork(s string) (off bool, err error) { return sandbox.ParseNetwork(s) }

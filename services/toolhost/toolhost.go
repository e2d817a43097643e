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
package toolhost

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/dsh-dev/dsh/services/toolhost/internal/bash"
	"github.com/dsh-dev/dsh/services/toolhost/internal/fstools"
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
	// Unconfined lets file tools reach any path (still resolved against the
	// session's cwd). Off by default.
	Unconfined bool
	// SpillDir holds capped outputs; empty means a fresh private temporary
	// directory removed by Close.
	SpillDir string
	// MaxArgumentBytes bounds one call's argument text; zero means 1 MiB.
	MaxArgumentBytes int
	// KillGrace is the TERM→KILL grace of bash kills; zero means 3 s.
	KillGrace time.Duration
	// Environ is the environment bash starts from before scrubbing; nil
	// means os.Environ().
	Environ []string
	// Now stamps background tasks; nil means time.Now.
	Now func() time.Time
	// DshHome and AgentsHome, when set, add their skills/ folders as skill
	// roots (ranks 400 and 500); SkillDirs are extra roots (rank 300).
	DshHome, AgentsHome string
	SkillDirs           []string
}

// Service is the built-in toolhost.
type Service struct {
	host       *toolsdk.Host
	tasks      *bash.Tasks
	spill      *spill.Dir
	ownSpill   bool
	root       string
	log        *slog.Logger
	unconfined bool
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
	s := &Service{root: root, log: logger, unconfined: cfg.Unconfined}
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
	conf := &fstools.Confiner{Root: root, ReadOnly: []string{sp.Root()}, Unconfined: cfg.Unconfined}
	x := &bash.Executor{Spill: sp, Env: bash.ScrubEnv(environ), Grace: cfg.KillGrace}
	s.tasks = bash.NewTasks(cfg.Now)
	tools := append(bash.New(x, s.tasks).Tools(), fstools.New(conf).Tools()...)
	tools = append(tools, search.New(conf, sp).Tools()...)
	tools = append(tools, todo.Tool())
	wcfg := workspace.Config{Root: root, Unconfined: cfg.Unconfined, DshHome: cfg.DshHome, AgentsHome: cfg.AgentsHome, CustomSkillDirs: cfg.SkillDirs}
	if s.workspace, err = workspace.New(wcfg); err != nil {
		return nil, fmt.Errorf("toolhost: %w", err)
	}
	tools = append(tools, s.workspace.Tool())
	s.host, err = toolsdk.NewHost(toolsdk.HostConfig{
		Logger:           logger,
		MaxArgumentBytes: cfg.MaxArgumentBytes,
		CheckContext:     s.checkContext,
		WorkspaceContext: s.workspaceContext,
	}, tools...)
	if err != nil {
		return nil, fmt.Errorf("toolhost: %w", err)
	}
	return s, nil
}

// checkContext refuses a call whose workspace root lies outside the host's:
// a session may narrow its confinement, never widen it.
func (s *Service) checkContext(tc *toolsv1.ToolContext) error {
	wr := tc.GetWorkspaceRoot()
	if wr == "" || s.unconfined {
		return nil
	}
	wr = filepath.Clean(wr)
	if wr != s.root && !isWithin(wr, s.root) {
		return fmt.Errorf("execution.context.workspace_root %s is outside this host's workspace %s", wr, s.root)
	}
	return nil
}

func isWithin(p, root string) bool {
	rel, err := filepath.Rel(root, p)
	return err == nil && rel != ".." && !filepath.IsAbs(rel) && (len(rel) < 3 || rel[:3] != "../")
}

// workspaceContext answers GetWorkspaceContext; a cwd outside the
// workspace is INVALID_ARGUMENT.
func (s *Service) workspaceContext(_ context.Context, cwd string) (*toolsv1.GetWorkspaceContextResponse, error) {
	resp, err := s.workspace.Context(cwd)
	if errors.Is(err, workspace.ErrOutside) {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return resp, err
}

// WorkspaceContext is the workspace context of cwd, as GetWorkspaceContext
// answers it (errors.Is(err, workspace.ErrOutside) for a cwd outside).
func (s *Service) WorkspaceContext(cwd string) (*toolsv1.GetWorkspaceContextResponse, error) {
	return s.workspace.Context(cwd)
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
	if s.ownSpill {
		if err := os.RemoveAll(s.spill.Root()); err != nil {
			return fmt.Errorf("toolhost: remove spill dir: %w", err)
		}
	}
	return nil
}

package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/services/toolhost"
)

// startToolhost serves the built-in toolhost with workspace as its root;
// the returned func stops the server, then kills background tasks. Skills
// come from the project and from $DSH_HOME (default ~/.dsh) and
// ~/.agents.
func startToolhost(ctx context.Context, e *env, workspace, data string, lis net.Listener, logger *slog.Logger) (*toolhost.Service, func(), error) {
	home, _ := os.UserHomeDir()
	dshHome, agentsHome := envOr(e, "DSH_HOME", filepath.Join(home, ".dsh")), envOr(e, "DSH_AGENTS_HOME", filepath.Join(home, ".agents"))
	th, err := toolhost.New(toolhost.Config{WorkspaceRoot: workspace, SpillDir: filepath.Join(data, "spill"),
		DshHome: dshHome, AgentsHome: agentsHome,
		// The probe's verdict is kept per boot, beside the sessions unless
		// there is a runtime directory: the next start skips the probe.
		SandboxVerdictDir: toolhost.SandboxVerdictDir(e.getenv, data)}, logger)
	if err != nil {
		return nil, nil, err
	}
	srv := grpcserver.New(grpcserver.Config{Logger: logger, DrainTimeout: 2 * time.Second})
	th.Register(srv.Server)
	stop := serve(ctx, srv, lis, func() { _ = th.Close() })
	// End the agent's WatchTools stream first, so the drain does not wait on it.
	return th, func() { th.Host().StopWatches(); stop() }, nil
}

// sandboxLine is the banner's sandbox line and, when the machine cannot
// confine tools, the warning to show with it.
func sandboxLine(f devFlags, th *toolhost.Service) (line, warn string) {
	sp := th.Sandbox()
	line = fmt.Sprintf("%s, network %s", f.sandboxMode, f.sandboxNetwork)
	if sp.Unavailable != nil {
		if f.sandboxMode != "danger-full-access" {
			warn = fmt.Sprintf("tools cannot be confined on this machine (%v): every bash call will fail with SANDBOX_UNAVAILABLE; "+
				"run with --sandbox-mode danger-full-access to accept unconfined tools", sp.Unavailable)
		}
		return line + " (unavailable)", warn
	}
	return line + fmt.Sprintf(" (Landlock ABI %d, %s, pids cgroup %s)", sp.LandlockABI, sp.Containment(), orNone(sp.PidsCgroup)), ""
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// workspaceSummary is the start-up line about what the workspace gives the
// model: instruction files and skills found, and how many files were
// skipped or cut (each logged with its reason).
func workspaceSummary(th *toolhost.Service, cwd, logPath string, logger *slog.Logger) string {
	wc, err := th.WorkspaceContext(cwd)
	if err != nil {
		return fmt.Sprintf("workspace: no context (%v)", err)
	}
	line := fmt.Sprintf("workspace: %s, %s", plural(len(wc.GetInstructions()), "instruction file"), plural(len(wc.GetSkills()), "skill"))
	notices := append(wc.GetNotices(), wc.GetSkillErrors()...)
	for _, n := range notices {
		logger.Warn("workspace file skipped or cut", "path", n.GetPath(), "reason", n.GetMessage())
	}
	if len(notices) > 0 {
		line += fmt.Sprintf(" (%s skipped or cut; reasons in %s)", plural(len(notices), "file"), logPath)
	}
	return line
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"time"

	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/services/toolhost"
)

// startToolhost serves the built-in toolhost with workspace as its root;
// the returned func stops the server, then kills background tasks.
func startToolhost(ctx context.Context, workspace, data string, lis net.Listener, logger *slog.Logger) (*toolhost.Service, func(), error) {
	th, err := toolhost.New(toolhost.Config{WorkspaceRoot: workspace, SpillDir: filepath.Join(data, "spill")}, logger)
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

package main

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"time"

	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/services/toolhost"
)

// startToolhost serves the built-in toolhost with workspace as its root;
// the returned func stops the server, then kills background tasks.
func startToolhost(ctx context.Context, workspace, data string, lis net.Listener, logger *slog.Logger) (func(), error) {
	th, err := toolhost.New(toolhost.Config{WorkspaceRoot: workspace, SpillDir: filepath.Join(data, "spill")}, logger)
	if err != nil {
		return nil, err
	}
	srv := grpcserver.New(grpcserver.Config{Logger: logger, DrainTimeout: 2 * time.Second})
	th.Register(srv.Server)
	stop := serve(ctx, srv, lis, func() { _ = th.Close() })
	// End the agent's WatchTools stream first, so the drain does not wait on it.
	return func() { th.Host().StopWatches(); stop() }, nil
}

package toolsdk

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/dsh-dev/dsh/internal/grpcserver"
)

// Serve runs a host serving tools on addr (host:port) until ctx ends, with
// gRPC health, reflection and graceful shutdown. It logs to the default
// slog logger; use Host.Serve for more control.
func Serve(ctx context.Context, addr string, tools ...Tool) error {
	h, err := NewHost(HostConfig{Logger: slog.Default()}, tools...)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("toolhost listen: %w", err)
	}
	return h.Serve(ctx, lis)
}

// Serve serves the host on lis until ctx ends, then drains in-flight calls
// and stops. Health reports SERVING for dsh.tools.v1.ToolHost while it runs.
func (h *Host) Serve(ctx context.Context, lis net.Listener) error {
	srv := grpcserver.New(grpcserver.Config{Logger: h.log})
	h.Register(srv)
	stop := context.AfterFunc(ctx, h.StopWatches)
	defer stop()
	return srv.Serve(ctx, lis)
}

// ServiceName is the gRPC service name of the tool host, for health checks.
const ServiceName = "dsh.tools.v1.ToolHost"

package toolsdk

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"

	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/cmdline"
	"github.com/dsh-dev/dsh/internal/grpcserver"
)

// Serve runs a host serving tools on addr (host:port) until ctx ends, with
// gRPC health, reflection and graceful shutdown. It logs to the default
// slog logger; use Host.Serve for more control. The transport comes from the
// environment, like the dsh servers' flag twins: DSH_TLS_CERT, DSH_TLS_KEY,
// DSH_TLS_CLIENT_CA (mTLS), DSH_ALLOW_PEER (comma-separated identities) and
// DSH_INSECURE; a non-loopback addr without TLS is refused unless
// DSH_INSECURE is true (true, 1, yes or on). A variable whose value does
// not parse is an error naming it.
func Serve(ctx context.Context, addr string, tools ...Tool) error {
	var sf auth.ServerFlags
	fs := flag.NewFlagSet("toolsdk", flag.ContinueOnError)
	env := cmdline.NewEnv(os.Getenv)
	sf.RegisterFlags(fs, env)
	sf.RegisterPeerFlag(fs, env)
	if err := env.Err(); err != nil {
		return err
	}
	opts, err := sf.ServerOptions(auth.Options{Listen: addr, Logger: slog.Default()})
	if err != nil {
		return err
	}
	h, err := NewHost(HostConfig{Logger: slog.Default(), ServerOptions: opts}, tools...)
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
	srv := grpcserver.New(grpcserver.Config{Logger: h.log, Options: h.cfg.ServerOptions})
	h.Register(srv)
	stop := context.AfterFunc(ctx, h.StopWatches)
	defer stop()
	return srv.Serve(ctx, lis)
}

// ServiceName is the gRPC service name of the tool host, for health checks.
const ServiceName = "dsh.tools.v1.ToolHost"

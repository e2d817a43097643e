// Command mcpbridge serves the tools of MCP servers as a dsh toolhost.
//
//	mcpbridge --config mcp.json [--listen 127.0.0.1:7703]
//
// The config names the servers: {"servers": {"fs": {"command": "npx",
// "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]},
// "web": {"url": "http://127.0.0.1:8080/mcp", "headers": {"Authorization":
// "Bearer ..."}}}}; Claude Desktop / Cursor files ("mcpServers") and VS Code
// files ("servers" with "type") are read as they are. Tools are served as
// "<server>__<tool>", plus mcp_read_resource. Each server's health is the
// gRPC health service "dsh.mcpbridge/<server>". The bound address is printed
// on stdout as "dsh-toolhost listening on HOST:PORT".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/buildinfo"
	"github.com/dsh-dev/dsh/internal/cmdline"
	"github.com/dsh-dev/dsh/internal/telemetry"
	"github.com/dsh-dev/dsh/services/mcpbridge"
)

func main() {
	if buildinfo.Requested(os.Args[1:]) {
		fmt.Println(buildinfo.String("mcpbridge"))
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, log); errors.Is(err, flag.ErrHelp) {
		return
	} else if err != nil {
		log.Error("mcpbridge failed", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer, log *slog.Logger) error {
	env := cmdline.NewEnv(getenv)
	fs := flag.NewFlagSet("mcpbridge", flag.ContinueOnError)
	fs.Bool("version", false, buildinfo.FlagUsage)
	listen := fs.String("listen", env.String("DSH_LISTEN", "127.0.0.1:7703"), "HOST:PORT to serve dsh.tools.v1.ToolHost on (env DSH_LISTEN)")
	config := fs.String("config", env.String("DSH_MCP_CONFIG", ""), "JSON config file of MCP servers (env DSH_MCP_CONFIG)")
	callTimeout := fs.Duration("call-timeout", 0, "budget of one MCP tool call (0 = toolhost default, 2m)")
	initTimeout := fs.Duration("init-timeout", 0, "how long a server may take to start and answer initialize before it is logged, reported NOT_SERVING and retried (0 = 30s)")
	var srvFlags auth.ServerFlags
	srvFlags.RegisterFlags(fs, env)
	srvFlags.RegisterPeerFlag(fs, env)
	if err := cmdline.Parse(fs, args, env); err != nil {
		return err
	}
	srvOpts, err := srvFlags.ServerOptions(auth.Options{Listen: *listen, Logger: log})
	if err != nil {
		return err
	}
	if *config == "" {
		return fmt.Errorf("--config (or DSH_MCP_CONFIG) is required")
	}
	servers, err := mcpbridge.LoadConfig(*config)
	if err != nil {
		return err
	}
	// Telemetry before the server: it instruments RPCs fully only when a
	// recording provider is installed (grpcserver.TracingAuto).
	tel, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: "dsh-mcpbridge", Logger: log, Getenv: getenv})
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), telemetry.ShutdownTimeout)
		defer cancel()
		_ = tel.Shutdown(sctx)
	}()
	b, err := mcpbridge.New(mcpbridge.Config{Servers: servers, CallTimeout: *callTimeout, InitTimeout: *initTimeout, ServerOptions: srvOpts}, log)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "dsh-toolhost listening on %s\n", lis.Addr())
	return b.Serve(ctx, lis)
}

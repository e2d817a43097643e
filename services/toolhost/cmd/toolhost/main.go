// Command toolhost serves dsh's built-in tools (bash, read, write, edit, glob,
// grep, todo_write and the background-task tools) over gRPC, confined to a
// workspace directory; with --policy it also serves the bash command-policy
// ToolInterceptor on the same port.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/buildinfo"
	"github.com/dsh-dev/dsh/internal/cmdline"
	"github.com/dsh-dev/dsh/internal/telemetry"
	"github.com/dsh-dev/dsh/services/toolhost"
	"github.com/dsh-dev/dsh/services/toolhost/policy"
	"google.golang.org/grpc"
)

func main() {
	if buildinfo.Requested(os.Args[1:]) {
		fmt.Println(buildinfo.String("toolhost"))
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "toolhost:", err)
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func run() error {
	cwd, err := os.Getwd()
	if err != nil {
		return err
	}
	flag.Bool("version", false, buildinfo.FlagUsage)
	listen := flag.String("listen", env("DSH_LISTEN", "127.0.0.1:7702"), "host:port to serve on (env DSH_LISTEN)")
	workspace := flag.String("workspace", env("DSH_WORKSPACE", cwd), "directory file tools are confined to (env DSH_WORKSPACE)")
	policyFile := flag.String("policy", env("DSH_TOOLHOST_POLICY", ""), "bash command-policy file; also serves dsh.tools.v1.ToolInterceptor (env DSH_TOOLHOST_POLICY)")
	unconfined := flag.Bool("unconfined", false, "let file tools reach paths outside the workspace")
	maxArgs := flag.Int("max-argument-bytes", 1<<20, "largest accepted argument text of one call")
	var srvFlags auth.ServerFlags
	srvFlags.RegisterFlags(flag.CommandLine, os.Getenv)
	srvFlags.RegisterPeerFlag(flag.CommandLine, os.Getenv)
	flag.Parse()
	if err := cmdline.NoArgs(flag.CommandLine); err != nil {
		return err
	}

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	srvOpts, err := srvFlags.ServerOptions(auth.Options{Listen: *listen, Logger: log})
	if err != nil {
		return err
	}
	root, err := filepath.Abs(*workspace)
	if err != nil {
		return err
	}
	svc, err := toolhost.New(toolhost.Config{WorkspaceRoot: root, Unconfined: *unconfined, MaxArgumentBytes: *maxArgs, ServerOptions: srvOpts}, log)
	if err != nil {
		return err
	}
	defer svc.Close()
	var extra []func(grpc.ServiceRegistrar)
	if *policyFile != "" {
		p, err := policy.Load(*policyFile)
		if err != nil {
			return err
		}
		extra = append(extra, p.Interceptor().Register)
		log.Info("serving bash command policy", "file", *policyFile, "rules", len(p.Rules))
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Telemetry before the server: it instruments RPCs fully only when a
	// recording provider is installed (grpcserver.TracingAuto).
	tel, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: "dsh-toolhost", Logger: log})
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), telemetry.ShutdownTimeout)
		defer cancel()
		_ = tel.Shutdown(sctx)
	}()
	log.Info("toolhost starting", "workspace", root, "addr", lis.Addr().String())
	return svc.Serve(ctx, lis, extra...)
}

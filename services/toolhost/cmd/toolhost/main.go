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

	"github.com/dsh-dev/dsh/internal/telemetry"
	"github.com/dsh-dev/dsh/services/toolhost"
	"github.com/dsh-dev/dsh/services/toolhost/policy"
	"google.golang.org/grpc"
)

func main() {
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
	listen := flag.String("listen", env("DSH_LISTEN", "127.0.0.1:7702"), "host:port to serve on (env DSH_LISTEN)")
	workspace := flag.String("workspace", env("DSH_WORKSPACE", cwd), "directory file tools are confined to (env DSH_WORKSPACE)")
	policyFile := flag.String("policy", env("DSH_TOOLHOST_POLICY", ""), "bash command-policy file; also serves dsh.tools.v1.ToolInterceptor (env DSH_TOOLHOST_POLICY)")
	unconfined := flag.Bool("unconfined", false, "let file tools reach paths outside the workspace")
	maxArgs := flag.Int("max-argument-bytes", 1<<20, "largest accepted argument text of one call")
	home, _ := os.UserHomeDir()
	dshHome := flag.String("dsh-home", env("DSH_HOME", filepath.Join(home, ".dsh")), "dsh's home; its skills/ folder is a skill root (env DSH_HOME; empty: none)")
	agentsHome := flag.String("agents-home", env("DSH_AGENTS_HOME", filepath.Join(home, ".agents")), "the shared agents home; its skills/ folder is a skill root (env DSH_AGENTS_HOME; empty: none)")
	var skillDirs []string
	flag.Func("skill-dir", "an extra skill root (repeatable)", func(v string) error { skillDirs = append(skillDirs, v); return nil })
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	root, err := filepath.Abs(*workspace)
	if err != nil {
		return err
	}
	svc, err := toolhost.New(toolhost.Config{WorkspaceRoot: root, Unconfined: *unconfined, MaxArgumentBytes: *maxArgs,
		DshHome: *dshHome, AgentsHome: *agentsHome, SkillDirs: skillDirs}, log)
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

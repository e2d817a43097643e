// Command toolhost serves dsh's built-in tools (bash, read, write, edit, glob,
// grep, todo_write and the background-task tools) over gRPC, confined to a
// workspace directory; with --policy it also serves the bash command-policy
// ToolInterceptor on the same port.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/buildinfo"
	"github.com/dsh-dev/dsh/internal/cmdline"
	"github.com/dsh-dev/dsh/internal/debugserver"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/internal/telemetry"
	"github.com/dsh-dev/dsh/services/toolhost"
	"github.com/dsh-dev/dsh/services/toolhost/internal/sandbox"
	"github.com/dsh-dev/dsh/services/toolhost/policy"
	"google.golang.org/grpc"
)

func main() {
	if buildinfo.Requested(os.Args[1:]) {
		fmt.Println(buildinfo.String("toolhost"))
		return
	}
	if err := run(os.Args[1:], os.Getenv, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "toolhost:", err)
		os.Exit(1)
	}
}

// run serves until SIGINT or SIGTERM, with the command line args and
// defaults from getenv. A flag that does not parse, and --help, end the
// process as the flag package does (exit 2, exit 0; usage on stderr).
func run(args []string, getenv func(string) string, stderr io.Writer) error {
	env := cmdline.NewEnv(getenv)
	cwd, err := os.Getwd()
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("toolhost", flag.ExitOnError)
	fs.SetOutput(stderr)
	fs.Bool("version", false, buildinfo.FlagUsage)
	listen := fs.String("listen", env.String("DSH_LISTEN", "127.0.0.1:7702"), "host:port to serve on (env DSH_LISTEN)")
	workspace := fs.String("workspace", env.String("DSH_WORKSPACE", cwd), "directory file tools are confined to (env DSH_WORKSPACE)")
	policyFile := fs.String("policy", env.String("DSH_TOOLHOST_POLICY", ""), "bash command-policy file; also serves dsh.tools.v1.ToolInterceptor (env DSH_TOOLHOST_POLICY)")
	unconfined := fs.Bool("unconfined", false, "run calls that carry no sandbox policy as danger-full-access (an agent always sends one)")
	maxArgs := fs.Int("max-argument-bytes", 1<<20, "largest accepted argument text of one call")
	var srvFlags auth.ServerFlags
	srvFlags.RegisterFlags(fs, env)
	srvFlags.RegisterPeerFlag(fs, env)
	mode := fs.String("sandbox-mode", env.String("DSH_SANDBOX_MODE", "workspace-write"), "sandbox mode of calls that carry no policy: read-only, workspace-write or danger-full-access (env DSH_SANDBOX_MODE)")
	network := fs.String("sandbox-network", env.String("DSH_SANDBOX_NETWORK", "on"), "network of calls that carry no policy: on or off (env DSH_SANDBOX_NETWORK)")
	var toolEnv stringList
	fs.Var(&toolEnv, "tool-env", "host environment variable passed through to tool processes (repeatable; PATH, HOME, LANG, TERM, TMPDIR are managed)")
	var lim sandbox.Limits
	fs.Uint64Var(&lim.CPUSeconds, "limit-cpu", sandbox.DefaultCPUSeconds, "CPU seconds per tool process")
	fs.Uint64Var(&lim.MemoryBytes, "limit-memory", sandbox.DefaultMemoryBytes, "address space bytes per tool process")
	fs.Uint64Var(&lim.Processes, "limit-procs", sandbox.DefaultProcesses, "processes and threads per call")
	fs.Uint64Var(&lim.FileBytes, "limit-file-size", sandbox.DefaultFileBytes, "largest file a tool process may write, in bytes")
	home, _ := os.UserHomeDir()
	dshHome := fs.String("dsh-home", env.String("DSH_HOME", filepath.Join(home, ".dsh")), "dsh's home; its skills/ folder is a skill root (env DSH_HOME; empty: none)")
	agentsHome := fs.String("agents-home", env.String("DSH_AGENTS_HOME", filepath.Join(home, ".agents")), "the shared agents home; its skills/ folder is a skill root (env DSH_AGENTS_HOME; empty: none)")
	connAge := grpcserver.MaxConnectionAgeFlag(fs, env)
	var skillDirs stringList
	fs.Var(&skillDirs, "skill-dir", "an extra skill root (repeatable)")
	var dbg debugserver.Flags
	dbg.RegisterFlags(fs, env)
	if err := cmdline.Parse(fs, args, env); err != nil {
		return err
	}
	defMode, err := sandbox.ParseMode(*mode)
	if err != nil {
		return fmt.Errorf("--sandbox-mode: %w", err)
	}
	netOff, err := sandbox.ParseNetwork(*network)
	if err != nil {
		return fmt.Errorf("--sandbox-network: %w", err)
	}

	log := slog.New(slog.NewTextHandler(stderr, nil))
	srvOpts, err := srvFlags.ServerOptions(auth.Options{Listen: *listen, Logger: log})
	if err != nil {
		return err
	}
	srvOpts = append(srvOpts, grpcserver.ConnectionAge(*connAge)...)
	root, err := filepath.Abs(*workspace)
	if err != nil {
		return err
	}
	svc, err := toolhost.New(toolhost.Config{
		WorkspaceRoot: root, Unconfined: *unconfined, MaxArgumentBytes: *maxArgs, ServerOptions: srvOpts,
		DefaultMode: defMode, DefaultNetworkOff: netOff, Limits: lim, ToolEnv: toolEnv,
		DshHome: *dshHome, AgentsHome: *agentsHome, SkillDirs: skillDirs,
		// With a runtime directory, the sandbox probe's verdict is kept
		// there for this boot.
		SandboxVerdictDir: toolhost.SandboxVerdictDir(getenv, ""),
	}, log)
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
	dbgExp, err := dbg.Setup()
	if err != nil {
		return err
	}
	tel, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: "dsh-toolhost", Logger: log, Getenv: getenv, ExtraMetricReaders: dbgExp.Readers()})
	if err != nil {
		return err
	}
	if _, err := dbgExp.Serve(ctx, dbg.Addr, log); err != nil {
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

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

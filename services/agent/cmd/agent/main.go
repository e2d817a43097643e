// Command agent serves dsh.agent.v1.AgentService: sessions, the loop, the
// tool pipeline and hooks. Flags default from environment variables.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/buildinfo"
	"github.com/dsh-dev/dsh/internal/cmdline"
	"github.com/dsh-dev/dsh/internal/debugserver"
	"github.com/dsh-dev/dsh/internal/events"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/internal/persistence/sqlitestore"
	"github.com/dsh-dev/dsh/internal/telemetry"
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/agent/internal/loop"
)

type list []string

func (l *list) String() string     { return fmt.Sprint(*l) }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func main() {
	if buildinfo.Requested(os.Args[1:]) {
		fmt.Println(buildinfo.String("agent"))
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
}

func run() error {
	var toolhosts, hookFlags, icFlags, approverFlags, ruleFlags list
	flag.Bool("version", false, buildinfo.FlagUsage)
	listen := flag.String("listen", env("DSH_LISTEN", "127.0.0.1:7700"), "gRPC listen address (env DSH_LISTEN)")
	gw := flag.String("gateway", env("DSH_GATEWAY", "127.0.0.1:7701"), "LlmGateway address (env DSH_GATEWAY)")
	flag.Var(&toolhosts, "toolhost", "toolhost NAME=ADDR or ADDR, repeatable (env DSH_TOOLHOST; default 127.0.0.1:7702, the built-in toolhost).\n"+
		"Giving any --toolhost REPLACES the default: to add a host and keep bash, read, write... list the built-in one too,\n"+
		"e.g. --toolhost builtin=127.0.0.1:7702 --toolhost mine=127.0.0.1:7710. The tool set and its hosts are logged at start")
	flag.Var(&hookFlags, "hook", "remote AgentHooks NAME=ADDR[,timeout=DUR][,fail=open|closed], repeatable")
	flag.Var(&icFlags, "interceptor", "remote ToolInterceptor NAME=ADDR[,timeout=DUR][,fail=open|closed], repeatable")
	flag.Var(&approverFlags, "approver", "remote Approver NAME=ADDR[,timeout=DUR][,fail=open|closed], repeatable; consulted before a person is asked")
	approvalPolicy := flag.String("approval", env("DSH_APPROVAL", "on-request"), "default approval policy of sessions that set none: never, on-request or always (env DSH_APPROVAL)")
	flag.Var(&ruleFlags, "approval-rule", "deployment approval rule TOOL[(PATTERN)]=allow|ask|deny, repeatable, evaluated after each session's rules; replaces the defaults bash=ask, write=ask, edit=ask (\"*=allow\" asks for nothing)")
	approvalTimeout := flag.Duration("approval-timeout", envDuration("DSH_APPROVAL_TIMEOUT", 15*time.Minute), "settle an approval or question nobody answered as unavailable after this long; 0 waits forever (env DSH_APPROVAL_TIMEOUT)")
	store := flag.String("store", env("DSH_STORE", "sqlite"), "session store: sqlite, jsonl (both under --data) or postgres (env DSH_STORE)")
	pgDSN := flag.String("postgres-dsn", env("DSH_POSTGRES_DSN", ""), "PostgreSQL connection string of --store postgres, e.g. postgres://dsh@db:5432/dsh (env DSH_POSTGRES_DSN; prefer the env var: flags show in ps)")
	sqliteSync := flag.String("sqlite-sync", env("DSH_SQLITE_SYNC", "FULL"), "SQLite synchronous level: FULL (survives power loss) or NORMAL (survives a process crash; faster) (env DSH_SQLITE_SYNC)")
	commitDelay := flag.Duration("sqlite-commit-delay", envDuration("DSH_SQLITE_COMMIT_DELAY", 2*time.Millisecond), "with --store sqlite: while several sessions append fast (at least two more writes expected within it), hold each group open up to this long for the others' appends, so that they share one commit: less CPU per step, at most this much more latency per flush for those sessions; a lone session is not held; 0 commits at once, at most 100ms; give a unit, e.g. 2ms (env DSH_SQLITE_COMMIT_DELAY)")
	advertise := flag.String("advertise", env("DSH_ADVERTISE", ""), "with --store postgres: the address other replicas reach this one at, stored in its session leases (default: the bound --listen address) (env DSH_ADVERTISE)")
	leaseTTL := flag.Duration("lease-ttl", envDuration("DSH_LEASE_TTL", 10*time.Second), "with --store postgres: how long a session's lease outlives its last renewal (renewed every third of it); a dead replica's sessions move after this (env DSH_LEASE_TTL)")
	peerAuthority := flag.String("peer-authority", env("DSH_PEER_AUTHORITY", ""), "with --store postgres: the TLS server name (and :authority) to expect when forwarding to another replica's --advertise address, e.g. agent when replicas advertise their pod IP and present the agent's certificate (env DSH_PEER_AUTHORITY)")
	sweep := flag.Duration("sweep-interval", envDuration("DSH_SWEEP_INTERVAL", 10*time.Second), "with --store postgres: how often to adopt sessions whose lease expired in the middle of a turn (a dead replica's), closing the turn without waiting for a request; 0 disables (env DSH_SWEEP_INTERVAL)")
	healthListen := flag.String("health-listen", env("DSH_HEALTH_LISTEN", ""), "serve only the gRPC health service, in plaintext, at this address (for kubelet gRPC probes, which cannot do TLS); on --store postgres it is NOT_SERVING while the database or lease renewal fails (env DSH_HEALTH_LISTEN)")
	data := flag.String("data", env("DSH_DATA", "."), "data directory (env DSH_DATA)")
	idle := flag.Duration("idle-unload", envDuration("DSH_IDLE_UNLOAD", 10*time.Minute), "unload sessions idle this long; 0 never (env DSH_IDLE_UNLOAD)")
	parallel := flag.Int("max-parallel-tools", 10, "parallel-safe tool calls that may overlap")
	subDepth := flag.Int("max-subagent-depth", envInt("DSH_MAX_SUBAGENT_DEPTH", 3), "deepest subagent delegation (a top-level session is 0, its children 1); 0 forbids delegation (env DSH_MAX_SUBAGENT_DEPTH)")
	maxItems := flag.Int("max-queued", envInt("DSH_MAX_QUEUED", loop.DefaultMaxQueuedItems), "queued sends and steers one session holds; beyond it Send is RESOURCE_EXHAUSTED; -1 unbounded (env DSH_MAX_QUEUED)")
	maxBytes := flag.Int64("max-queued-bytes", int64(envInt("DSH_MAX_QUEUED_BYTES", loop.DefaultMaxQueuedBytes)), "bytes of queued content one session holds; -1 unbounded (env DSH_MAX_QUEUED_BYTES)")
	procItems := flag.Int("process-max-queued", envInt("DSH_PROCESS_MAX_QUEUED", 10000), "queued sends and steers of all sessions together; 0 unbounded (env DSH_PROCESS_MAX_QUEUED)")
	procBytes := flag.Int64("process-max-queued-bytes", int64(envInt("DSH_PROCESS_MAX_QUEUED_BYTES", 1<<30)), "bytes of queued content of all sessions together; 0 unbounded (env DSH_PROCESS_MAX_QUEUED_BYTES)")
	debug := flag.Bool("debug", env("DSH_DEBUG", "") != "", "check the log invariants and the request equation on every request (env DSH_DEBUG)")
	sbMode := flag.String("sandbox-mode", env("DSH_SANDBOX_MODE", "workspace-write"), "default sandbox of sessions: read-only, workspace-write or danger-full-access (env DSH_SANDBOX_MODE)")
	sbNet := flag.String("sandbox-network", env("DSH_SANDBOX_NETWORK", "on"), "default network of tool processes: on or off (env DSH_SANDBOX_NETWORK)")
	allowUnenforced := flag.Bool("allow-unenforced-hosts", false, "let confined sessions call tools on hosts that do not enforce sandbox policies")
	var nc events.Conn
	nc.RegisterFlags(flag.CommandLine, os.Getenv)
	var srvFlags auth.ServerFlags
	srvFlags.RegisterFlags(flag.CommandLine, os.Getenv)
	var authFlags auth.AuthFlags
	authFlags.RegisterFlags(flag.CommandLine, os.Getenv)
	var clientTLS auth.ClientTLS
	clientTLS.RegisterFlags(flag.CommandLine, os.Getenv)
	promptSections := flag.String("prompt-sections", env("DSH_PROMPT_SECTIONS", ""), "YAML/JSON file of system-prompt sections, variables, persona and tool order (env DSH_PROMPT_SECTIONS)")
	titleProvider := flag.String("title-provider", env("DSH_TITLE_PROVIDER", ""), "provider route of session-title calls; empty: the session's (env DSH_TITLE_PROVIDER)")
	titleModel := flag.String("title-model", env("DSH_TITLE_MODEL", ""), "small model of session-title calls; empty: the session's (env DSH_TITLE_MODEL)")
	noTitles := flag.Bool("no-titles", false, "do not title sessions with a model call")
	connAge := grpcserver.MaxConnectionAgeFlag(flag.CommandLine, os.Getenv)
	var natsLimits events.StreamLimits
	flag.DurationVar(&natsLimits.MaxAge, "nats-stream-max-age", envDuration("DSH_NATS_STREAM_MAX_AGE", 0), "drop events older than this from the JetStream stream; 0 keeps them (env DSH_NATS_STREAM_MAX_AGE)")
	flag.Int64Var(&natsLimits.MaxBytes, "nats-stream-max-bytes", int64(envInt("DSH_NATS_STREAM_MAX_BYTES", 0)), "keep the JetStream stream under this many bytes, dropping the oldest events (size it under NATS's volume); 0 unbounded (env DSH_NATS_STREAM_MAX_BYTES)")
	drain := flag.Duration("drain-timeout", envDuration("DSH_DRAIN_TIMEOUT", agent.DefaultDrainTimeout), "shutdown budget after SIGTERM: readiness goes NOT_SERVING and new turns are refused at once, running turns may finish until a fifth of it (at most 5 s) is left, then the rest is disposed; keep it 5 s under the pod's terminationGracePeriodSeconds (env DSH_DRAIN_TIMEOUT)")
	defaultCwd := flag.String("default-cwd", env("DSH_DEFAULT_CWD", ""), "cwd of sessions created without one, inside the toolhosts' workspace (in a cluster: the toolhost's workspace volume, e.g. /workspace); default: the agent's own working directory (env DSH_DEFAULT_CWD)")
	var dbg debugserver.Flags
	dbg.RegisterFlags(flag.CommandLine, os.Getenv)
	flag.Parse()
	if err := cmdline.NoArgs(flag.CommandLine); err != nil {
		return err
	}
	explicitHosts := len(toolhosts) > 0
	if !explicitHosts {
		toolhosts = list{env("DSH_TOOLHOST", "127.0.0.1:7702")}
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if explicitHosts {
		logger.Info("--toolhost given: these hosts replace the default built-in toolhost (127.0.0.1:7702) unless it is listed", "toolhosts", strings.Join(toolhosts, ","))
	}
	sandbox, err := agent.ParseSandbox(*sbMode, *sbNet)
	if err != nil {
		return err
	}
	cwd := *defaultCwd
	if cwd == "" {
		if cwd, err = os.Getwd(); err != nil {
			return err
		}
	} else if !filepath.IsAbs(cwd) {
		return fmt.Errorf("--default-cwd %q must be an absolute path", cwd)
	}
	srvOpts, err := srvFlags.ServerOptions(auth.Options{Listen: *listen, Unauthenticated: authFlags.Unauthenticated(), Logger: logger})
	if err != nil {
		return err
	}
	srvOpts = append(srvOpts, grpcserver.ConnectionAge(*connAge)...)
	creds, err := clientTLS.Credentials(logger)
	if err != nil {
		return err
	}
	var dialOpts []grpc.DialOption
	if creds != nil {
		dialOpts = append(dialOpts, grpcserver.WithCredentials(grpc.WithTransportCredentials(creds)))
	}
	if (*store == "" || *store == "sqlite") && (*commitDelay < 0 || *commitDelay > sqlitestore.MaxCommitDelay) {
		return fmt.Errorf("--sqlite-commit-delay %v: want 0 (commit at once) to %v, e.g. 2ms (a bare number in DSH_SQLITE_COMMIT_DELAY is seconds)", *commitDelay, sqlitestore.MaxCommitDelay)
	}
	appr, err := agent.ParseApprovalFlags(*approvalPolicy, ruleFlags, *approvalTimeout)
	if err != nil {
		return err
	}
	sc := agent.ServerConfig{
		ServerOptions: srvOpts, DialOptions: dialOpts,
		Listen: *listen, Gateway: *gw, Toolhosts: toolhosts, Store: *store, DataDir: *data, PostgresDSN: *pgDSN, Advertise: *advertise, LeaseTTL: *leaseTTL, HealthListen: *healthListen, SweepInterval: *sweep, PeerAuthority: *peerAuthority, Synchronous: *sqliteSync, CommitDelay: *commitDelay,
		Service: agent.Config{IdleUnload: *idle, MaxParallelToolCalls: *parallel, Debug: *debug, DefaultCwd: cwd, Approval: appr, Sandbox: sandbox,
			MaxQueuedItems: *maxItems, MaxQueuedBytes: *maxBytes, ProcessMaxQueuedItems: *procItems, ProcessMaxQueuedBytes: *procBytes,
			MaxSubagentDepth: subagentDepthFlag(*subDepth)},
		ShutdownTimeout: *drain, NATSLimits: natsLimits,
		NATS: nc, AllowUnenforcedHosts: *allowUnenforced, PromptSections: *promptSections, TitleProvider: *titleProvider, TitleModel: *titleModel, NoTitles: *noTitles,
	}
	for _, h := range hookFlags {
		r, err := agent.ParseRemote(h)
		if err != nil {
			return err
		}
		sc.Hooks = append(sc.Hooks, r)
	}
	for _, h := range approverFlags {
		r, err := agent.ParseRemote(h)
		if err != nil {
			return err
		}
		sc.Approvers = append(sc.Approvers, r)
	}
	for _, h := range icFlags {
		r, err := agent.ParseRemote(h)
		if err != nil {
			return err
		}
		sc.Interceptors = append(sc.Interceptors, r)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Telemetry first: the gRPC server and clients agent.Run builds instrument
	// themselves fully only when a recording provider is installed
	// (grpcserver.TracingAuto), i.e. when an OTLP endpoint is configured.
	dbgExp, err := dbg.Setup()
	if err != nil {
		return err
	}
	tel, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: "dsh-agent", Logger: logger, ExtraMetricReaders: dbgExp.Readers()})
	if err != nil {
		return err
	}
	if _, err := dbgExp.Serve(ctx, dbg.Addr, logger); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), telemetry.ShutdownTimeout)
		defer cancel()
		_ = tel.Shutdown(sctx)
	}()
	authn, closeAuth, err := authFlags.Authenticator(ctx, logger)
	if err != nil {
		return err
	}
	defer closeAuth()
	sc.Auth = authn
	return agent.Run(ctx, sc, logger)
}

func envInt(k string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(k)); err == nil {
		return n
	}
	return def
}

func envDuration(k string, def time.Duration) time.Duration {
	v := os.Getenv(k)
	if v == "" {
		return def
	}
	if d, err := time.ParseDuration(v); err == nil {
		return d
	}
	if n, err := strconv.Atoi(v); err == nil {
		return time.Duration(n) * time.Second
	}
	return def
}

// subagentDepthFlag maps --max-subagent-depth (0 forbids) to
// agent.Config.MaxSubagentDepth (0 is the default there, negative forbids).
func subagentDepthFlag(d int) int32 {
	if d <= 0 {
		return -1
	}
	return int32(min(d, 1000))
}

// Command agent serves dsh.agent.v1.AgentService: sessions, the loop, the
// tool pipeline and hooks. Flags default from environment variables.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
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

func main() {
	if buildinfo.Requested(os.Args[1:]) {
		fmt.Println(buildinfo.String("agent"))
		return
	}
	if err := run(os.Args[1:], os.Getenv, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
}

// options are the agent's command line: the server's configuration (all
// but what is built with a logger or a context: its server and dial
// options, its authenticator) and the flags those are built from.
type options struct {
	sc        agent.ServerConfig
	srvFlags  auth.ServerFlags
	authFlags auth.AuthFlags
	clientTLS auth.ClientTLS
	dbg       debugserver.Flags
	connAge   time.Duration
	// explicitHosts says --toolhost was given: its hosts replace the
	// default.
	explicitHosts bool
}

// parseFlags reads the command line args, with defaults from getenv, and
// checks its values. A flag that does not parse, and --help, end the
// process as the flag package does (exit 2, exit 0; usage on stderr).
func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (*options, error) {
	env := cmdline.NewEnv(getenv)
	o := &options{}
	fs := flag.NewFlagSet("agent", flag.ExitOnError)
	fs.SetOutput(stderr)
	var toolhosts, hookFlags, icFlags, approverFlags, ruleFlags list
	fs.Bool("version", false, buildinfo.FlagUsage)
	listen := fs.String("listen", env.String("DSH_LISTEN", "127.0.0.1:7700"), "gRPC listen address (env DSH_LISTEN)")
	gw := fs.String("gateway", env.String("DSH_GATEWAY", "127.0.0.1:7701"), "LlmGateway address (env DSH_GATEWAY)")
	fs.Var(&toolhosts, "toolhost", "toolhost NAME=ADDR or ADDR, repeatable (env DSH_TOOLHOST; default 127.0.0.1:7702, the built-in toolhost).\n"+
		"Giving any --toolhost REPLACES the default: to add a host and keep bash, read, write... list the built-in one too,\n"+
		"e.g. --toolhost builtin=127.0.0.1:7702 --toolhost mine=127.0.0.1:7710. The tool set and its hosts are logged at start")
	fs.Var(&hookFlags, "hook", "remote AgentHooks NAME=ADDR[,timeout=DUR][,fail=open|closed], repeatable")
	fs.Var(&icFlags, "interceptor", "remote ToolInterceptor NAME=ADDR[,timeout=DUR][,fail=open|closed], repeatable")
	fs.Var(&approverFlags, "approver", "remote Approver NAME=ADDR[,timeout=DUR][,fail=open|closed], repeatable; consulted before a person is asked")
	approvalPolicy := fs.String("approval", env.String("DSH_APPROVAL", "on-request"), "default approval policy of sessions that set none: never, on-request or always (env DSH_APPROVAL)")
	fs.Var(&ruleFlags, "approval-rule", "deployment approval rule TOOL[(PATTERN)]=allow|ask|deny, repeatable, evaluated after each session's rules; replaces the defaults bash=ask, write=ask, edit=ask (\"*=allow\" asks for nothing)")
	approvalTimeout := fs.Duration("approval-timeout", env.Duration("DSH_APPROVAL_TIMEOUT", 15*time.Minute), "settle an approval or question nobody answered as unavailable after this long; 0 waits forever (env DSH_APPROVAL_TIMEOUT)")
	store := fs.String("store", env.String("DSH_STORE", "sqlite"), "session store: sqlite, jsonl (both under --data) or postgres (env DSH_STORE)")
	pgDSN := fs.String("postgres-dsn", env.String("DSH_POSTGRES_DSN", ""), "PostgreSQL connection string of --store postgres, e.g. postgres://dsh@db:5432/dsh (env DSH_POSTGRES_DSN; prefer the env var: flags show in ps)")
	sqliteSync := fs.String("sqlite-sync", env.String("DSH_SQLITE_SYNC", "FULL"), "SQLite synchronous level: FULL (survives power loss) or NORMAL (survives a process crash; faster) (env DSH_SQLITE_SYNC)")
	commitDelay := fs.Duration("sqlite-commit-delay", env.Duration("DSH_SQLITE_COMMIT_DELAY", 2*time.Millisecond), "with --store sqlite: while several sessions append fast (at least two more writes expected within it), hold each group open up to this long for the others' appends, so that they share one commit: less CPU per step, at most this much more latency per flush for those sessions; a lone session is not held; 0 commits at once, at most 100ms; give a unit, e.g. 2ms (env DSH_SQLITE_COMMIT_DELAY)")
	advertise := fs.String("advertise", env.String("DSH_ADVERTISE", ""), "with --store postgres: the address other replicas reach this one at, stored in its session leases (default: the bound --listen address) (env DSH_ADVERTISE)")
	leaseTTL := fs.Duration("lease-ttl", env.Duration("DSH_LEASE_TTL", 10*time.Second), "with --store postgres: how long a session's lease outlives its last renewal (renewed every third of it); a dead replica's sessions move after this (env DSH_LEASE_TTL)")
	peerAuthority := fs.String("peer-authority", env.String("DSH_PEER_AUTHORITY", ""), "with --store postgres: the TLS server name (and :authority) to expect when forwarding to another replica's --advertise address, e.g. agent when replicas advertise their pod IP and present the agent's certificate (env DSH_PEER_AUTHORITY)")
	sweep := fs.Duration("sweep-interval", env.Duration("DSH_SWEEP_INTERVAL", 10*time.Second), "with --store postgres: how often to adopt sessions whose lease expired in the middle of a turn (a dead replica's), closing the turn without waiting for a request; 0 disables (env DSH_SWEEP_INTERVAL)")
	healthListen := fs.String("health-listen", env.String("DSH_HEALTH_LISTEN", ""), "serve only the gRPC health service, in plaintext, at this address (for kubelet gRPC probes, which cannot do TLS); on --store postgres it is NOT_SERVING while the database or lease renewal fails (env DSH_HEALTH_LISTEN)")
	data := fs.String("data", env.String("DSH_DATA", "."), "data directory (env DSH_DATA)")
	idle := fs.Duration("idle-unload", env.Duration("DSH_IDLE_UNLOAD", 10*time.Minute), "unload sessions idle this long; 0 never (env DSH_IDLE_UNLOAD)")
	parallel := fs.Int("max-parallel-tools", 10, "parallel-safe tool calls that may overlap")
	subDepth := fs.Int("max-subagent-depth", env.Int("DSH_MAX_SUBAGENT_DEPTH", 3), "deepest subagent delegation (a top-level session is 0, its children 1); 0 forbids delegation (env DSH_MAX_SUBAGENT_DEPTH)")
	maxItems := fs.Int("max-queued", env.Int("DSH_MAX_QUEUED", loop.DefaultMaxQueuedItems), "queued sends and steers one session holds; beyond it Send is RESOURCE_EXHAUSTED; -1 unbounded (env DSH_MAX_QUEUED)")
	maxBytes := fs.Int64("max-queued-bytes", env.Int64("DSH_MAX_QUEUED_BYTES", loop.DefaultMaxQueuedBytes), "bytes of queued content one session holds; -1 unbounded (env DSH_MAX_QUEUED_BYTES)")
	procItems := fs.Int("process-max-queued", env.Int("DSH_PROCESS_MAX_QUEUED", 10000), "queued sends and steers of all sessions together; 0 unbounded (env DSH_PROCESS_MAX_QUEUED)")
	procBytes := fs.Int64("process-max-queued-bytes", env.Int64("DSH_PROCESS_MAX_QUEUED_BYTES", 1<<30), "bytes of queued content of all sessions together; 0 unbounded (env DSH_PROCESS_MAX_QUEUED_BYTES)")
	debug := fs.Bool("debug", env.Bool("DSH_DEBUG", false), "check the log invariants and the request equation on every request (env DSH_DEBUG=true)")
	sbMode := fs.String("sandbox-mode", env.String("DSH_SANDBOX_MODE", "workspace-write"), "default sandbox of sessions: read-only, workspace-write or danger-full-access (env DSH_SANDBOX_MODE)")
	sbNet := fs.String("sandbox-network", env.String("DSH_SANDBOX_NETWORK", "on"), "default network of tool processes: on or off (env DSH_SANDBOX_NETWORK)")
	allowUnenforced := fs.Bool("allow-unenforced-hosts", false, "let confined sessions call tools on hosts that do not enforce sandbox policies")
	var nc events.Conn
	nc.RegisterFlags(fs, getenv)
	o.srvFlags.RegisterFlags(fs, env)
	o.authFlags.RegisterFlags(fs, env)
	o.clientTLS.RegisterFlags(fs, getenv)
	promptSections := fs.String("prompt-sections", env.String("DSH_PROMPT_SECTIONS", ""), "YAML/JSON file of system-prompt sections, variables, persona and tool order (env DSH_PROMPT_SECTIONS)")
	titleProvider := fs.String("title-provider", env.String("DSH_TITLE_PROVIDER", ""), "provider route of session-title calls; empty: the session's (env DSH_TITLE_PROVIDER)")
	titleModel := fs.String("title-model", env.String("DSH_TITLE_MODEL", ""), "small model of session-title calls; empty: the session's (env DSH_TITLE_MODEL)")
	noTitles := fs.Bool("no-titles", false, "do not title sessions with a model call")
	connAge := grpcserver.MaxConnectionAgeFlag(fs, env)
	var natsLimits events.StreamLimits
	fs.DurationVar(&natsLimits.MaxAge, "nats-stream-max-age", env.Duration("DSH_NATS_STREAM_MAX_AGE", 0), "drop events older than this from the JetStream stream; 0 keeps them (env DSH_NATS_STREAM_MAX_AGE)")
	fs.Int64Var(&natsLimits.MaxBytes, "nats-stream-max-bytes", env.Int64("DSH_NATS_STREAM_MAX_BYTES", 0), "keep the JetStream stream under this many bytes, dropping the oldest events (size it under NATS's volume); 0 unbounded (env DSH_NATS_STREAM_MAX_BYTES)")
	drain := fs.Duration("drain-timeout", env.Duration("DSH_DRAIN_TIMEOUT", agent.DefaultDrainTimeout), "shutdown budget after SIGTERM: readiness goes NOT_SERVING and new turns are refused at once, running turns may finish until a fifth of it (at most 5 s) is left, then the rest is disposed; keep it 5 s under the pod's terminationGracePeriodSeconds (env DSH_DRAIN_TIMEOUT)")
	defaultCwd := fs.String("default-cwd", env.String("DSH_DEFAULT_CWD", ""), "cwd of sessions created without one, inside the toolhosts' workspace (in a cluster: the toolhost's workspace volume, e.g. /workspace); default: the agent's own working directory (env DSH_DEFAULT_CWD)")
	o.dbg.RegisterFlags(fs, env)
	if err := cmdline.Parse(fs, args, env); err != nil {
		return nil, err
	}
	o.connAge, o.explicitHosts = *connAge, len(toolhosts) > 0
	if !o.explicitHosts {
		toolhosts = list{env.String("DSH_TOOLHOST", "127.0.0.1:7702")}
	}
	sandbox, err := agent.ParseSandbox(*sbMode, *sbNet)
	if err != nil {
		return nil, err
	}
	cwd := *defaultCwd
	if cwd == "" {
		if cwd, err = os.Getwd(); err != nil {
			return nil, err
		}
	} else if !filepath.IsAbs(cwd) {
		return nil, fmt.Errorf("--default-cwd %q must be an absolute path", cwd)
	}
	if (*store == "" || *store == "sqlite") && (*commitDelay < 0 || *commitDelay > sqlitestore.MaxCommitDelay) {
		return nil, fmt.Errorf("--sqlite-commit-delay %v: want 0 (commit at once) to %v, e.g. 2ms (a bare number in DSH_SQLITE_COMMIT_DELAY is seconds)", *commitDelay, sqlitestore.MaxCommitDelay)
	}
	appr, err := agent.ParseApprovalFlags(*approvalPolicy, ruleFlags, *approvalTimeout)
	if err != nil {
		return nil, err
	}
	o.sc = agent.ServerConfig{
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
			return nil, err
		}
		o.sc.Hooks = append(o.sc.Hooks, r)
	}
	for _, h := range approverFlags {
		r, err := agent.ParseRemote(h)
		if err != nil {
			return nil, err
		}
		o.sc.Approvers = append(o.sc.Approvers, r)
	}
	for _, h := range icFlags {
		r, err := agent.ParseRemote(h)
		if err != nil {
			return nil, err
		}
		o.sc.Interceptors = append(o.sc.Interceptors, r)
	}
	return o, nil
}

// run serves until SIGINT or SIGTERM.
func run(args []string, getenv func(string) string, stderr io.Writer) error {
	o, err := parseFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	if o.explicitHosts {
		logger.Info("--toolhost given: these hosts replace the default built-in toolhost (127.0.0.1:7702) unless it is listed", "toolhosts", strings.Join(o.sc.Toolhosts, ","))
	}
	srvOpts, err := o.srvFlags.ServerOptions(auth.Options{Listen: o.sc.Listen, Unauthenticated: o.authFlags.Unauthenticated(), Logger: logger})
	if err != nil {
		return err
	}
	o.sc.ServerOptions = append(srvOpts, grpcserver.ConnectionAge(o.connAge)...)
	creds, err := o.clientTLS.Credentials(logger)
	if err != nil {
		return err
	}
	if creds != nil {
		o.sc.DialOptions = append(o.sc.DialOptions, grpcserver.WithCredentials(grpc.WithTransportCredentials(creds)))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Telemetry first: the gRPC server and clients agent.Run builds instrument
	// themselves fully only when a recording provider is installed
	// (grpcserver.TracingAuto), i.e. when an OTLP endpoint is configured.
	dbgExp, err := o.dbg.Setup()
	if err != nil {
		return err
	}
	tel, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: "dsh-agent", Logger: logger, Getenv: getenv, ExtraMetricReaders: dbgExp.Readers()})
	if err != nil {
		return err
	}
	if _, err := dbgExp.Serve(ctx, o.dbg.Addr, logger); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), telemetry.ShutdownTimeout)
		defer cancel()
		_ = tel.Shutdown(sctx)
	}()
	authn, closeAuth, err := o.authFlags.Authenticator(ctx, logger)
	if err != nil {
		return err
	}
	defer closeAuth()
	o.sc.Auth = authn
	return agent.Run(ctx, o.sc, logger)
}

// subagentDepthFlag maps --max-subagent-depth (0 forbids) to
// agent.Config.MaxSubagentDepth (0 is the default there, negative forbids).
func subagentDepthFlag(d int) int32 {
	if d <= 0 {
		return -1
	}
	return int32(min(d, 1000))
}

package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/events"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/persistence/jsonlstore"
	"github.com/dsh-dev/dsh/internal/persistence/sqlitestore"
	"github.com/dsh-dev/dsh/services/agent/internal/agenttools"
	"github.com/dsh-dev/dsh/services/agent/internal/approval"
	"github.com/dsh-dev/dsh/services/agent/internal/cluster"
	"github.com/dsh-dev/dsh/services/agent/internal/gateway"
	"github.com/dsh-dev/dsh/services/agent/internal/hooks"
	"github.com/dsh-dev/dsh/services/agent/internal/prompt"
	"github.com/dsh-dev/dsh/services/agent/internal/subagent"
	"github.com/dsh-dev/dsh/services/agent/internal/title"
	"github.com/dsh-dev/dsh/services/agent/internal/toolpipe"
)

// Remote is a remote hook or interceptor endpoint: NAME=ADDR with a deadline
// and a fail-open or fail-closed setting.
type Remote struct {
	Name, Addr string
	Timeout    time.Duration
	FailOpen   bool
}

// ParseRemote parses "NAME=ADDR[,timeout=DUR][,fail=open|closed]" (the
// default is a 5 s deadline, fail-closed). A bare ADDR is named after itself.
func ParseRemote(s string) (Remote, error) {
	parts := strings.Split(s, ",")
	r := Remote{Timeout: 5 * time.Second}
	name, addr, ok := strings.Cut(parts[0], "=")
	if !ok {
		name, addr = parts[0], parts[0]
	}
	if addr == "" {
		return r, fmt.Errorf("remote %q: missing address", s)
	}
	r.Name, r.Addr = name, addr
	for _, p := range parts[1:] {
		k, v, _ := strings.Cut(p, "=")
		switch k {
		case "timeout":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return r, fmt.Errorf("remote %q: bad timeout %q", s, v)
			}
			r.Timeout = d
		case "fail":
			switch v {
			case "open":
				r.FailOpen = true
			case "closed":
				r.FailOpen = false
			default:
				return r, fmt.Errorf("remote %q: fail must be open or closed", s)
			}
		default:
			return r, fmt.Errorf("remote %q: unknown option %q", s, k)
		}
	}
	return r, nil
}

// ServerConfig configures Run: the whole agent process.
type ServerConfig struct {
	// Listen is the gRPC address; ignored when Listener is set.
	Listen   string
	Listener net.Listener
	// Gateway is the LlmGateway address.
	Gateway string
	// ConnectGatewayAtStart picks a gateway replica (a health check)
	// while the agent starts, so the first session does not pay the
	// connection. Only for a gateway known to be listening already (dsh
	// dev binds it first): a replica that is down when the check runs
	// leaves ring_hash in its reconnect backoff, and calls fail
	// UNAVAILABLE until the next attempt even after it came back, where
	// an idle channel would have connected on the first call.
	ConnectGatewayAtStart bool
	// Toolhosts are NAME=ADDR or ADDR entries.
	Toolhosts []string
	// OnToolhost, when set, is told each toolhost's first state and every
	// change (err says why it is down); the agent also logs them and
	// reports them on the health service (HealthToolhost).
	OnToolhost func(name string, up bool, err error)
	// HealthInterval is how often the store is probed for the health
	// service; default 5 s.
	HealthInterval time.Duration
	// Hooks are remote AgentHooks services; Interceptors remote
	// ToolInterceptors; Approvers remote Approver services (consulted in
	// order before a person is asked).
	Hooks, Interceptors, Approvers []Remote
	// Store is "sqlite" (default), "jsonl" (both in DataDir) or "postgres"
	// (the database at PostgresDSN).
	Store, DataDir string
	// PostgresDSN is the connection string of the "postgres" store. On it
	// the agent is one replica of many: it owns a session through a lease
	// (see internal/cluster) advertising Advertise (default Listen) for
	// LeaseTTL (default 10 s).
	PostgresDSN, Advertise string
	LeaseTTL               time.Duration
	// HealthListen, when set, serves only the gRPC health service in
	// plaintext there (kubelet's gRPC probes cannot do TLS). On the
	// postgres store the health is NOT_SERVING while the database does not
	// answer or lease renewal fails, checked every HealthPeriod (default
	// 2 s).
	HealthListen string
	HealthPeriod time.Duration
	// PeerAuthority, when set, is the :authority and TLS server name used
	// when forwarding to another replica's advertised address (a pod IP
	// has no name on the certificate; every replica presents the agent's
	// certificate, e.g. with DNS name "agent"). Default: the address's host.
	PeerAuthority string
	// SweepInterval, when positive, has a replica adopt sessions whose
	// lease expired mid-turn this often (see replica.sweep); 0 disables.
	SweepInterval time.Duration
	// Synchronous is the SQLite synchronous level ("FULL" or "NORMAL").
	Synchronous string
	// CommitDelay is the SQLite store's commit delay
	// (sqlitestore.Config.CommitDelay); 0 commits every group at once.
	CommitDelay time.Duration
	Service     Config
	// Retry overrides the default retry policy when non-nil.
	Retry *hooks.RetryPolicy
	// NATS, when its URL is set, fans every durable event out to JetStream
	// (subject dsh.events.<tenant>.<session>) through internal/events; the stored
	// published cursor lets a restart catch up.
	NATS events.Conn
	// NATSLimits bound the JetStream stream (max age, max bytes; the oldest
	// messages are discarded), sized to NATS's volume.
	NATSLimits events.StreamLimits
	// NATSOptions are extra NATS client options of the publisher (dsh dev
	// dials its embedded server through them).
	NATSOptions []nats.Option
	// PublishOnClose, when positive, bounds how long shutdown keeps
	// publishing; what is left stays behind the durable cursor for the next
	// start (dsh dev -p exits without waiting for NATS). Zero: up to
	// ShutdownTimeout.
	PublishOnClose time.Duration
	// ServerOptions are extra gRPC server options: the transport credentials
	// of auth.ServerFlags.ServerOptions (TLS, mTLS).
	ServerOptions []grpc.ServerOption
	// Auth authenticates clients; nil means auth.None (every caller is the
	// local principal: tenant "default", every role). Authz authorizes
	// them; nil means auth.Roles. Both run on every RPC but health.
	Auth  auth.Authenticator
	Authz auth.Authorizer
	// DialOptions are added to every connection the agent opens (gateway,
	// toolhosts, hooks, interceptors): the client TLS credentials.
	DialOptions []grpc.DialOption
	// ShutdownTimeout is the drain budget (--drain-timeout): from the
	// shutdown signal, new turns are refused and readiness is NOT_SERVING at
	// once; running and queued turns may finish until DrainReserve(budget)
	// before its end, the rest of it disposes and flushes. Default
	// DefaultDrainTimeout.
	ShutdownTimeout time.Duration
	// Ready, when set, receives the bound address once its start is over
	// (after health is released: the agent as a whole reports its store's
	// health).
	Ready func(addr string)
	// Accepting, when set, receives the bound address as soon as the
	// server accepts calls, before Ready (not on the postgres store, where
	// it is called with Ready): calls made then wait until the agent has
	// started, and fail UNAVAILABLE with the reason if its start fails.
	Accepting func(addr string)
	// AllowUnenforcedHosts lets confined sessions call tools on hosts that
	// declare they do not enforce sandbox policies.
	AllowUnenforcedHosts bool
	// PromptSections is a YAML or JSON file of system-prompt configuration
	// (sections, variables, persona, tool order); empty for the defaults.
	PromptSections string
	// TitleProvider and TitleModel route session-title calls (a small
	// model); empty means each session's own route. NoTitles turns titles
	// off.
	TitleProvider, TitleModel string
	NoTitles                  bool
}

// defaultToolGuidance is the tool guidance section when the deployment
// sets none.
const defaultToolGuidance = "Use the tools when they help; call independent read-only tools together."

// buildPrompt reads the deployment's prompt configuration.
func buildPrompt(sc ServerConfig) (*prompt.Assembler, error) {
	var cfg prompt.Config
	if sc.PromptSections != "" {
		var err error
		if cfg, err = prompt.LoadConfig(sc.PromptSections); err != nil {
			return nil, err
		}
	}
	if cfg.ToolGuidance == "" {
		cfg.ToolGuidance = defaultToolGuidance
	}
	return prompt.New(cfg)
}

// Run wires the agent process (store, gateway client, toolhost registry,
// hooks, service, gRPC server) and serves until ctx ends, then shuts down:
// the service closes first (turns finish or are disposed, sessions flush,
// streams end), then the gRPC server drains.
func Run(ctx context.Context, sc ServerConfig, logger *slog.Logger) (runErr error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	// started is set once the start reaches serving: from there the
	// health server owns the health listener and the shutdown closes the
	// publisher; a start that fails before closes both itself.
	started := false
	// The health listener is bound first: a busy port fails the start
	// before the server accepts a call (calls held at the start gate run
	// as soon as it opens).
	var hlis net.Listener
	if sc.HealthListen != "" {
		l, err := net.Listen("tcp", sc.HealthListen)
		if err != nil {
			return fmt.Errorf("health listen %s: %w", sc.HealthListen, err)
		}
		hlis = l
		defer func() {
			if !started {
				l.Close()
			}
		}()
	}
	// The store opens while the gateway and toolhosts are dialled and
	// listed: a process's first SQLite open (the library's set-up, a fresh
	// database's schema) costs as much as the whole rest of the start.
	var (
		store persistence.Store
		rep   *replica // nil unless on the shared postgres store
		err   error
	)
	// One health monitor: the store's Ping, or for a replica the database
	// and its lease renewal (NOT_SERVING while either fails). Its first
	// probe runs as soon as the store is open, beside the listing and the
	// service's construction: the probe opens the store's first reader
	// connection, ~1 ms that was on the path to serving
	// (docs/arch/throughput.md §28, §33).
	health := newDepHealth(nil, logger)
	opening := &openedStore{opened: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(opening.done)
		opening.open(ctx, sc, logger)
		close(opening.opened)
		if opening.err == nil {
			var probe any = opening.store
			if opening.rep != nil {
				probe = pingFunc(opening.rep.healthy)
			}
			health.setProbe(probe)
			health.probeStore(ctx)
			opening.probed = time.Now()
		}
	}()
	defer func() {
		<-opening.done
		if opening.err == nil {
			opening.store.Close()
		}
	}()

	// Outside the postgres store (whose forwarding to other replicas is
	// set up with the lease manager its open makes) the server accepts
	// calls at once: they wait at the gate until the service is built, so
	// the clients' connection handshakes and first requests overlap the
	// store's open and the toolhosts' listing (docs/arch/throughput.md
	// §33). Until then the agent as a whole reports NOT_SERVING and Ready
	// is not called; a start that fails answers the waiting calls
	// UNAVAILABLE with its error before the server stops.
	var (
		as   *agentServer
		gate *startGate
	)
	if sc.Store != "postgres" {
		gate = newStartGate()
		health.hold()
		if as, err = startServer(ctx, sc, nil, health, logger, gate.register); err != nil {
			return err
		}
		defer func() {
			if gate.svc == nil {
				gate.fail(runErr)
				as.stop()
				<-as.errc
				as.close()
			}
		}()
		if sc.Accepting != nil {
			sc.Accepting(as.lis.Addr().String())
		}
	}

	// Session-affine: a session's model calls all reach the gateway
	// replica that remembers its conversation (every other connection
	// stays round_robin).
	gwConn, err := grpcserver.Dial(sc.Gateway, append(slices.Clone(sc.DialOptions), grpcserver.SessionAffinity(gateway.SessionHeader))...)
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	defer gwConn.Close()
	// Connect now: a session's creation asks the gateway for its providers.
	// This starts the name's resolution at once; ring_hash (SessionAffinity)
	// dials a replica only when a call picks it, so with
	// ConnectGatewayAtStart a health check picks one now, while the store
	// opens: the first session's ListProviders
	// paid that connection (and the gateway's new transport) on the way to
	// its first model request (docs/arch/throughput.md §17). Its answer is
	// not used; it ends with Run.
	gwConn.Connect()
	if sc.ConnectGatewayAtStart {
		warmCtx, endWarm := context.WithCancel(ctx)
		warmed := make(chan struct{})
		go func() {
			defer close(warmed)
			_, _ = healthpb.NewHealthClient(gwConn).Check(warmCtx, &healthpb.HealthCheckRequest{})
		}()
		defer func() { endWarm(); <-warmed }() // before gwConn.Close
	}
	gw := gateway.New(gwConn)

	pr, err := buildPrompt(sc)
	if err != nil {
		return err
	}
	// The agent-side tools are one more host of the same registry.
	var svc *Service
	// The delegation tools reach the service once it exists: calls may
	// arrive before, but they wait at the start gate and first see svc
	// after gate.open (on the postgres store the server starts after).
	sub := subagent.NewHost(nil, subagentDepth(sc.Service.MaxSubagentDepth))
	hosts := []toolpipe.Host{{Name: agenttools.HostName, Local: &agenttools.Host{Askers: func(id string) agenttools.Asker {
		if svc == nil {
			return nil
		}
		return svc.askerOf(id)
	}, Delegation: sub}}}
	seen := map[string]bool{agenttools.HostName: true}
	var wsHosts []prompt.Host
	for _, th := range sc.Toolhosts {
		name, addr, ok := strings.Cut(th, "=")
		if !ok {
			name, addr = th, th
		}
		if seen[name] {
			return fmt.Errorf("toolhost name %q is configured twice", name)
		}
		seen[name] = true
		conn, err := grpcserver.Dial(addr, sc.DialOptions...)
		if err != nil {
			return fmt.Errorf("toolhost %s: %w", name, err)
		}
		defer conn.Close()
		hosts = append(hosts, toolpipe.Host{Name: name, Client: toolsv1.NewToolHostClient(conn)})
		wsHosts = append(wsHosts, prompt.Host{Name: name, Client: hosts[len(hosts)-1].Client})
	}
	var ics []toolpipe.Interceptor
	for _, r := range sc.Interceptors {
		conn, err := grpcserver.Dial(r.Addr, sc.DialOptions...)
		if err != nil {
			return fmt.Errorf("interceptor %s: %w", r.Name, err)
		}
		defer conn.Close()
		ics = append(ics, toolpipe.Interceptor{Name: r.Name, Client: toolsv1.NewToolInterceptorClient(conn), Timeout: r.Timeout, FailOpen: r.FailOpen})
	}
	var approvers []approval.Remote
	for _, r := range sc.Approvers {
		conn, err := grpcserver.Dial(r.Addr, sc.DialOptions...)
		if err != nil {
			return fmt.Errorf("approver %s: %w", r.Name, err)
		}
		defer conn.Close()
		approvers = append(approvers, approval.Remote{Name: r.Name, Client: agentv1.NewApproverClient(conn), Timeout: r.Timeout, FailOpen: r.FailOpen})
	}
	pipe := toolpipe.New(toolpipe.Config{Hosts: hosts, Interceptors: ics, Logger: logger, AllowUnenforced: sc.AllowUnenforcedHosts, OnHostState: func(name string, up bool, err error) {
		health.set(HealthToolhost(name), up)
		if sc.OnToolhost != nil {
			sc.OnToolhost(name, up, err)
		}
	}, Gates: func(id string) toolpipe.Gate {
		if svc == nil {
			return nil
		}
		return svc.gateOf(id)
	}, Progress: func(ex *toolsv1.ToolExecution, out *toolsv1.ToolOutput) {
		if svc != nil {
			svc.publishProgress(ex, out)
		}
	}})
	// Closed on every return from here (a start that fails after the
	// listing began its watchers must stop them before the connections
	// close; Close without a Start is a no-op).
	defer pipe.Close()
	// A store that fails to open ends the toolhosts' listing: its error is
	// the one to report.
	startCtx, endStart := context.WithCancel(ctx)
	go func() {
		select {
		case <-opening.opened:
			if opening.err != nil {
				endStart()
			}
		case <-startCtx.Done():
		}
	}()
	err = pipe.Start(startCtx)
	endStart()
	<-opening.opened
	if opening.err != nil {
		return opening.err
	}
	store, rep = opening.store, opening.rep
	if err != nil {
		return fmt.Errorf("toolhosts: %w", err)
	}
	// probed waits for the store's first probe; what the agent reports
	// when it starts serving is never older than a second (a slow
	// toolhost's listing may have outlasted it).
	probed := func() {
		<-opening.done
		if time.Since(opening.probed) > time.Second {
			health.probeStore(ctx)
		}
	}
	interval := cmp.Or(sc.HealthInterval, defaultHealthInterval)
	if rep != nil {
		interval = cmp.Or(sc.HealthPeriod, DefaultHealthPeriod)
	}

	hk := &hooks.Set{}
	retry := hooks.DefaultRetryPolicy()
	if sc.Retry != nil {
		retry = *sc.Retry
	}
	hk.RequestError.Use(retry.Link())
	for _, r := range sc.Hooks {
		conn, err := grpcserver.Dial(r.Addr, sc.DialOptions...)
		if err != nil {
			return fmt.Errorf("hook %s: %w", r.Name, err)
		}
		defer conn.Close()
		(&hooks.Remote{Name: r.Name, Client: agentv1.NewAgentHooksClient(conn), Timeout: r.Timeout, FailOpen: r.FailOpen, Logger: logger}).Install(hk)
	}

	var (
		pub      *events.Publisher
		caughtUp chan struct{} // closed when the catch-up's listing is handed over
	)
	if sc.NATS.URL != "" && sc.Service.Sink == nil {
		if sc.NATS.Name == "" {
			sc.NATS.Name = "dsh-agent"
		}
		pub, err = events.New(ctx, events.Config{Conn: sc.NATS, Store: store, Logger: logger, Limits: sc.NATSLimits, ExtraOptions: sc.NATSOptions})
		if err != nil {
			return fmt.Errorf("nats: %w", err)
		}
		// A start that fails from here closes the publisher (its NATS
		// connection and goroutines, which the catch-up feeds) after the
		// catch-up ended; what it leaves unpublished stays behind the
		// durable cursor for the next start. Once serving, the shutdown
		// closes it after the service.
		defer func() {
			if !started {
				pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), failedStartPublish)
				defer cancel()
				if err := pub.Close(pctx); err != nil {
					logger.Warn("nats: closing the publisher of a failed start", "err", err)
				}
			}
		}()
		sc.Service.Sink = pub
		if rep != nil {
			rep.pub.Store(pub) // a replica catches a session up when it claims it
		} else {
			// The sessions a previous run left unpublished, beside the
			// rest of the start (after the first probe, whose reader
			// connection the listing then reuses): a catch-up only
			// publishes the stored events past each session's durable
			// cursor, so a session of this run it also finds is
			// published once all the same.
			caughtUp = make(chan struct{})
			go func() {
				defer close(caughtUp)
				<-opening.done
				if hs, err := store.List(ctx); err == nil {
					pub.CatchUp(hs...)
				}
			}()
			defer func() { <-caughtUp }() // a start that fails: not after Run
		}
	}

	if rep != nil && sc.Service.HandedOff == nil {
		sc.Service.HandedOff = func(ctx context.Context, id string) {
			if err := rep.mgr.Release(context.WithoutCancel(ctx), id); err != nil {
				logger.Warn("drain: releasing an idle session's lease failed; it is claimable when the lease expires", "session", id, "err", err)
				return
			}
			logger.Info("drain: handed an idle session off (lease released)", "session", id)
		}
	}
	titles := title.New(gw, title.Config{Provider: sc.TitleProvider, Model: sc.TitleModel, Disabled: sc.NoTitles}, logger)
	defer titles.Close()
	svc, err = New(sc.Service, Deps{Store: store, LLM: gw, Providers: gw, Tools: toolsOf(pipe), Hooks: hk, Approvers: approvers,
		Prompt: pr, Workspace: &prompt.Workspaces{Hosts: wsHosts, Logger: logger}, Titles: titles}, logger)
	if err != nil {
		return err
	}
	if rep != nil {
		rep.svc.Store(svc)
	}
	svc.sub, sub.Sessions = sub, delegation{svc}
	if as == nil {
		probed() // the replica serves only once its health is known
		if as, err = startServer(ctx, sc, rep, health, logger, svc.Register); err != nil {
			return err
		}
	} else {
		gate.open(svc)
		probed()
		health.release()
	}
	defer as.close()
	srv, lis, errc, srvCtx, stopSrv := as.srv, as.lis, as.errc, as.ctx, as.stop
	var probes sync.WaitGroup
	defer probes.Wait() // after stopSrv (deferred below) ended them
	defer stopSrv()
	probes.Go(func() { health.run(srvCtx, interval) })
	started = true // ServeHealth closes hlis; the shutdown below closes pub
	if hlis != nil {
		go func() {
			if err := srv.ServeHealth(srvCtx, hlis); err != nil {
				logger.Error("health server", "err", err)
			}
		}()
	}
	if rep != nil {
		if sc.SweepInterval > 0 {
			go rep.sweep(srvCtx, sc.SweepInterval)
		}
	}
	if gate == nil && sc.Accepting != nil {
		sc.Accepting(lis.Addr().String())
	}
	if sc.Ready != nil {
		sc.Ready(lis.Addr().String())
	}
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	timeout := sc.ShutdownTimeout
	if timeout <= 0 {
		timeout = DefaultDrainTimeout
	}
	svc.refuseNew() // before readiness flips: whoever sees NOT_SERVING is refused
	health.hold()   // draining: for good
	logger.Info("draining: new turns are refused, readiness is NOT_SERVING; running turns may finish", "budget", timeout, "turns_until", timeout-DrainReserve(timeout))
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	closeErr := svc.Close(cctx)
	if rep != nil {
		// After the turns ended: hand the sessions over at once.
		closeErr = errors.Join(closeErr, rep.mgr.Close(cctx))
	}
	if pub != nil {
		if caughtUp != nil {
			<-caughtUp
		}
		pctx := cctx
		if sc.PublishOnClose > 0 {
			var pcancel context.CancelFunc
			pctx, pcancel = context.WithTimeout(cctx, sc.PublishOnClose)
			defer pcancel()
		}
		closeErr = errors.Join(closeErr, pub.Close(pctx))
	}
	stopSrv()
	if serveErr == nil {
		serveErr = <-errc
	}
	return errors.Join(serveErr, closeErr)
}

// failedStartPublish bounds how long a start that fails after the NATS
// publisher was made keeps publishing before closing it.
const failedStartPublish = time.Second

// agentServer is the agent's gRPC server, serving on lis until stop.
type agentServer struct {
	srv  *grpcserver.Server
	lis  net.Listener
	errc chan error // Serve's result
	ctx  context.Context
	stop context.CancelFunc
	fwd  *cluster.Forwarder // nil unless on the shared postgres store
}

// close releases what the server used besides its listener (after stop).
func (a *agentServer) close() {
	if a.fwd != nil {
		a.fwd.Close()
	}
}

// startServer listens (unless sc.Listener is set), builds the agent's gRPC
// server with the edge's authentication and authorization (and, for a
// replica, the forwarding of calls for sessions another replica owns),
// registers the service with register, attaches the health and serves.
func startServer(ctx context.Context, sc ServerConfig, rep *replica, health *depHealth, logger *slog.Logger, register func(*grpc.Server)) (*agentServer, error) {
	lis := sc.Listener
	if lis == nil {
		var err error
		if lis, err = net.Listen("tcp", sc.Listen); err != nil {
			return nil, fmt.Errorf("listen %s: %w", sc.Listen, err)
		}
	}
	authn := sc.Auth
	if authn == nil {
		authn = auth.None{}
	}
	edge := auth.NewEdge(auth.EdgeConfig{Authn: authn, Authz: sc.Authz, Logger: logger})
	if rep != nil && sc.Advertise == "" {
		rep.mgr.SetAddress(lis.Addr().String())
	}
	// Authenticate and authorize first; a call for a session another
	// replica owns is then forwarded with its metadata (the owner checks
	// the principal again, tenancy included).
	a := &agentServer{lis: lis, errc: make(chan error, 1)}
	opts := append(slices.Clone(sc.ServerOptions), edge.ServerOptions()...)
	if rep != nil {
		peerOpts := slices.Clone(sc.DialOptions)
		if sc.PeerAuthority != "" {
			peerOpts = append(peerOpts, grpc.WithAuthority(sc.PeerAuthority))
		}
		a.fwd = cluster.NewForwarder(func(addr string) (*grpc.ClientConn, error) { return grpcserver.Dial(addr, peerOpts...) }, logger)
		opts = append(opts, grpc.ChainUnaryInterceptor(a.fwd.Unary()), grpc.ChainStreamInterceptor(a.fwd.Stream()))
	}
	a.srv = grpcserver.New(grpcserver.Config{Logger: logger, Options: opts})
	register(a.srv.Server)
	health.attach(a.srv)
	a.ctx, a.stop = context.WithCancel(context.WithoutCancel(ctx))
	go func() { a.errc <- a.srv.Serve(a.ctx, lis) }()
	return a, nil
}

// openedStore is the configured store being opened; store, rep and err
// are set when opened is closed, probed when done is.
type openedStore struct {
	opened chan struct{}
	done   chan struct{} // the open and the health monitor's first probe ended
	store  persistence.Store
	rep    *replica // nil unless on the shared postgres store
	err    error
	probed time.Time // when the health monitor's first probe ended
}

func (o *openedStore) open(ctx context.Context, sc ServerConfig, logger *slog.Logger) {
	if sc.Store == "postgres" {
		o.store, o.rep, o.err = openReplica(ctx, sc, logger)
	} else {
		o.store, o.err = openStore(ctx, sc)
	}
}

func openStore(ctx context.Context, sc ServerConfig) (persistence.Store, error) {
	dir := sc.DataDir
	if dir == "" {
		dir = "."
	}
	switch sc.Store {
	case "", "sqlite":
		st, err := openSQLite(ctx, sqlitestore.Config{Path: filepath.Join(dir, "sessions.db"), Synchronous: sc.Synchronous, CommitDelay: sc.CommitDelay})
		if err != nil {
			return nil, fmt.Errorf("open sqlite store: %w", err)
		}
		return st, nil
	case "jsonl":
		st, err := jsonlstore.Open(jsonlstore.Config{Root: filepath.Join(dir, "sessions")})
		if err != nil {
			return nil, fmt.Errorf("open jsonl store: %w", err)
		}
		return st, nil
	default:
		return nil, fmt.Errorf("unknown store %q: use sqlite, jsonl or postgres", sc.Store)
	}
}

// subagentDepth maps Config.MaxSubagentDepth to the tools' limit.
func subagentDepth(d int32) int32 {
	switch {
	case d == 0:
		return subagent.DefaultMaxDepth
	case d < 0:
		return 0
	}
	return d
}

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/auth"
	"github.com/dsh-dev/dsh/internal/cmdline"
	"github.com/dsh-dev/dsh/internal/events"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/internal/hugeheap"
	"github.com/dsh-dev/dsh/internal/natstest"
	"github.com/dsh-dev/dsh/internal/telemetry"
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/llmgateway"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

type devFlags struct {
	data, store                                  string
	prompt                                       string
	asJSON                                       bool
	provider, model                              string
	agentAddr, gatewayAddr, toolhostAddr, natsAd string
	approval                                     string
	yes                                          bool
	sandboxMode, sandboxNetwork                  string
	allowUnenforced                              bool
	promptSections                               string
	// gateway is the gateway's configuration, from the environment
	// (llmgateway.ConfigFromEnv).
	gateway llmgateway.Config
	// debug (DSH_DEBUG) writes debug lines, the start's phases among
	// them, to dsh.log.
	debug bool
}

func runDev(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "dev", "dev [flags]   (interactive chat; -p PROMPT for one prompt)")
	var f devFlags
	fs.StringVar(&f.data, "data", envOr(e, "DSH_DATA", ".dsh"), "data directory: sessions, NATS store, logs (env DSH_DATA)")
	fs.StringVar(&f.store, "store", envOr(e, "DSH_STORE", "sqlite"), "session store: sqlite or jsonl (env DSH_STORE)")
	fs.StringVar(&f.prompt, "p", "", "run this one prompt without a terminal UI, print the answer, exit 0 iff the turn completed")
	fs.BoolVar(&f.asJSON, "json", false, "with -p: print every event of the turn as JSON lines")
	fs.StringVar(&f.provider, "provider", e.getenv("DSH_PROVIDER"), "provider route (default: the first configured, else scripted) (env DSH_PROVIDER)")
	fs.StringVar(&f.model, "model", e.getenv("DSH_MODEL"), "model (default: the provider's first) (env DSH_MODEL)")
	fs.StringVar(&f.agentAddr, "agent-listen", defaultAgentAddr, "agent service address (a busy default port falls back to a free one)")
	fs.StringVar(&f.gatewayAddr, "gateway-listen", defaultGatewayAddr, "LLM gateway address")
	fs.StringVar(&f.toolhostAddr, "toolhost-listen", defaultToolhostAddr, "toolhost address")
	fs.StringVar(&f.natsAd, "nats-listen", "127.0.0.1:4222", "embedded NATS address")
	fs.StringVar(&f.approval, "approval", e.getenv("DSH_APPROVAL"), "when tool calls need your approval: on-request (bash, write and edit ask; the chat's default), never (nothing is asked and such calls are refused; the default with -p) or always (env DSH_APPROVAL)")
	fs.BoolVar(&f.yes, "yes", false, "allow every tool call without asking")
	fs.StringVar(&f.sandboxMode, "sandbox-mode", envOr(e, "DSH_SANDBOX_MODE", "workspace-write"), "sandbox of tool calls: read-only, workspace-write or danger-full-access (env DSH_SANDBOX_MODE)")
	fs.StringVar(&f.sandboxNetwork, "sandbox-network", envOr(e, "DSH_SANDBOX_NETWORK", "on"), "network of tool processes: on or off (env DSH_SANDBOX_NETWORK)")
	fs.BoolVar(&f.allowUnenforced, "allow-unenforced-hosts", false, "let confined sessions call tools on hosts that do not enforce sandbox policies")
	fs.StringVar(&f.promptSections, "prompt-sections", e.getenv("DSH_PROMPT_SECTIONS"), "YAML/JSON file of system-prompt sections, variables, persona and tool order (env DSH_PROMPT_SECTIONS)")
	reasoning := reasoningFlag(e, fs)
	resume := registerResumeFlags(fs) // issue 14: --continue, --session
	if err := parse(fs, args); err != nil {
		return err
	}
	// The variables that are not flags' defaults; like those, a value
	// that does not parse is refused.
	gateway, gwErr := llmgateway.ConfigFromEnv(e.getenv)
	vars := cmdline.NewEnv(e.getenv)
	f.gateway, f.debug = gateway, vars.Bool("DSH_DEBUG", false)
	if err := errors.Join(gwErr, vars.Err()); err != nil {
		return &exitError{code: 2, msg: err.Error()}
	}
	mode, err := reasoningMode(*reasoning)
	if err != nil {
		return err
	}
	if f.approval == "" {
		f.approval = "on-request"
		if f.prompt != "" || !isTTY(e.stdin) {
			f.approval = "never" // nobody is there to answer (-p, or piped input)
		}
	}
	policy, err := agent.ParseApprovalPolicy(f.approval)
	if err != nil {
		return &exitError{code: 2, msg: "--approval: " + err.Error()}
	}
	if fs.NArg() > 0 {
		return &exitError{code: 2, msg: fmt.Sprintf("unexpected argument %q (use -p \"PROMPT\" for one prompt)", fs.Arg(0))}
	}
	if _, err := agent.ParseSandbox(f.sandboxMode, f.sandboxNetwork); err != nil {
		return &exitError{code: 2, msg: err.Error()}
	}
	// While the stack starts, the heap it grows is backed by huge pages
	// where the kernel allows (internal/hugeheap: ~1,000 page faults on the
	// way to the first model request otherwise) and collected less often;
	// both settings end with the start.
	restoreGC := startHeapGoal(e.getenv)
	startOver := func() { restoreGC(); hugeheap.End() }
	defer startOver()
	hugeheap.Advise()
	st, err := startStack(ctx, e, f)
	if err != nil {
		return err
	}
	defer st.stop()

	c := agentv1.NewAgentServiceClient(st.agentConn)
	cwd, _ := os.Getwd()
	sf := sessionFlags{provider: st.provider, model: st.model, cwd: cwd, approval: policy}
	if f.yes {
		sf.rules = []*sessionv1.ApprovalRule{{Tool: "*", Action: sessionv1.RuleAction_RULE_ACTION_ALLOW}}
		fmt.Fprintln(e.stderr, "--yes: every tool call runs without asking")
	}
	if sf.id, err = resume.sessionID(ctx, c, cwd); err != nil {
		return st.agent.explain(ctx, err)
	}
	s, err := openSession(ctx, c, sf)
	if err != nil {
		return st.agent.explain(ctx, err)
	}
	if f.prompt != "" {
		// In one-shot mode NATS starts once the model has begun answering,
		// so its start-up does not compete for the CPU with the first
		// request; its events are published as soon as it is up.
		return printTurn(ctx, e, c, s, f.prompt, f.asJSON, func() { startOver(); st.startNATS() })
	}
	startOver() // the start is over (input piped in is sent at once, under the default settings)
	return chatLoop(ctx, e, c, s, mode)
}

// startGCPercent is the collector's setting while `dsh dev` starts: its
// first heap goal is 4 MiB × GOGC/100, and the start (servers, connections,
// the first protobuf types, SQLite) allocates past 4 MiB, mostly data that
// lives on, so the default's collection in the middle of the start found
// little to free and cost the launch its CPU, its pauses and its write
// barriers (docs/arch/throughput.md §28).
const startGCPercent = 400

// startHeapGoal sets the collector to startGCPercent unless GOGC is set;
// the returned func (idempotent) puts the previous setting back once the
// start is over: with -p when the model's answer begins (the collection
// then runs while the model answers), in the chat once the stack serves.
func startHeapGoal(getenv func(string) string) (restore func()) {
	if getenv("GOGC") != "" {
		return func() {}
	}
	prev := debug.SetGCPercent(startGCPercent)
	return sync.OnceFunc(func() { debug.SetGCPercent(prev) })
}

// stack is the running all-in-one.
type stack struct {
	agentAddr, gatewayAddr, toolhostAddr, natsURL string
	provider, model                               string
	sandbox                                       string // the banner's sandbox line
	sandboxWarn                                   string // set when confinement is unavailable
	stop                                          func()
	// agentConn is the CLI's connection to the agent, made as its
	// listener was bound; the stack's stop closes it.
	agentConn *grpc.ClientConn
	// startNATS starts the embedded NATS server (once).
	startNATS func()
	// agent is the agent service: its start may still be under way
	// when the stack is returned (it accepts calls before).
	agent *runningAgent
}

// listen binds addr; when addr is the default and busy, it binds a free
// port on the same host instead.
func listen(addr, def string) (net.Listener, error) {
	if !auth.Loopback(addr) {
		// dsh dev has no TLS and no client authentication: never expose it.
		return nil, fmt.Errorf("dsh dev serves loopback addresses only, got %s: run the services apart with TLS and --auth to serve a network", addr)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil && addr == def {
		host, _, _ := net.SplitHostPort(addr)
		lis, err = net.Listen("tcp", net.JoinHostPort(host, "0"))
	}
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return lis, nil
}

func startStack(ctx context.Context, e *env, f devFlags) (_ *stack, err error) {
	var cleanups []func()
	stop := func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	if abs, err := filepath.Abs(f.data); err == nil {
		f.data = abs
	}
	if err := os.MkdirAll(f.data, 0o700); err != nil {
		return nil, fmt.Errorf("--data %s: %w", f.data, err)
	}
	logFile, err := os.OpenFile(filepath.Join(f.data, "dsh.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("--data %s: %w", f.data, err)
	}
	cleanups = append(cleanups, func() { logFile.Close() })
	level := slog.LevelInfo
	if f.debug {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: level}))
	launched := time.Now()
	phase := func(name string) { logger.Debug("dev startup", "phase", name, "elapsed", time.Since(launched)) }

	tel, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: "dsh-dev", Logger: logger, Getenv: e.getenv})
	if err != nil {
		return nil, err
	}
	cleanups = append(cleanups, func() {
		sctx, cancel := context.WithTimeout(context.Background(), telemetry.ShutdownTimeout)
		defer cancel()
		_ = tel.Shutdown(sctx)
	})

	// NATS starts in the background once the agent serves: the publisher
	// tolerates a server that is not up yet (events queue, the connection
	// retries), so JetStream's start-up stays off the path to the first
	// model request.
	natsLis, err := listen(f.natsAd, "127.0.0.1:4222")
	if err != nil {
		return nil, fmt.Errorf("--nats-listen: %w", err)
	}
	natsHost, natsPortS, _ := net.SplitHostPort(natsLis.Addr().String())
	natsPort, _ := strconv.Atoi(natsPortS)
	natsLis.Close()
	natsURL := "nats://" + net.JoinHostPort(natsHost, natsPortS)
	natsReady := make(chan *natstest.Server, 1)
	var natsStarted atomic.Bool
	var natsOnce sync.Once
	gate := &natsGate{}
	startNATS := func() {
		natsOnce.Do(func() {
			natsStarted.Store(true)
			gate.state.Store(natsStarting)
			go func() {
				srv, err := natstest.New(natstest.Options{Host: natsHost, Port: natsPort, StoreDir: filepath.Join(f.data, "nats")})
				if err != nil {
					logger.Error("embedded NATS failed to start; events stay queued", "err", err)
					gate.state.Store(natsFailed)
					natsReady <- nil
					return
				}
				phase("nats ready")
				gate.state.Store(natsUp)
				natsReady <- srv
			}()
		})
	}
	// Stopped after the publisher has drained (cleanups run in reverse).
	cleanups = append(cleanups, func() {
		if !natsStarted.Load() {
			return
		}
		if srv := <-natsReady; srv != nil {
			srv.Shutdown()
		}
	})

	// Every listener is bound first: the agent starts right away (its
	// store open, the first SQLite open of the process, is the longest
	// piece of the start) while the gateway and the toolhost are built; its
	// dials to them complete once they serve. The CLI's own connection to
	// the agent is made now too, so its handshake is done by the time the
	// agent serves (issue 19: launch to the first model request).
	gwLis, err := listen(f.gatewayAddr, defaultGatewayAddr)
	if err != nil {
		return nil, fmt.Errorf("--gateway-listen: %w", err)
	}
	cleanups = append(cleanups, func() { gwLis.Close() }) // until served
	thLis, err := listen(f.toolhostAddr, defaultToolhostAddr)
	if err != nil {
		return nil, fmt.Errorf("--toolhost-listen: %w", err)
	}
	cleanups = append(cleanups, func() { thLis.Close() }) // until served
	agLis, err := listen(f.agentAddr, defaultAgentAddr)
	if err != nil {
		return nil, fmt.Errorf("--agent-listen: %w", err)
	}
	cwd, err := os.Getwd()
	if err != nil {
		agLis.Close()
		return nil, err
	}
	sandbox, _ := agent.ParseSandbox(f.sandboxMode, f.sandboxNetwork)
	ag := startAgent(ctx, agent.ServerConfig{
		Listener: agLis, Gateway: gwLis.Addr().String(), ConnectGatewayAtStart: true, // bound above
		Toolhosts: []string{"builtin=" + thLis.Addr().String()},
		Store:     f.store, DataDir: f.data, Synchronous: "NORMAL", ShutdownTimeout: 5 * time.Second,
		// The agent publishes every durable event to the embedded NATS
		// (internal/events) and catches up on sessions a previous run
		// left unpublished.
		NATS:        events.Conn{URL: natsURL, Name: "dsh dev agent"},
		NATSOptions: gate.options(),
		// One-shot: exit right after the answer; events the embedded
		// NATS has not acknowledged by then are published by the next
		// start (the durable published cursor hands them over).
		PublishOnClose: publishOnClose(f.prompt),
		// Deployment defaults: bash, write and edit ask; a question or
		// approval nobody answers settles after 15 minutes.
		Service: agent.Config{DefaultCwd: cwd, Sandbox: sandbox,
			Approval: agent.ApprovalConfig{Rules: agent.DefaultApprovalRules(), Timeout: 15 * time.Minute}},
		AllowUnenforcedHosts: f.allowUnenforced,
		PromptSections:       f.promptSections,
		// Say which toolhost is down (issue 14).
		OnToolhost: toolhostNotice(e.stderr),
		// NATS starts once the agent serves (with -p, once the model
		// answers: printTurn).
		Ready: func(string) {
			phase("agent serving")
			if f.prompt == "" {
				startNATS()
			}
		},
	}, logger)
	// Until the agent's stop is in its place below (it drains before the
	// toolhost and the gateway stop), a failed start stops it first.
	agentRegistered := false
	var agConn *grpc.ClientConn
	defer func() {
		if !agentRegistered {
			if agConn != nil {
				agConn.Close()
			}
			ag.stop()
		}
	}()
	agConn, err = grpcserver.Dial(agLis.Addr().String())
	if err != nil {
		return nil, err
	}
	agConn.Connect()
	phase("agent started")
	hugeheap.Advise() // the heap maps new memory as it grows: mark it too

	// Gateway.
	gw, err := llmgateway.New(f.gateway, logger)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	gwSrv := grpcserver.New(grpcserver.Config{Logger: logger, DrainTimeout: 2 * time.Second, Options: llmgateway.ServerOptionsFor(devStreamWorkers),
		Tracing: grpcserver.TracingFor(tel.Tracing || tel.Metering)})
	gw.Register(gwSrv.Server)
	phase("gateway built")
	cleanups = append(cleanups, serve(ctx, gwSrv, gwLis, gw.Close))

	// Toolhost.
	th, thStop, err := startToolhost(ctx, e, cwd, f.data, thLis, logger)
	if err != nil {
		return nil, fmt.Errorf("toolhost: %w", err)
	}
	cleanups = append(cleanups, thStop)
	phase("toolhost built")
	hugeheap.Advise()
	summary := workspaceSummary(th, cwd, logFile.Name(), logger)
	fmt.Fprintln(e.stderr, summary)
	logger.Info(summary)

	// Agent: stopped first (cleanups run in reverse), after the CLI's
	// connection to it is closed.
	cleanups = append(cleanups, ag.stop, func() { agConn.Close() })
	agentRegistered = true
	warmFirstRequests()
	hugeheap.Advise()
	// The agent accepts calls before its start is over (its store
	// opening, its tools being listed): the CLI's first calls are made
	// now and wait in the agent until it has started (a failed start
	// answers them with its error), so their transport overlaps the start.
	select {
	case <-ag.accepting:
		phase("agent accepting")
	case err := <-ag.done:
		ag.done <- err
		return nil, fmt.Errorf("agent: %w", err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}

	st := &stack{agentAddr: agLis.Addr().String(), gatewayAddr: gwLis.Addr().String(), toolhostAddr: thLis.Addr().String(),
		natsURL: natsURL, stop: stop, startNATS: startNATS, agentConn: agConn, agent: ag}
	st.sandbox, st.sandboxWarn = sandboxLine(f, th)
	if err := pickModel(ctx, st, f, f.gateway); err != nil {
		return nil, err
	}
	banner(e, st, f, cwd, f.gateway)
	return st, nil
}

// devStreamWorkers is the gateway's pool of parked stream goroutines in
// `dsh dev`: one person's sessions stream a few model calls at once (more
// run on new goroutines); the deployed gateway's 256 cost its start ~3 % of
// the CPU up to the first model request.
const devStreamWorkers = 8

// warmFirstRequests sets up protobuf's state for the CLI's first two
// requests (CreateSession, Send) while the CLI waits for the agent to serve:
// the first marshal of any agent.proto message builds that file's full
// descriptor and its imports' (2–6 ms here), which otherwise ran after the
// agent served, on the path to the first model request
// (docs/arch/throughput.md §28; §17 tried a wider set at a busier time).
func warmFirstRequests() {
	_ = proto.Size(&agentv1.CreateSessionRequest{Options: &sessionv1.SessionOptions{ApprovalRules: []*sessionv1.ApprovalRule{{}}}})
	_ = proto.Size(&agentv1.SendRequest{})
}

// runningAgent is the agent service started by startAgent.
type runningAgent struct {
	accepting chan struct{} // closed once it accepts calls
	ready     chan struct{} // closed once its start is over
	done      chan error    // agent.Run's result
	stop      func()        // cancels it and waits for it to end
}

// startAgent runs the agent service in the background (sc.Ready, when set,
// is called before the runningAgent learns it is ready).
func startAgent(ctx context.Context, sc agent.ServerConfig, logger *slog.Logger) *runningAgent {
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a := &runningAgent{accepting: make(chan struct{}), ready: make(chan struct{}), done: make(chan error, 1)}
	sc.Accepting = func(string) { close(a.accepting) } // called once by Run
	onReady := sc.Ready
	sc.Ready = func(addr string) {
		if onReady != nil {
			onReady(addr)
		}
		close(a.ready) // called once by Run
	}
	go func() { a.done <- agent.Run(actx, sc, logger) }()
	var once sync.Once
	a.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-a.done; err != nil {
				logger.Error("agent shutdown", "err", err)
			}
			// A start that failed before the agent served leaves its
			// listener open (Serve closes it otherwise).
			sc.Listener.Close()
		})
	}
	return a
}

// explain returns err, the failure of one of the CLI's first calls, or the
// agent's own error when its start failed: the agent accepts calls before
// its start is over, and a failed start answers the calls waiting then
// with its error, but a call that reached it after its server stopped
// sees only a closed connection. It waits for the start's outcome.
func (a *runningAgent) explain(ctx context.Context, err error) error {
	select {
	case <-a.ready:
	case aerr := <-a.done:
		a.done <- aerr // for stop
		if aerr != nil {
			return fmt.Errorf("agent: %w", aerr)
		}
	case <-ctx.Done():
	}
	return err
}

// serve runs a gRPC server until the returned stop is called.
func serve(ctx context.Context, srv *grpcserver.Server, lis net.Listener, after func()) func() {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		_ = srv.Serve(sctx, lis)
		close(done)
	}()
	return func() {
		cancel()
		<-done
		if after != nil {
			after()
		}
	}
}

// pickModel chooses the provider (the first configured, else scripted) and
// model (the provider's first, unless given).
func pickModel(ctx context.Context, st *stack, f devFlags, cfg llmgateway.Config) error {
	st.provider = f.provider
	if st.provider == "" {
		for _, r := range cfg.Routes {
			st.provider = r.Name
			break
		}
	}
	st.model = f.model
	if st.model != "" {
		return nil
	}
	for _, r := range cfg.Routes {
		if r.Name == st.provider && len(r.Models) > 0 {
			st.model = r.Models[0].ID
			return nil
		}
	}
	conn, err := grpcserver.Dial(st.gatewayAddr)
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := llmv1.NewLlmGatewayClient(conn).ListModels(ctx, &llmv1.ListModelsRequest{Provider: st.provider})
	if err != nil {
		return rpcError("list models of "+st.provider, err)
	}
	if len(resp.GetModels()) == 0 {
		return &exitError{code: 2, msg: fmt.Sprintf("provider %s lists no models: pass --model (or set DSH_MODEL / OPENAI_MODEL)", st.provider)}
	}
	st.model = resp.GetModels()[0].GetId()
	return nil
}

func usingScripted(st *stack, cfg llmgateway.Config) bool {
	for _, r := range cfg.Routes {
		if r.Name == st.provider {
			return r.Kind == llmgateway.KindScripted
		}
	}
	return false
}

// banner prints where everything listens and which model answers: to
// stdout for the chat, to stderr with -p (stdout carries the answer).
func banner(e *env, st *stack, f devFlags, cwd string, cfg llmgateway.Config) {
	w := e.stdout
	if f.prompt != "" {
		w = e.stderr
	}
	color := useColor(e, w)
	dim := func(s string) string {
		if color {
			return "\x1b[2m" + s + "\x1b[0m"
		}
		return s
	}
	if f.prompt != "" && !isTTY(w) {
		// Scripts get a short note, not the tour (but always the sandbox
		// warning).
		if st.sandboxWarn != "" {
			fmt.Fprintln(w, "dsh: WARNING:", st.sandboxWarn)
		}
		if usingScripted(st, cfg) {
			fmt.Fprintln(w, "dsh: no model configured (set DEEPSEEK_API_KEY, ANTHROPIC_API_KEY or OPENAI_API_KEY); using the scripted demo provider")
		}
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "dsh dev — agent, gateway, toolhost and NATS in one process\n")
	fmt.Fprintf(&b, "  agent     %s   %s\n", st.agentAddr, dim("dsh chat --addr "+st.agentAddr+" · grpcurl -plaintext "+st.agentAddr+" list"))
	fmt.Fprintf(&b, "  gateway   %s\n", st.gatewayAddr)
	fmt.Fprintf(&b, "  toolhost  %s   %s\n", st.toolhostAddr, dim("workspace "+cwd))
	fmt.Fprintf(&b, "  nats      %s   %s\n", st.natsURL, dim("dsh events tail --nats "+st.natsURL))
	fmt.Fprintf(&b, "  data      %s   %s\n", f.data, dim("sessions ("+f.store+"), NATS store, dsh.log"))
	fmt.Fprintf(&b, "  model     %s/%s\n", st.provider, st.model)
	fmt.Fprintf(&b, "  sandbox   %s\n", st.sandbox)
	if st.sandboxWarn != "" {
		msg := "WARNING: " + st.sandboxWarn
		if color {
			msg = "\x1b[31m" + msg + "\x1b[0m"
		}
		fmt.Fprintf(&b, "\n%s\n", msg)
	}
	if usingScripted(st, cfg) {
		msg := "No model is configured, so the scripted demo provider answers (it runs one real tool).\n" +
			"To use a real model set DEEPSEEK_API_KEY, ANTHROPIC_API_KEY, or OPENAI_API_KEY\n" +
			"(with OPENAI_BASE_URL and OPENAI_MODEL for vLLM, Ollama or llama.cpp), then start dsh dev again."
		if color {
			msg = "\x1b[33m" + msg + "\x1b[0m"
		}
		fmt.Fprintf(&b, "\n%s\n", msg)
	}
	fmt.Fprintln(w, b.String())
}

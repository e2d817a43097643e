package mcpbridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Separator joins a server name and an MCP tool name.
const Separator = "__"

// Bridge serves the tools of MCP servers through a toolsdk.Host.
type Bridge struct {
	cfg     Config
	log     *slog.Logger
	host    *toolsdk.Host
	servers []*server

	progress sync.Map // token string → *progressSink
	nextTok  atomic.Int64

	ready     chan struct{}
	readyWait sync.WaitGroup

	healthMu sync.Mutex
	health   func(name string, serving bool) // set by Serve

	links linkIndex // resource URI → server, from tool results
}

// HealthService is the gRPC health service name that reports one MCP
// server: SERVING while it is connected with its tools listed,
// NOT_SERVING while it is starting, not answering or restarting.
func HealthService(server string) string { return "dsh.mcpbridge/" + server }

// New builds a bridge; Run or Serve connects it.
func New(cfg Config, logger *slog.Logger) (*Bridge, error) {
	if err := cfg.Servers.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 200 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 30 * time.Second
	}
	if cfg.InitTimeout <= 0 {
		cfg.InitTimeout = 30 * time.Second
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = 15 * time.Second
	}
	if cfg.Getenv == nil {
		cfg.Getenv = os.LookupEnv
	}
	for _, n := range cfg.Servers.Notes {
		logger.Info("mcp config: " + n)
	}
	b := &Bridge{cfg: cfg, log: logger, ready: make(chan struct{}), links: linkIndex{m: map[string]string{}}}
	host, err := toolsdk.NewHost(toolsdk.HostConfig{Logger: logger, DefaultTimeout: cfg.CallTimeout, WorkspaceContext: b.workspaceContext})
	if err != nil {
		return nil, err
	}
	b.host = host
	b.readyWait.Add(len(cfg.Servers.Servers))
	go func() {
		b.readyWait.Wait()
		close(b.ready)
	}()
	for _, name := range cfg.Servers.Names() {
		b.servers = append(b.servers, &server{
			b: b, name: name, cfg: cfg.Servers.Servers[name],
			log: logger.With("mcp_server", name), tools: map[string]string{}, resync: make(chan struct{}, 1),
		})
	}
	if err := host.Add(b.readResourceTool()); err != nil {
		return nil, err
	}
	return b, nil
}

// Host is the ToolHost the bridge feeds.
func (b *Bridge) Host() *toolsdk.Host { return b.host }

// Ready is closed once every server has been tried once: connected with its
// tools listed, or failed to connect (it keeps retrying in the background).
func (b *Bridge) Ready() <-chan struct{} { return b.ready }

// Run connects to every server and keeps the connections up until ctx ends,
// then closes them.
func (b *Bridge) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, s := range b.servers {
		wg.Go(func() { s.run(ctx) })
	}
	wg.Wait()
}

// Serve runs the bridge and serves its ToolHost (with health and reflection)
// on lis until ctx ends.
func (b *Bridge) Serve(ctx context.Context, lis net.Listener) error {
	srv := grpcserver.New(grpcserver.Config{Logger: b.log, Options: b.cfg.ServerOptions})
	b.host.Register(srv.Server)
	b.healthMu.Lock()
	b.health = srv.SetStatus
	for _, s := range b.servers {
		srv.SetStatus(HealthService(s.name), s.current() != nil)
	}
	b.healthMu.Unlock()
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.Run(runCtx)
	}()
	err := srv.Serve(ctx, lis)
	stop()
	<-done
	return err
}

// server is one MCP server and its supervisor.
type server struct {
	b    *Bridge
	name string
	cfg  ServerConfig
	log  *slog.Logger

	mu      sync.Mutex
	session *mcp.ClientSession
	conn    context.Context   // the session's life: cancelled, with the cause, when it is lost
	tools   map[string]string // dsh name → fingerprint
	resync  chan struct{}
	tried   sync.Once
}

func (s *server) firstTry() { s.tried.Do(s.b.readyWait.Done) }

func (s *server) current() *mcp.ClientSession {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.session
}

// begin returns the live session and a context for one request on it: ctx,
// also cancelled (with the cause) when the connection is lost, so a
// request to a server that stopped answering ends at once instead of
// holding the session's close. nil when the server is not connected.
func (s *server) begin(ctx context.Context) (*mcp.ClientSession, context.Context, func()) {
	s.mu.Lock()
	session, conn := s.session, s.conn
	s.mu.Unlock()
	if session == nil {
		return nil, ctx, func() {}
	}
	rctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(conn, func() { cancel(context.Cause(conn)) })
	return session, rctx, func() { stop(); cancel(nil) }
}

// requestError maps a failed request: the caller's own cancellation, a
// lost connection (its cause), or the server's error.
func (s *server) requestError(ctx, rctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case rctx.Err() != nil:
		return errProtocol(s.name, context.Cause(rctx))
	}
	return callError(s.name, err)
}

// setSession records the live session and its connection context (nil:
// none) and reports the server's health.
func (s *server) setSession(cs *mcp.ClientSession, conn context.Context) {
	s.mu.Lock()
	s.session, s.conn = cs, conn
	s.mu.Unlock()
	s.b.healthMu.Lock()
	if s.b.health != nil {
		s.b.health(HealthService(s.name), cs != nil)
	}
	s.b.healthMu.Unlock()
}

// instructions is the connected server's initialize instructions.
func (s *server) instructions() string {
	if cs := s.current(); cs != nil {
		if r := cs.InitializeResult(); r != nil {
			return r.Instructions
		}
	}
	return ""
}

func (s *server) kick() {
	select {
	case s.resync <- struct{}{}:
	default:
	}
}

func (s *server) run(ctx context.Context) {
	backoff := s.b.cfg.MinBackoff
	for ctx.Err() == nil {
		start := time.Now()
		err := s.connectAndServe(ctx)
		s.firstTry()
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > time.Minute {
			backoff = s.b.cfg.MinBackoff
		}
		s.log.Warn("mcp server unavailable; retrying", "err", err, "backoff", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
		backoff = min(backoff*2, s.b.cfg.MaxBackoff)
	}
}

// transport builds the connection of one attempt. A stdio server is not
// tied to a context: closing the session closes its stdin and, after
// TerminateDuration, terminates it, so it can exit cleanly on shutdown.
func (s *server) transport() mcp.Transport {
	if s.cfg.URL != "" {
		hc := &http.Client{Transport: sseTapTransport{base: http.DefaultTransport, headers: s.cfg.Headers, b: s.b}}
		if s.cfg.transportType() == "sse" {
			return &mcp.SSEClientTransport{Endpoint: s.cfg.URL, HTTPClient: hc}
		}
		// One resume attempt (after 1-2 s) when a stream breaks: a dead
		// server fails its calls then, not after go-sdk's default five
		// attempts with growing delays (~20 s).
		return &mcp.StreamableClientTransport{Endpoint: s.cfg.URL, HTTPClient: hc, MaxRetries: 1}
	}
	cmd := exec.Command(s.cfg.Command, s.cfg.Args...)
	cmd.Env = s.cfg.environ(s.b.cfg.Getenv)
	cmd.Dir = s.cfg.Dir
	cmd.Stderr = os.Stderr
	return tapTransport{Transport: &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}, b: s.b}
}

func (s *server) connectAndServe(ctx context.Context) (retErr error) {
	opts := &mcp.ClientOptions{
		ToolListChangedHandler:      func(context.Context, *mcp.ToolListChangedRequest) { s.kick() },
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) { s.b.onProgress(req.Params) },
		LoggingMessageHandler:       func(ctx context.Context, req *mcp.LoggingMessageRequest) { s.logMessage(ctx, req.Params) },
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "dsh-mcpbridge", Version: "v1"}, opts)
	// The connect context lives as long as the connection (the legacy SSE
	// transport reads its stream under it); a timer, not a deadline,
	// bounds the handshake.
	ictx, cancel := context.WithCancel(ctx)
	defer cancel()
	timer := time.AfterFunc(s.b.cfg.InitTimeout, cancel)
	session, err := client.Connect(ictx, s.transport(), nil)
	timedOut := !timer.Stop() && ctx.Err() == nil
	if err == nil && timedOut { // answered as the timer fired: its context is gone
		_ = session.Close()
		err = context.Canceled
	}
	if err != nil {
		if timedOut {
			return fmt.Errorf("the server did not answer initialize within %s", s.b.cfg.InitTimeout)
		}
		return fmt.Errorf("connect: %w", err)
	}
	init := session.InitializeResult()
	s.log.Info("mcp server connected", "server_name", init.ServerInfo.Name, "server_version", init.ServerInfo.Version,
		"protocol", init.ProtocolVersion, "instructions_bytes", len(init.Instructions))
	if init.Capabilities != nil && init.Capabilities.Logging != nil {
		if err := session.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "info"}); err != nil {
			s.log.Debug("logging/setLevel refused", "err", err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- session.Wait() }()
	defer func() {
		s.setSession(nil, nil)
		_ = session.Close()
	}()
	// Runs before the close above: requests in flight end with the cause
	// (go-sdk's close waits for them).
	conn, lost := context.WithCancelCause(ctx)
	defer func() { lost(fmt.Errorf("connection lost: %w", retErr)) }()
	if err := s.sync(ctx, session); err != nil {
		s.log.Warn("listing tools failed", "err", err)
	}
	s.setSession(session, conn)
	s.firstTry()
	if s.b.cfg.KeepAlive > 0 && s.cfg.URL != "" {
		// Pings find an HTTP server that hangs without closing its
		// connections; a stdio server's death is its pipe's EOF, and a
		// busy single-threaded server must not be killed for a late pong.
		go s.keepalive(conn, session, lost)
	}
	for {
		select {
		case <-ctx.Done():
			_ = session.Close()
			<-done
			return ctx.Err()
		case <-conn.Done():
			return context.Cause(conn)
		case err := <-done:
			if err == nil {
				err = errors.New("connection closed")
			}
			return err
		case <-s.resync:
			if err := s.sync(ctx, session); err != nil {
				s.log.Warn("re-listing tools failed", "err", err)
			}
		}
	}
}

// keepalive pings the server every KeepAlive; one that does not answer
// within half of it ends the connection (lost), failing the requests in
// flight. A server without ping is left alone.
func (s *server) keepalive(conn context.Context, session *mcp.ClientSession, lost context.CancelCauseFunc) {
	every := s.b.cfg.KeepAlive
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-conn.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(conn, every/2)
		err := session.Ping(pctx, nil)
		cancel()
		var werr *jsonrpc.Error
		switch {
		case err == nil || conn.Err() != nil:
		case errors.As(err, &werr) && werr.Code == jsonrpc.CodeMethodNotFound:
			return
		default:
			lost(fmt.Errorf("the server did not answer a ping within %s: %w", every/2, err))
			return
		}
	}
}

var unsafeNameChars = regexp.MustCompile(`[^a-zA-Z0-9_-]`)

// ToolName is the dsh name of an MCP tool: "<server>__<tool>", characters
// outside [a-zA-Z0-9_-] replaced by '_'.
func ToolName(server, tool string) string {
	return server + Separator + unsafeNameChars.ReplaceAllString(tool, "_")
}

type mcpTool struct {
	name     string // MCP name
	desc     string
	schema   json.RawMessage
	readOnly bool
}

// sync lists the server's tools and updates the host with the difference.
func (s *server) sync(ctx context.Context, session *mcp.ClientSession) error {
	want := map[string]mcpTool{}
	prints := map[string]string{}
	for t, err := range session.Tools(ctx, nil) {
		if err != nil {
			return err
		}
		name := ToolName(s.name, t.Name)
		if len(name) > 64 {
			s.log.Warn("skipping tool: name too long", "tool", t.Name)
			continue
		}
		schema, err := json.Marshal(t.InputSchema)
		var root struct {
			Type string `json:"type"`
		}
		if err != nil || json.Unmarshal(schema, &root) != nil || root.Type != "object" {
			s.log.Warn("skipping tool: input schema is not a JSON Schema object", "tool", t.Name)
			continue
		}
		if _, dup := want[name]; dup {
			s.log.Warn("skipping tool: name collides after sanitising", "tool", t.Name, "name", name)
			continue
		}
		mt := mcpTool{name: t.Name, desc: t.Description, schema: schema, readOnly: t.Annotations != nil && t.Annotations.ReadOnlyHint}
		want[name] = mt
		fp, _ := json.Marshal([]any{mt.name, mt.desc, string(mt.schema), mt.readOnly})
		prints[name] = string(fp)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	var remove []string
	var add []toolsdk.Tool
	for name, fp := range s.tools {
		if prints[name] != fp {
			remove = append(remove, name)
		}
	}
	for name, fp := range prints {
		if s.tools[name] != fp {
			add = append(add, s.tool(name, want[name]))
		}
	}
	if len(remove) > 0 {
		s.b.host.Remove(remove...)
		for _, n := range remove {
			delete(s.tools, n)
		}
	}
	if len(add) > 0 {
		if err := s.b.host.Add(add...); err != nil {
			return fmt.Errorf("add tools: %w", err)
		}
		for _, t := range add {
			n := t.Descriptor().GetSchema().GetName()
			s.tools[n] = prints[n]
		}
	}
	if len(add)+len(remove) > 0 {
		s.log.Info("tools synced", "added", len(add), "removed", len(remove), "total", len(s.tools))
	}
	return nil
}

func (s *server) tool(name string, t mcpTool) toolsdk.Tool {
	var opts []toolsdk.Option
	if t.readOnly {
		opts = append(opts, toolsdk.AlwaysConcurrencySafe())
	}
	return toolsdk.RawTool(name, t.desc, t.schema, func(ctx context.Context, call *toolsdk.Call, args json.RawMessage) (toolsdk.Result, error) {
		return s.call(ctx, call, t.name, args)
	}, opts...)
}

func (s *server) call(ctx context.Context, call *toolsdk.Call, mcpName string, args json.RawMessage) (toolsdk.Result, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(args, &obj); err != nil || obj == nil {
		return toolsdk.Result{}, &toolsdk.ArgsError{Violations: []string{`"arguments" must be an object`}}
	}
	session, rctx, done := s.begin(ctx)
	defer done()
	if session == nil {
		return toolsdk.Result{}, errUnavailable(s.name)
	}
	tok, sink := s.b.registerProgress(call.Output)
	defer s.b.progress.Delete(tok)
	params := &mcp.CallToolParams{Name: mcpName, Arguments: args}
	params.SetProgressToken(tok)
	// Protocol 2026-07-28 asks for server logs per request; older ones
	// took logging/setLevel at connect.
	params.Meta[mcp.MetaKeyLogLevel] = "info"
	res, err := session.CallTool(rctx, params)
	sink.drain(rctx)
	if err != nil {
		return toolsdk.Result{}, s.requestError(ctx, rctx, err)
	}
	if res.IsError {
		return toolsdk.Result{}, errors.New(errorText(res.Content))
	}
	s.b.links.note(s.name, res.Content)
	return mapResult(res.Content, res.StructuredContent), nil
}

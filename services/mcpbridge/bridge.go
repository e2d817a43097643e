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
}

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
	host, err := toolsdk.NewHost(toolsdk.HostConfig{Logger: logger, DefaultTimeout: cfg.CallTimeout})
	if err != nil {
		return nil, err
	}
	b := &Bridge{cfg: cfg, log: logger, host: host, ready: make(chan struct{})}
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

func (s *server) setSession(cs *mcp.ClientSession) {
	s.mu.Lock()
	s.session = cs
	s.mu.Unlock()
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
		s.log.Warn("mcp server disconnected; reconnecting", "err", err, "backoff", backoff)
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
		return &mcp.StreamableClientTransport{Endpoint: s.cfg.URL, HTTPClient: hc}
	}
	cmd := exec.Command(s.cfg.Command, s.cfg.Args...)
	cmd.Env = os.Environ()
	for k, v := range s.cfg.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Dir = s.cfg.Dir
	cmd.Stderr = os.Stderr
	return tapTransport{Transport: &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}, b: s.b}
}

func (s *server) connectAndServe(ctx context.Context) error {
	client := mcp.NewClient(&mcp.Implementation{Name: "dsh-mcpbridge", Version: "v1"}, &mcp.ClientOptions{
		ToolListChangedHandler:      func(context.Context, *mcp.ToolListChangedRequest) { s.kick() },
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) { s.b.onProgress(req.Params) },
	})
	session, err := client.Connect(ctx, s.transport(), nil)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	s.log.Info("mcp server connected")
	s.setSession(session)
	done := make(chan error, 1)
	go func() { done <- session.Wait() }()
	defer func() {
		s.setSession(nil)
		_ = session.Close()
	}()
	if err := s.sync(ctx, session); err != nil {
		s.log.Warn("listing tools failed", "err", err)
	}
	s.firstTry()
	for {
		select {
		case <-ctx.Done():
			_ = session.Close()
			<-done
			return ctx.Err()
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
	session := s.current()
	if session == nil {
		return toolsdk.Result{}, errUnavailable(s.name)
	}
	tok, sink := s.b.registerProgress(call.Output)
	defer s.b.progress.Delete(tok)
	params := &mcp.CallToolParams{Name: mcpName, Arguments: args}
	params.SetProgressToken(tok)
	res, err := session.CallTool(ctx, params)
	sink.drain(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return toolsdk.Result{}, ctx.Err()
		}
		return toolsdk.Result{}, errProtocol(s.name, err)
	}
	if res.IsError {
		return toolsdk.Result{}, errors.New(errorText(res.Content))
	}
	r := toolsdk.Result{Content: ResultBlocks(res.Content)}
	if res.StructuredContent != nil {
		r.Meta = map[string]any{"structuredContent": res.StructuredContent}
	}
	return r, nil
}

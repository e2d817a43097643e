package toolpipe_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
	"github.com/dsh-dev/dsh/services/agent/internal/hooks"
	"github.com/dsh-dev/dsh/services/agent/internal/toolpipe"
)

func client(t *testing.T, addr string) toolsv1.ToolHostClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return toolsv1.NewToolHostClient(conn)
}

func serveHost(t *testing.T, h *fakes.ToolHost) string {
	return fakes.Serve(t, func(s *grpc.Server) { toolsv1.RegisterToolHostServer(s, h) })
}

func start(t *testing.T, cfg toolpipe.Config) *toolpipe.Pipeline {
	t.Helper()
	cfg.BackoffMin, cfg.BackoffMax = time.Millisecond, 10*time.Millisecond
	p := toolpipe.New(cfg)
	if err := p.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func run(ctx context.Context, p *toolpipe.Pipeline, name, args string) *toolsv1.ToolExecutionResult {
	ex := &toolsv1.ToolExecution{CallId: "c1", Name: name, Arguments: args, Context: &toolsv1.ToolContext{SessionId: "s", Cwd: "/w"}}
	c := p.Begin(ctx, nil, ex)
	c.Dispatch(ctx, nil)
	return c.Finish(ctx)
}

func codeOf(r *toolsv1.ToolExecutionResult) string { return r.GetError().GetCode() }

func TestDuplicateToolIsAConfigError(t *testing.T) {
	t.Parallel()
	a := serveHost(t, fakes.NewToolHost(fakes.Tool{Name: "read"}))
	b := serveHost(t, fakes.NewToolHost(fakes.Tool{Name: "read"}))
	p := toolpipe.New(toolpipe.Config{Hosts: []toolpipe.Host{{Name: "a", Client: client(t, a)}, {Name: "b", Client: client(t, b)}}})
	var dup *toolpipe.DuplicateToolError
	if err := p.Start(t.Context()); !errors.As(err, &dup) || dup.Tool != "read" {
		t.Fatalf("start: %v, want a duplicate tool error", err)
	}
}

func TestResults(t *testing.T) {
	t.Parallel()
	host := fakes.NewToolHost(fakes.Tool{Name: "echo"}, fakes.Tool{Name: "hang", Run: func(ctx context.Context, _ *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
		<-ctx.Done()
		return nil
	}})
	p := start(t, toolpipe.Config{Hosts: []toolpipe.Host{{Name: "h", Client: client(t, serveHost(t, host))}},
		Guards: []toolpipe.Guard{func(ex *toolsv1.ToolExecution) string {
			if ex.GetArguments() == `{"forbidden":true}` {
				return "guarded"
			}
			return ""
		}}})
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	tests := []struct {
		name, tool, args string
		ctx              context.Context
		wantCode         string
		wantErr          bool
	}{
		{"ok", "echo", `{}`, t.Context(), "", false},
		{"unknown tool", "nope", `{}`, t.Context(), toolpipe.CodeUnknownTool, true},
		{"guard denies", "echo", `{"forbidden":true}`, t.Context(), "", true},
		{"cancelled before", "echo", `{}`, cancelled, toolpipe.CodeAbortedBeforeDispatch, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := run(tc.ctx, p, tc.tool, tc.args)
			if codeOf(r) != tc.wantCode || r.GetIsError() != tc.wantErr {
				t.Errorf("result %v, want code %q error %v", r, tc.wantCode, tc.wantErr)
			}
		})
	}
	t.Run("cancelled while running", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		ex := &toolsv1.ToolExecution{CallId: "h1", Name: "hang", Arguments: `{}`}
		c := p.Begin(ctx, nil, ex)
		done := make(chan struct{})
		go func() { c.Dispatch(ctx, nil); close(done) }()
		for len(host.Executed()) == 0 || host.Executed()[len(host.Executed())-1] != "h1" {
			time.Sleep(time.Millisecond)
		}
		cancel()
		<-done
		if r := c.Finish(ctx); codeOf(r) != toolpipe.CodeAborted {
			t.Errorf("result %v, want ABORTED", r)
		}
	})
	t.Run("checkpoint failure fails closed", func(t *testing.T) {
		before := len(host.Executed())
		ex := &toolsv1.ToolExecution{CallId: "k1", Name: "echo", Arguments: `{}`}
		c := p.Begin(t.Context(), nil, ex)
		c.Dispatch(t.Context(), func(context.Context) error { return errors.New("disk full") })
		if r := c.Finish(t.Context()); codeOf(r) != toolpipe.CodeCheckpointFailed || len(host.Executed()) != before {
			t.Errorf("result %v; the body must not run", r)
		}
	})
}

func TestHostDownAndDyingMidCall(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	host := fakes.NewToolHost(fakes.Tool{Name: "slow", Run: func(ctx context.Context, _ *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
		close(started)
		<-ctx.Done()
		return nil
	}})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	toolsv1.RegisterToolHostServer(gs, host)
	go gs.Serve(lis)
	p := start(t, toolpipe.Config{Hosts: []toolpipe.Host{{Name: "h", Client: client(t, lis.Addr().String())}}})
	res := make(chan *toolsv1.ToolExecutionResult)
	go func() { res <- run(t.Context(), p, "slow", `{}`) }()
	<-started
	gs.Stop() // the host dies mid-call
	if r := <-res; codeOf(r) != toolpipe.CodeHostUnavailable {
		t.Fatalf("mid-call death: %v", r)
	}
	// The host stays down: its last-known tools fail fast as unavailable.
	if r := run(t.Context(), p, "slow", `{}`); codeOf(r) != toolpipe.CodeHostUnavailable {
		t.Fatalf("host down: %v", r)
	}
}

func TestWatchToolsFollowsChanges(t *testing.T) {
	t.Parallel()
	host := fakes.NewToolHost(fakes.Tool{Name: "a"})
	p := start(t, toolpipe.Config{Hosts: []toolpipe.Host{{Name: "h", Client: client(t, serveHost(t, host))}}})
	host.SetTools(fakes.Tool{Name: "a"}, fakes.Tool{Name: "b"})
	deadline := time.Now().Add(10 * time.Second)
	for len(p.Schemas(nil)) != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("schemas %v", p.Schemas(nil))
		}
		time.Sleep(time.Millisecond)
	}
	if got := p.Schemas([]string{"other"}); len(got) != 0 {
		t.Errorf("a session restricted to another host sees %v", got)
	}
	// Unchanged tools: every step gets the same shared list.
	if a, b := p.Schemas(nil), p.Schemas([]string{}); &a[0] != &b[0] {
		t.Error("the schema list is rebuilt although no tool changed")
	}
	if got := p.Schemas([]string{"h"}); len(got) != 2 {
		t.Errorf("a session restricted to its host sees %v", got)
	}
	// A change invalidates the cached list.
	host.SetTools(fakes.Tool{Name: "c"})
	for got := p.Schemas(nil); len(got) != 1 || got[0].GetName() != "c"; got = p.Schemas(nil) {
		if time.Now().After(deadline) {
			t.Fatalf("schemas after the change %v", got)
		}
		time.Sleep(time.Millisecond)
	}
	if got := p.Schemas([]string{"h"}); len(got) != 1 || got[0].GetName() != "c" {
		t.Errorf("a cached host list survived the change: %v", got)
	}
}

type interceptor struct {
	toolsv1.UnimplementedToolInterceptorServer
	slow bool
}

func (i interceptor) PreExecute(ctx context.Context, req *toolsv1.PreExecuteRequest) (*toolsv1.PreExecuteResponse, error) {
	if i.slow {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if req.GetExecution().GetArguments() == `{"rm":true}` {
		return &toolsv1.PreExecuteResponse{Decision: &toolsv1.PreToolDecision{Kind: &toolsv1.PreToolDecision_Deny{Deny: &toolsv1.PreDeny{Reason: "no deleting"}}}}, nil
	}
	return &toolsv1.PreExecuteResponse{}, nil
}

func (i interceptor) PostExecute(_ context.Context, req *toolsv1.PostExecuteRequest) (*toolsv1.PostExecuteResponse, error) {
	if req.GetResult().GetIsError() {
		return &toolsv1.PostExecuteResponse{}, nil
	}
	return &toolsv1.PostExecuteResponse{Decision: &toolsv1.PostToolDecision{Kind: &toolsv1.PostToolDecision_Accept{Accept: &toolsv1.PostAccept{
		ReplaceContent: true, Content: []*llmv1.ContentBlock{fakes.TextContent("[redacted]")}}}}}, nil
}

func TestRemoteInterceptors(t *testing.T) {
	t.Parallel()
	hostAddr := serveHost(t, fakes.NewToolHost(fakes.Tool{Name: "echo"}))
	icClient := func(slow bool) toolsv1.ToolInterceptorClient {
		addr := fakes.Serve(t, func(s *grpc.Server) { toolsv1.RegisterToolInterceptorServer(s, interceptor{slow: slow}) })
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return toolsv1.NewToolInterceptorClient(conn)
	}
	policy := start(t, toolpipe.Config{Hosts: []toolpipe.Host{{Name: "h", Client: client(t, hostAddr)}},
		Interceptors: []toolpipe.Interceptor{{Name: "policy", Client: icClient(false), Timeout: time.Second}}})
	if r := run(t.Context(), policy, "echo", `{"rm":true}`); !r.GetIsError() || r.GetContent()[0].GetText().GetText() != "Error: no deleting" {
		t.Errorf("deny: %v", r)
	}
	if r := run(t.Context(), policy, "echo", `{}`); r.GetIsError() || r.GetContent()[0].GetText().GetText() != "[redacted]" {
		t.Errorf("accept with replacement: %v", r)
	}
	for _, failOpen := range []bool{true, false} {
		p := start(t, toolpipe.Config{Hosts: []toolpipe.Host{{Name: "h", Client: client(t, hostAddr)}},
			Interceptors: []toolpipe.Interceptor{{Name: "slow", Client: icClient(true), Timeout: 20 * time.Millisecond, FailOpen: failOpen}}})
		r := run(t.Context(), p, "echo", `{}`)
		if r.GetIsError() == failOpen {
			t.Errorf("failOpen=%v: %v", failOpen, r)
		}
	}
	// Local links run before remote ones.
	local := start(t, toolpipe.Config{Hosts: []toolpipe.Host{{Name: "h", Client: client(t, hostAddr)}}})
	local.Pre.Use(func(ctx context.Context, in *toolpipe.PreIn, next hooks.Next[*toolpipe.PreIn, *toolsv1.PreToolDecision]) (*toolsv1.PreToolDecision, error) {
		return &toolsv1.PreToolDecision{Kind: &toolsv1.PreToolDecision_Ask{Ask: &toolsv1.PreAsk{}}}, nil
	})
	if r := run(t.Context(), local, "echo", `{}`); !r.GetIsError() {
		t.Errorf("ask without an approval channel must deny: %v", r)
	}
}

// scriptedHost lists like a fake host but answers Execute (and the events
// of PrepareExecute) with a fixed message script per tool, to play a host
// that breaks the stream contract; on PrepareExecute the tool
// "prepared_again" answers a second prepared instead of events.
type scriptedHost struct {
	*fakes.ToolHost
	script map[string][]*toolsv1.ExecuteResponse
}

func (h *scriptedHost) Execute(req *toolsv1.ExecuteRequest, s grpc.ServerStreamingServer[toolsv1.ExecuteResponse]) error {
	for _, m := range h.script[req.GetExecution().GetName()] {
		if err := s.Send(m); err != nil {
			return err
		}
	}
	return nil
}

func (h *scriptedHost) PrepareExecute(s grpc.BidiStreamingServer[toolsv1.PrepareExecuteRequest, toolsv1.PrepareExecuteResponse]) error {
	m, err := s.Recv()
	if err != nil {
		return err
	}
	prepared := &toolsv1.PrepareExecuteResponse{Step: &toolsv1.PrepareExecuteResponse_Prepared{Prepared: &toolsv1.PrepareCallsResponse{
		Calls: []*toolsv1.PreparedCall{{CallId: m.GetPrepare().GetExecutions()[0].GetCallId()}}}}}
	if err := s.Send(prepared); err != nil {
		return err
	}
	if m, err = s.Recv(); err != nil { // the go-ahead; the close follows
		return err
	}
	name := m.GetExecute().GetExecution().GetName()
	if name == "prepared_again" {
		return s.Send(prepared)
	}
	for _, r := range h.script[name] {
		if err := s.Send(&toolsv1.PrepareExecuteResponse{Step: &toolsv1.PrepareExecuteResponse_Event{Event: r}}); err != nil {
			return err
		}
	}
	return nil
}

func TestMalformedHostStreamsFailTheCallNotTheHost(t *testing.T) {
	t.Parallel()
	result := func(blocks ...*llmv1.ContentBlock) *toolsv1.ExecuteResponse {
		return &toolsv1.ExecuteResponse{Event: &toolsv1.ExecuteResponse_Result{Result: &toolsv1.ToolExecutionResult{Content: blocks}}}
	}
	output := &toolsv1.ExecuteResponse{Event: &toolsv1.ExecuteResponse_Output{Output: &toolsv1.ToolOutput{Stream: "stdout", Text: "x"}}}
	script := map[string][]*toolsv1.ExecuteResponse{
		"good":       {output, result(fakes.TextContent("ok"))},
		"no_result":  {output},
		"two":        {result(fakes.TextContent("a")), result(fakes.TextContent("b"))},
		"bad_blocks": {result(&llmv1.ContentBlock{Block: &llmv1.ContentBlock_ToolCall{ToolCall: &llmv1.ToolCallBlock{Id: "x"}}})},
		"empty":      {{}},
	}
	tools := []fakes.Tool{{Name: "prepared_again"}}
	for name := range script {
		tools = append(tools, fakes.Tool{Name: name})
	}
	host := &scriptedHost{ToolHost: fakes.NewToolHost(tools...), script: script}
	addr := fakes.Serve(t, func(s *grpc.Server) { toolsv1.RegisterToolHostServer(s, host) })
	p := start(t, toolpipe.Config{Hosts: []toolpipe.Host{{Name: "h", Client: client(t, addr)}}})
	// Each call twice: with Execute (Begin alone) and on a PrepareExecute
	// stream (a batch of one prepared first).
	calls := []string{"no_result", "good", "two", "good", "bad_blocks", "empty", "good", "prepared_again", "good"}
	for i, name := range append(calls, calls...) {
		ex := &toolsv1.ToolExecution{CallId: fmt.Sprintf("c%d", i), Name: name, Arguments: `{}`, Context: &toolsv1.ToolContext{SessionId: "s", Cwd: "/w"}}
		if i >= len(calls) {
			p.PrepareCalls(t.Context(), nil, []*toolsv1.ToolExecution{ex})
		}
		c := p.Begin(t.Context(), nil, ex)
		c.Dispatch(t.Context(), nil)
		r := c.Finish(t.Context())
		if name == "good" {
			if r.GetIsError() || r.GetContent()[0].GetText().GetText() != "ok" {
				t.Errorf("good call after a malformed one: %v", r)
			}
			continue
		}
		if !r.GetIsError() || codeOf(r) != toolpipe.CodeHostProtocol {
			t.Errorf("%s: result %v, want a %s error result", name, r, toolpipe.CodeHostProtocol)
		}
		// Only the stream can carry a second prepared: proof the call ran
		// on it.
		if prepared := i >= len(calls); name == "prepared_again" && prepared != strings.Contains(r.GetContent()[0].GetText().GetText(), "carries neither output nor result") {
			t.Errorf("prepared_again (prepared: %v): %v", prepared, r)
		}
	}
}

// TestConfinedCallsNeedAnEnforcingHost: a confined call on a host that does
// not declare enforcement is refused with SANDBOX_UNAVAILABLE and never
// reaches the host, unless the deployment allows unenforced hosts.
func TestConfinedCallsNeedAnEnforcingHost(t *testing.T) {
	t.Parallel()
	ro := &toolsv1.SandboxPolicy{Mode: toolsv1.SandboxMode_SANDBOX_MODE_READ_ONLY}
	ww := &toolsv1.SandboxPolicy{Mode: toolsv1.SandboxMode_SANDBOX_MODE_WORKSPACE_WRITE}
	danger := &toolsv1.SandboxPolicy{Mode: toolsv1.SandboxMode_SANDBOX_MODE_DANGER_FULL_ACCESS}
	tests := []struct {
		name    string
		support toolsv1.SandboxSupport
		policy  *toolsv1.SandboxPolicy
		allow   bool
		refused bool
	}{
		{"enforcing host, workspace-write", toolsv1.SandboxSupport_SANDBOX_SUPPORT_ENFORCED, ww, false, false},
		{"unenforcing host, read-only", toolsv1.SandboxSupport_SANDBOX_SUPPORT_UNSPECIFIED, ro, false, true},
		{"unenforcing host, workspace-write", toolsv1.SandboxSupport_SANDBOX_SUPPORT_UNSPECIFIED, ww, false, true},
		{"unenforcing host, allowed", toolsv1.SandboxSupport_SANDBOX_SUPPORT_UNSPECIFIED, ww, true, false},
		{"unenforcing host, danger-full-access", toolsv1.SandboxSupport_SANDBOX_SUPPORT_UNSPECIFIED, danger, false, false},
		{"unenforcing host, no policy", toolsv1.SandboxSupport_SANDBOX_SUPPORT_UNSPECIFIED, nil, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			host := fakes.NewToolHost(fakes.Tool{Name: "echo"})
			host.Support = tc.support
			p := start(t, toolpipe.Config{Hosts: []toolpipe.Host{{Name: "h", Client: client(t, serveHost(t, host))}}, AllowUnenforced: tc.allow})
			ex := &toolsv1.ToolExecution{CallId: "c1", Name: "echo", Arguments: `{}`, Context: &toolsv1.ToolContext{SessionId: "s", Cwd: "/w", Sandbox: tc.policy}}
			c := p.Begin(t.Context(), nil, ex)
			c.Dispatch(t.Context(), nil)
			r := c.Finish(t.Context())
			refused := codeOf(r) == toolpipe.CodeSandboxUnavailable
			if refused != tc.refused || refused == (len(host.Executed()) == 1) {
				t.Errorf("result %v, executed %v; want refused=%v", r, host.Executed(), tc.refused)
			}
		})
	}
}

// oldHost is a host from before EndSession: the RPC is Unimplemented.
type oldHost struct {
	*fakes.ToolHost
}

func (oldHost) EndSession(context.Context, *toolsv1.EndSessionRequest) (*toolsv1.EndSessionResponse, error) {
	return (&toolsv1.UnimplementedToolHostServer{}).EndSession(nil, nil)
}

func TestEndSessionReachesEveryRemoteHost(t *testing.T) {
	a, b := fakes.NewToolHost(fakes.Tool{Name: "ta"}), fakes.NewToolHost(fakes.Tool{Name: "tb"})
	old := oldHost{fakes.NewToolHost(fakes.Tool{Name: "tc"})}
	oldAddr := fakes.Serve(t, func(s *grpc.Server) { toolsv1.RegisterToolHostServer(s, old) })
	p := start(t, toolpipe.Config{Hosts: []toolpipe.Host{
		{Name: "a", Client: client(t, serveHost(t, a))},
		{Name: "b", Client: client(t, serveHost(t, b))},
		{Name: "old", Client: client(t, oldAddr)},
	}})
	p.EndSession(t.Context(), "s1")
	p.EndSession(t.Context(), "s2")
	for name, h := range map[string]*fakes.ToolHost{"a": a, "b": b} {
		if got := h.Ended(); len(got) != 2 || got[0] != "s1" || got[1] != "s2" {
			t.Errorf("host %s ended %v, want [s1 s2]", name, got)
		}
	}
	if got := old.Ended(); len(got) != 0 {
		t.Errorf("old host recorded %v through an Unimplemented RPC", got)
	}
}

// TestHostHealth: a toolhost that does not answer at start is reported down
// (and its tools fail as TOOL_HOST_UNAVAILABLE naming it, not as unknown);
// once it serves it is up with its tools; when it dies its last-known tools
// stay listed and fail as unavailable naming the tool and the host; a name no
// host serves while every host is up is UNKNOWN_TOOL.
func TestHostHealth(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers until served
	if err != nil {
		t.Fatal(err)
	}
	type change struct {
		host string
		up   bool
	}
	changes := make(chan change, 16)
	p := start(t, toolpipe.Config{StartTimeout: 100 * time.Millisecond,
		Hosts:       []toolpipe.Host{{Name: "box", Client: client(t, lis.Addr().String())}},
		OnHostState: func(host string, up bool, _ error) { changes <- change{host, up} }})
	if c := <-changes; c != (change{"box", false}) {
		t.Fatalf("first state %v, want box down", c)
	}
	if h := p.Health(); len(h) != 1 || h[0].Up || h[0].Err == nil {
		t.Fatalf("health %+v, want box down with a reason", h)
	}
	r := run(t.Context(), p, "bash", `{}`)
	if codeOf(r) != toolpipe.CodeHostUnavailable || !strings.Contains(r.GetContent()[0].GetText().GetText(), `"box"`) {
		t.Fatalf("a tool of a host down at start: %v", r)
	}

	gs := grpc.NewServer()
	toolsv1.RegisterToolHostServer(gs, fakes.NewToolHost(fakes.Tool{Name: "bash"}))
	go gs.Serve(lis)
	if c := <-changes; c != (change{"box", true}) {
		t.Fatalf("after serving: %v, want box up", c)
	}
	if r := run(t.Context(), p, "bash", `{}`); r.GetError() != nil {
		t.Fatalf("host up: %v", r)
	}
	if r := run(t.Context(), p, "nope", `{}`); codeOf(r) != toolpipe.CodeUnknownTool {
		t.Fatalf("unknown tool with every host up: %v", r)
	}

	gs.Stop()
	if c := <-changes; c != (change{"box", false}) {
		t.Fatalf("after stopping: %v, want box down", c)
	}
	if got := p.Schemas(nil); len(got) != 1 || got[0].GetName() != "bash" {
		t.Fatalf("schemas of a host that is down: %v, want its last-known tools", got)
	}
	r = run(t.Context(), p, "bash", `{}`)
	if msg := r.GetContent()[0].GetText().GetText(); codeOf(r) != toolpipe.CodeHostUnavailable || !strings.Contains(msg, "the host of tool bash") || !strings.Contains(msg, `"box"`) {
		t.Fatalf("a last-known tool of a host that is down: %v", r)
	}
}

// The tool set is logged at start, host by host, so a --toolhost list that
// left out the built-in host shows which tools exist; a host that is down
// is listed as down with no tools. Progress reaches Config.Progress.
func TestToolSetLoggedAtStartAndProgress(t *testing.T) {
	t.Parallel()
	a := serveHost(t, fakes.NewToolHost(fakes.Tool{Name: "read"}, fakes.Tool{Name: "bash"}))
	output := &toolsv1.ExecuteResponse{Event: &toolsv1.ExecuteResponse_Output{Output: &toolsv1.ToolOutput{Stream: "stdout", Text: "live"}}}
	b := &scriptedHost{ToolHost: fakes.NewToolHost(fakes.Tool{Name: "mine"}), script: map[string][]*toolsv1.ExecuteResponse{
		"mine": {output, {Event: &toolsv1.ExecuteResponse_Result{Result: &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{fakes.TextContent("ok")}}}}},
	}}
	bAddr := fakes.Serve(t, func(s *grpc.Server) { toolsv1.RegisterToolHostServer(s, b) })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := lis.Addr().String()
	lis.Close()
	var logs strings.Builder
	var got []string
	p := start(t, toolpipe.Config{
		Hosts:        []toolpipe.Host{{Name: "builtin", Client: client(t, a)}, {Name: "mine", Client: client(t, bAddr)}, {Name: "gone", Client: client(t, down)}},
		StartTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}})),
		Progress: func(ex *toolsv1.ToolExecution, out *toolsv1.ToolOutput) {
			got = append(got, ex.GetName()+":"+out.GetText())
		},
	})
	for _, want := range []string{
		`msg="toolhost tools" toolhost=builtin in_process=false up=true count=2 tools=bash,read`,
		`msg="toolhost tools" toolhost=mine in_process=false up=true count=1 tools=mine`,
		`msg="toolhost tools" toolhost=gone in_process=false up=false count=0 tools=""`,
		`msg="tool set ready" hosts=3 tools=3`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %s:\n%s", want, logs.String())
		}
	}
	if r := run(t.Context(), p, "mine", `{}`); r.GetIsError() || len(got) != 1 || got[0] != "mine:live" {
		t.Errorf("result %v, progress %q", r, got)
	}
}

// keepingHost is an in-process host that returns the same result, which it
// keeps, on every call.
type keepingHost struct{ kept *toolsv1.ToolExecutionResult }

func (h *keepingHost) Tools() []*toolsv1.ToolDescriptor {
	return []*toolsv1.ToolDescriptor{{Schema: &llmv1.ToolSchema{Name: "kept", Parameters: `{"type":"object"}`}}}
}

func (h *keepingHost) Execute(context.Context, *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
	return h.kept
}

// TestFinishedResultIsTheCallers: the loop hands a finished result to the
// session log without a copy (loop.ToolCall), so nothing the pipeline, an
// in-process host or a post-execute link keeps may be part of it: each
// changes what it kept after Finish, and the result stays as finished.
func TestFinishedResultIsTheCallers(t *testing.T) {
	t.Parallel()
	remote := serveHost(t, fakes.NewToolHost(fakes.Tool{Name: "echo"}))
	tests := []struct {
		name   string
		tool   string
		link   func(kept []*llmv1.ContentBlock) hooks.Link[*toolpipe.PostIn, *toolsv1.PostToolDecision]
		change func(host *keepingHost, kept []*llmv1.ContentBlock)
		want   string
	}{
		{name: "local host", tool: "kept", want: "host's",
			change: func(h *keepingHost, _ []*llmv1.ContentBlock) { h.kept.Content[0].GetText().Text = "changed" }},
		{name: "local host, its content slice", tool: "kept", want: "host's",
			change: func(h *keepingHost, _ []*llmv1.ContentBlock) { h.kept.Content[0] = fakes.TextContent("changed") }},
		{name: "post-execute replacement", tool: "echo", want: "link's",
			link: func(kept []*llmv1.ContentBlock) hooks.Link[*toolpipe.PostIn, *toolsv1.PostToolDecision] {
				return func(context.Context, *toolpipe.PostIn, hooks.Next[*toolpipe.PostIn, *toolsv1.PostToolDecision]) (*toolsv1.PostToolDecision, error) {
					return &toolsv1.PostToolDecision{Kind: &toolsv1.PostToolDecision_Accept{Accept: &toolsv1.PostAccept{ReplaceContent: true, Content: kept}}}, nil
				}
			},
			change: func(_ *keepingHost, kept []*llmv1.ContentBlock) { kept[0].GetText().Text = "changed" }},
		{name: "post-execute block", tool: "echo", want: "link's",
			link: func(kept []*llmv1.ContentBlock) hooks.Link[*toolpipe.PostIn, *toolsv1.PostToolDecision] {
				return func(context.Context, *toolpipe.PostIn, hooks.Next[*toolpipe.PostIn, *toolsv1.PostToolDecision]) (*toolsv1.PostToolDecision, error) {
					return &toolsv1.PostToolDecision{Kind: &toolsv1.PostToolDecision_Block{Block: &toolsv1.PostBlock{Feedback: kept}}}, nil
				}
			},
			change: func(_ *keepingHost, kept []*llmv1.ContentBlock) { kept[0].GetText().Text = "changed" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			host := &keepingHost{kept: &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{fakes.TextContent("host's")}}}
			kept := []*llmv1.ContentBlock{fakes.TextContent("link's")}
			p := start(t, toolpipe.Config{Hosts: []toolpipe.Host{{Name: "local", Local: host}, {Name: "r", Client: client(t, remote)}}})
			if tt.link != nil {
				p.Post.Use(tt.link(kept))
			}
			r := run(t.Context(), p, tt.tool, `{}`)
			if got := r.GetContent()[0].GetText().GetText(); got != tt.want {
				t.Fatalf("finished result %q, want %q", got, tt.want)
			}
			tt.change(host, kept)
			if got := r.GetContent()[0].GetText().GetText(); got != tt.want {
				t.Errorf("after the keeper's change the finished result reads %q, want %q", got, tt.want)
			}
		})
	}
}

// TestPrepareExecute: a batch of one call is prepared and executed on one
// PrepareExecute stream, and every way a call ends without dispatch ends
// the stream with the body never run; a host that refuses PrepareExecute
// is asked once, then gets PrepareCalls and Execute, with the same results.
func TestPrepareExecute(t *testing.T) {
	t.Parallel()
	type step func(t *testing.T, p *toolpipe.Pipeline, host *fakes.ToolHost, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult
	dispatch := func(ctx context.Context, p *toolpipe.Pipeline, ex *toolsv1.ToolExecution, checkpoint func(context.Context) error) *toolsv1.ToolExecutionResult {
		c := p.Begin(ctx, nil, ex)
		c.Dispatch(ctx, checkpoint)
		return c.Finish(ctx)
	}
	cases := []struct {
		name, tool, args string
		ran              bool
		code             string
		run              step
	}{
		{"dispatched", "echo", `{}`, true, "", func(t *testing.T, p *toolpipe.Pipeline, _ *fakes.ToolHost, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
			return dispatch(t.Context(), p, ex, func(context.Context) error { return nil })
		}},
		{"denied by a guard", "echo", `{"forbidden":true}`, false, "", func(t *testing.T, p *toolpipe.Pipeline, _ *fakes.ToolHost, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
			return dispatch(t.Context(), p, ex, nil)
		}},
		{"checkpoint failed", "echo", `{}`, false, toolpipe.CodeCheckpointFailed, func(t *testing.T, p *toolpipe.Pipeline, _ *fakes.ToolHost, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
			return dispatch(t.Context(), p, ex, func(context.Context) error { return errors.New("disk full") })
		}},
		{"cancelled before dispatch", "echo", `{}`, false, toolpipe.CodeAbortedBeforeDispatch, func(t *testing.T, p *toolpipe.Pipeline, _ *fakes.ToolHost, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
			ctx, cancel := context.WithCancel(t.Context())
			c := p.Begin(ctx, nil, ex)
			cancel()
			c.Dispatch(ctx, nil)
			return c.Finish(ctx)
		}},
		{"finished without dispatch", "echo", `{}`, false, toolpipe.CodeAbortedBeforeDispatch, func(t *testing.T, p *toolpipe.Pipeline, _ *fakes.ToolHost, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
			return p.Begin(t.Context(), nil, ex).Finish(t.Context())
		}},
		{"never begun", "echo", `{}`, false, "", func(t *testing.T, p *toolpipe.Pipeline, _ *fakes.ToolHost, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
			p.Release([]*toolsv1.ToolExecution{ex})
			return nil
		}},
		{"cancelled while running", "hang", `{}`, true, toolpipe.CodeAborted, func(t *testing.T, p *toolpipe.Pipeline, host *fakes.ToolHost, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			c := p.Begin(ctx, nil, ex)
			done := make(chan struct{})
			go func() { c.Dispatch(ctx, nil); close(done) }()
			for deadline := time.Now().Add(10 * time.Second); !slices.Contains(host.Executed(), ex.GetCallId()); time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the body never started")
				}
			}
			cancel()
			<-done
			return c.Finish(ctx)
		}},
	}
	results := map[bool][]*toolsv1.ToolExecutionResult{}
	for _, refuse := range []bool{false, true} {
		host := fakes.NewToolHost(fakes.Tool{Name: "echo"}, fakes.Tool{Name: "hang", Run: func(ctx context.Context, _ *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
			<-ctx.Done()
			return nil
		}})
		if refuse {
			host.RefusePrepareExecute()
		}
		p := start(t, toolpipe.Config{Hosts: []toolpipe.Host{{Name: "h", Client: client(t, serveHost(t, host))}},
			Guards: []toolpipe.Guard{func(ex *toolsv1.ToolExecution) string {
				if ex.GetArguments() == `{"forbidden":true}` {
					return "guarded"
				}
				return ""
			}}})
		for i, tc := range cases {
			ex := &toolsv1.ToolExecution{CallId: fmt.Sprintf("c%d", i), Name: tc.tool, Arguments: tc.args, Context: &toolsv1.ToolContext{SessionId: "s", Cwd: "/w"}}
			p.PrepareCalls(t.Context(), nil, []*toolsv1.ToolExecution{ex})
			r := tc.run(t, p, host, ex)
			results[refuse] = append(results[refuse], r)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			if err := host.WaitStreamsEnded(ctx); err != nil {
				t.Errorf("refuse=%v %s: %v", refuse, tc.name, err)
			}
			cancel()
			if ran := slices.Contains(host.Executed(), ex.GetCallId()); ran != tc.ran {
				t.Errorf("refuse=%v %s: the body ran: %v, want %v", refuse, tc.name, ran, tc.ran)
			}
			if r != nil && codeOf(r) != tc.code {
				t.Errorf("refuse=%v %s: result %v, want code %q", refuse, tc.name, r, tc.code)
			}
		}
		n := host.Counts()
		switch want := len(cases); {
		case !refuse && (n.PrepareExecute != want || n.PrepareCalls != 0 || n.Execute != 0):
			t.Errorf("host serving PrepareExecute answered %+v; want %d PrepareExecute and nothing else", n, want)
		case refuse && (n.PrepareExecute != 1 || n.PrepareCalls != want || n.Execute != 2):
			t.Errorf("host refusing PrepareExecute answered %+v; want 1 PrepareExecute (remembered), %d PrepareCalls, 2 Execute", n, want)
		}
	}
	for i, tc := range cases {
		if a, b := results[false][i], results[true][i]; !proto.Equal(a, b) {
			t.Errorf("%s: result through PrepareExecute %v, through PrepareCalls and Execute %v", tc.name, a, b)
		}
	}
}

// silentHost never answers a prepare.
type silentHost struct{ *fakes.ToolHost }

func (silentHost) PrepareExecute(s grpc.BidiStreamingServer[toolsv1.PrepareExecuteRequest, toolsv1.PrepareExecuteResponse]) error {
	<-s.Context().Done()
	return s.Context().Err()
}

// TestPrepareExecuteTimesOutAsPrepareCalls: a host that does not answer
// the prepare in StartTimeout is a failed PrepareCalls (the descriptor's
// mode, no view), and the call then runs with Execute.
func TestPrepareExecuteTimesOutAsPrepareCalls(t *testing.T) {
	t.Parallel()
	host := silentHost{fakes.NewToolHost(fakes.Tool{Name: "echo", View: func(*toolsv1.ToolExecution) *toolsv1.ToolCallView {
		return &toolsv1.ToolCallView{Card: &toolsv1.ToolCallView_Generic{Generic: &toolsv1.GenericCallView{Title: "echo"}}}
	}})}
	addr := fakes.Serve(t, func(s *grpc.Server) { toolsv1.RegisterToolHostServer(s, host) })
	p := start(t, toolpipe.Config{Hosts: []toolpipe.Host{{Name: "h", Client: client(t, addr)}}, StartTimeout: 300 * time.Millisecond})
	ex := &toolsv1.ToolExecution{CallId: "c1", Name: "echo", Arguments: `{}`, Context: &toolsv1.ToolContext{SessionId: "s", Cwd: "/w"}}
	pcs := p.PrepareCalls(t.Context(), nil, []*toolsv1.ToolExecution{ex})
	if len(pcs) != 1 || pcs[0].GetView() != nil || pcs[0].GetMode() != toolsv1.ExecutionMode_EXECUTION_MODE_EXCLUSIVE {
		t.Fatalf("prepared %v; want exclusive without a view", pcs)
	}
	c := p.Begin(t.Context(), nil, ex)
	c.Dispatch(t.Context(), nil)
	if r := c.Finish(t.Context()); r.GetIsError() || host.Counts().Execute != 1 {
		t.Fatalf("result %v after %+v; want the call run with Execute", r, host.Counts())
	}
}

// waitingGate asks a person about every call: before it waits it calls
// waiting, and then waits (bounded) until its host holds no PrepareExecute
// stream, as a gate would wait hours for a person's answer.
type waitingGate struct {
	host   *fakes.ToolHost
	waited chan error
}

func (g waitingGate) Approve(ctx context.Context, _ *toolsv1.ToolExecution, _ *toolsv1.PreAsk, _ string, waiting func()) (bool, string) {
	if waiting != nil {
		waiting()
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	g.waited <- g.host.WaitStreamsEnded(wctx)
	return true, ""
}

// TestApprovalWaitHoldsNoPreparedStream: a one-call batch whose call asks
// a person holds no PrepareExecute stream on its host while the person
// decides (a host's graceful stop would wait for it), and runs with Execute
// once approved.
func TestApprovalWaitHoldsNoPreparedStream(t *testing.T) {
	t.Parallel()
	host := fakes.NewToolHost(fakes.Tool{Name: "echo"})
	gate := waitingGate{host: host, waited: make(chan error, 1)}
	p := start(t, toolpipe.Config{Hosts: []toolpipe.Host{{Name: "h", Client: client(t, serveHost(t, host))}},
		Gates: func(string) toolpipe.Gate { return gate }})
	ex := &toolsv1.ToolExecution{CallId: "c1", Name: "echo", Arguments: `{}`, Context: &toolsv1.ToolContext{SessionId: "s", Cwd: "/w"}}
	p.PrepareCalls(t.Context(), nil, []*toolsv1.ToolExecution{ex})
	if n := host.Counts(); n.PrepareExecute != 1 {
		t.Fatalf("host answered %+v; want the call prepared on a PrepareExecute stream", n)
	}
	c := p.Begin(t.Context(), nil, ex)
	if err := <-gate.waited; err != nil {
		t.Errorf("while the approval waited: %v", err)
	}
	c.Dispatch(t.Context(), nil)
	if r := c.Finish(t.Context()); r.GetIsError() || !slices.Contains(host.Executed(), "c1") || host.Counts().Execute != 1 {
		t.Errorf("result %v after %+v; want the approved call run with Execute", r, host.Counts())
	}
}

// TestLocalHostWithoutAResult: an in-process host that returns no result
// (against its contract) fails the call as aborted before dispatch, as
// Finish makes any call without a result; it never reaches for the remote
// client the local host does not have.
func TestLocalHostWithoutAResult(t *testing.T) {
	t.Parallel()
	p := start(t, toolpipe.Config{Hosts: []toolpipe.Host{{Name: "local", Local: &keepingHost{}}}})
	if r := run(t.Context(), p, "kept", `{}`); codeOf(r) != toolpipe.CodeAbortedBeforeDispatch {
		t.Errorf("result %v, want %s", r, toolpipe.CodeAbortedBeforeDispatch)
	}
}

package toolsdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// HostConfig configures a Host. The zero value is usable.
type HostConfig struct {
	// Logger receives tool panics and internal failures; nil discards.
	Logger *slog.Logger
	// MaxArgumentBytes bounds the raw argument text of one call; larger
	// calls are refused with INVALID_ARGUMENT. Zero means 1 MiB.
	MaxArgumentBytes int
	// DefaultTimeout is the budget of tools that declare none. Zero means
	// two minutes.
	DefaultTimeout time.Duration
	// CheckContext, when set, vets every call's ToolContext after the
	// built-in checks; an error refuses the call with INVALID_ARGUMENT.
	CheckContext func(*toolsv1.ToolContext) error
	// VetContext, when set, vets every call's ToolContext like
	// CheckContext (after it) and returns what it found, which the call
	// then carries as Call.Vetted: a host that resolves something to
	// check it (a workspace root) confines the call to that very answer
	// instead of resolving it again. An error refuses the call with
	// INVALID_ARGUMENT.
	VetContext func(*toolsv1.ToolContext) (any, error)
	// ServerOptions are added to the gRPC server Serve builds: TLS
	// credentials and the peer check (internal/auth.ServerFlags).
	ServerOptions []grpc.ServerOption
	// SandboxSupport is declared in ListTools and WatchTools: ENFORCED
	// only when the host's tools confine every call to its
	// ToolContext.sandbox policy. The zero value says they do not, and an
	// agent then refuses confined sessions on this host unless told to
	// allow unenforced hosts.
	SandboxSupport toolsv1.SandboxSupport
	// SandboxSupportFunc, when set, replaces SandboxSupport and is asked at
	// each ListTools and WatchTools: a host whose support is still being
	// probed answers when it is known instead of holding up its start.
	SandboxSupportFunc func() toolsv1.SandboxSupport
	// WorkspaceContext answers GetWorkspaceContext for a host that owns a
	// workspace; the cwd it sees is absolute and clean. It never sees the
	// request's workspace_root: a host that reads within a session's own
	// root sets WorkspaceContextWithin instead, which wins when both are
	// set. A returned gRPC status error is passed through, any other
	// error is INTERNAL. Both nil: the host owns no workspace and answers
	// an empty context.
	WorkspaceContext func(ctx context.Context, cwd string) (*toolsv1.GetWorkspaceContextResponse, error)
	// WorkspaceContextWithin is WorkspaceContext with the request's
	// workspace_root, absolute and clean: the session's own root when the
	// request names one (the context must then be read within it, so that
	// a session cannot read another's files through its context), else
	// empty (the host's root).
	WorkspaceContextWithin func(ctx context.Context, cwd, workspaceRoot string) (*toolsv1.GetWorkspaceContextResponse, error)
	// EndSession, when set, releases what the host's tools hold for a
	// session that has left the agent (background tasks above all) and
	// returns how many tasks it stopped. Nil makes EndSession a no-op.
	EndSession func(ctx context.Context, sessionID string) (int, error)
}

// Host serves a live set of tools as the dsh.tools.v1.ToolHost gRPC service.
// Tools may be added and removed while it serves; every change bumps the
// revision and reaches WatchTools subscribers as a fresh snapshot.
//
// # Delivery
//
// Execute streams zero or more ToolOutput messages, then exactly one
// ToolExecutionResult, unless the request itself is malformed (a gRPC
// INVALID_ARGUMENT status and no messages) or the caller went away. Tool
// failures of every kind (unknown tool, invalid arguments, a body error, a
// panic, a timeout) are results with is_error set, never RPC errors.
// PrepareExecute delivers PrepareCalls' answer and then exactly Execute's
// messages on one stream.
type Host struct {
	toolsv1.UnimplementedToolHostServer
	cfg HostConfig
	log *slog.Logger

	mu      sync.RWMutex
	tools   map[string]Tool
	order   []string // registration order
	rev     int64
	changed chan struct{} // closed and replaced on every change

	stopOnce sync.Once
	stopped  chan struct{} // closed by StopWatches
}

var _ toolsv1.ToolHostServer = (*Host)(nil)

// NewHost returns a host serving tools. Duplicate names are an error.
func NewHost(cfg HostConfig, tools ...Tool) (*Host, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxArgumentBytes <= 0 {
		cfg.MaxArgumentBytes = defaultMaxArgumentBytes
	}
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = defaultHostTimeout
	}
	h := &Host{cfg: cfg, log: cfg.Logger, tools: map[string]Tool{}, changed: make(chan struct{}), stopped: make(chan struct{})}
	if err := h.Add(tools...); err != nil {
		return nil, err
	}
	return h, nil
}

// Register registers the host on a gRPC server.
func (h *Host) Register(gs grpc.ServiceRegistrar) { toolsv1.RegisterToolHostServer(gs, h) }

// Add registers tools atomically: if any name is taken (or repeated), none
// is added.
func (h *Host) Add(tools ...Tool) error {
	if len(tools) == 0 {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[string]bool{}
	for _, t := range tools {
		name := t.Descriptor().GetSchema().GetName()
		if _, dup := h.tools[name]; dup || seen[name] {
			return fmt.Errorf("tool %q is already registered", name)
		}
		seen[name] = true
	}
	for _, t := range tools {
		name := t.Descriptor().GetSchema().GetName()
		h.tools[name] = t
		h.order = append(h.order, name)
	}
	h.bumpLocked()
	return nil
}

// Remove unregisters the named tools and reports how many it removed.
// Calls already running finish normally.
func (h *Host) Remove(names ...string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, name := range names {
		if _, ok := h.tools[name]; ok {
			delete(h.tools, name)
			h.order = slices.DeleteFunc(h.order, func(s string) bool { return s == name })
			n++
		}
	}
	if n > 0 {
		h.bumpLocked()
	}
	return n
}

func (h *Host) bumpLocked() {
	h.rev++
	close(h.changed)
	h.changed = make(chan struct{})
}

// Tool returns a registered tool.
func (h *Host) Tool(name string) (Tool, bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	t, ok := h.tools[name]
	return t, ok
}

func (h *Host) snapshot() ([]*toolsv1.ToolDescriptor, int64, <-chan struct{}) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]*toolsv1.ToolDescriptor, 0, len(h.order))
	for _, name := range h.order {
		d := h.tools[name].Descriptor()
		if d.GetTimeoutMs() == 0 {
			d = cloneDescriptor(d)
			d.TimeoutMs = h.cfg.DefaultTimeout.Milliseconds()
		}
		out = append(out, d)
	}
	return out, h.rev, h.changed
}

func cloneDescriptor(d *toolsv1.ToolDescriptor) *toolsv1.ToolDescriptor {
	return &toolsv1.ToolDescriptor{Schema: d.GetSchema(), Concurrency: d.GetConcurrency(), TimeoutMs: d.GetTimeoutMs(), ValidatesArguments: d.GetValidatesArguments()}
}

func (h *Host) sandboxSupport() toolsv1.SandboxSupport {
	if h.cfg.SandboxSupportFunc != nil {
		return h.cfg.SandboxSupportFunc()
	}
	return h.cfg.SandboxSupport
}

// ListTools returns the current tool set and its revision.
func (h *Host) ListTools(context.Context, *toolsv1.ListToolsRequest) (*toolsv1.ListToolsResponse, error) {
	tools, rev, _ := h.snapshot()
	return &toolsv1.ListToolsResponse{Tools: tools, Revision: rev, SandboxSupport: h.sandboxSupport()}, nil
}

// WatchTools sends a snapshot now and after every change. Changes that land
// while a send is in flight coalesce into the next snapshot.
func (h *Host) WatchTools(_ *toolsv1.WatchToolsRequest, stream grpc.ServerStreamingServer[toolsv1.WatchToolsResponse]) error {
	ctx := stream.Context()
	for {
		tools, rev, changed := h.snapshot()
		if err := stream.Send(&toolsv1.WatchToolsResponse{Tools: tools, Revision: rev, SandboxSupport: h.sandboxSupport()}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil
		case <-h.stopped:
			return nil
		}
	}
}

// StopWatches ends every WatchTools stream (now and later), so a graceful
// server stop does not wait for subscribers that never hang up. Call it when
// shutdown begins; Host.Serve does.
func (h *Host) StopWatches() { h.stopOnce.Do(func() { close(h.stopped) }) }

// PrepareCalls classifies each call and computes its pending card. Unknown
// tools and malformed arguments are exclusive with no card.
func (h *Host) PrepareCalls(_ context.Context, req *toolsv1.PrepareCallsRequest) (*toolsv1.PrepareCallsResponse, error) {
	out := &toolsv1.PrepareCallsResponse{Calls: make([]*toolsv1.PreparedCall, 0, len(req.GetExecutions()))}
	for _, ex := range req.GetExecutions() {
		pc := &toolsv1.PreparedCall{CallId: ex.GetCallId(), Mode: toolsv1.ExecutionMode_EXECUTION_MODE_EXCLUSIVE}
		if t, ok := h.Tool(ex.GetName()); ok && len(ex.GetArguments()) <= h.cfg.MaxArgumentBytes {
			pc.Mode = t.Mode(ex.GetArguments())
			pc.View = t.PresentCall(ex.GetArguments())
		}
		out.Calls = append(out.Calls, pc)
	}
	return out, nil
}

// liveOutputQueue bounds the live output waiting for a slow caller; chunks
// beyond it are dropped (the result still carries the output), so a caller
// that stops reading never stalls the tool.
const liveOutputQueue = 256

// Execute runs one call and streams its output and result.
func (h *Host) Execute(req *toolsv1.ExecuteRequest, stream grpc.ServerStreamingServer[toolsv1.ExecuteResponse]) error {
	return h.execute(stream.Context(), req.GetExecution(), stream)
}

// PrepareExecute is PrepareCalls for one call and then that call's Execute
// on one stream: prepare (exactly one execution) → prepared → execute and
// the client's close → Execute's messages. It runs PrepareCalls and Execute
// themselves (ServePrepareExecute); the body runs only once the execute
// message and the close of the client's send side have arrived, so a
// client that closes after prepared, or cancels, never runs it.
func (h *Host) PrepareExecute(stream grpc.BidiStreamingServer[toolsv1.PrepareExecuteRequest, toolsv1.PrepareExecuteResponse]) error {
	return ServePrepareExecute(stream, h.PrepareCalls, func(ctx context.Context, req *toolsv1.ExecuteRequest, send ExecuteSender) error {
		return h.execute(ctx, req.GetExecution(), send)
	})
}

// execute is Execute's body: it checks ex, runs it under ctx and sends its
// live output and then its result through out (never concurrently). out is
// an interface, not a method value, so Execute's stream does not escape.
func (h *Host) execute(ctx context.Context, ex *toolsv1.ToolExecution, out ExecuteSender) error {
	vetted, err := h.checkExecution(ex)
	if err != nil {
		return toStatus(err)
	}
	var (
		mu      sync.Mutex
		done    bool
		queue   chan *toolsv1.ToolOutput
		sent    chan struct{}
		dropped int
	)
	output := func(s, text string) {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return
		}
		if queue == nil {
			queue, sent = make(chan *toolsv1.ToolOutput, liveOutputQueue), make(chan struct{})
			go func() {
				defer close(sent)
				for o := range queue {
					_ = out.Send(&toolsv1.ExecuteResponse{Event: &toolsv1.ExecuteResponse_Output{Output: o}})
				}
			}()
		}
		select {
		case queue <- &toolsv1.ToolOutput{Stream: s, Text: text}:
		default:
			dropped++
		}
	}
	res := h.run(ctx, ex, output, vetted)
	mu.Lock()
	done = true
	if queue != nil {
		close(queue)
	}
	mu.Unlock()
	if sent != nil {
		<-sent
	}
	if dropped > 0 {
		h.log.Debug("dropped live output for a slow caller", "tool", ex.GetName(), "call_id", ex.GetCallId(), "chunks", dropped)
	}
	return out.Send(&toolsv1.ExecuteResponse{Event: &toolsv1.ExecuteResponse_Result{Result: res}})
}

// requestError is a malformed Execute request (INVALID_ARGUMENT).
type requestError struct{ msg string }

func (e *requestError) Error() string { return e.msg }

func (h *Host) checkExecution(ex *toolsv1.ToolExecution) (vetted any, err error) {
	tc := ex.GetContext()
	switch {
	case ex == nil:
		return nil, &requestError{"execution is required"}
	case ex.GetName() == "":
		return nil, &requestError{"execution.name is required"}
	case tc.GetCwd() == "":
		return nil, &requestError{"execution.context.cwd is required: send the session's absolute working directory"}
	case !filepath.IsAbs(tc.GetCwd()):
		return nil, &requestError{fmt.Sprintf("execution.context.cwd %q must be an absolute path", tc.GetCwd())}
	case tc.GetWorkspaceRoot() != "" && !filepath.IsAbs(tc.GetWorkspaceRoot()):
		return nil, &requestError{fmt.Sprintf("execution.context.workspace_root %q must be an absolute path", tc.GetWorkspaceRoot())}
	case len(ex.GetArguments()) > h.cfg.MaxArgumentBytes:
		return nil, &requestError{fmt.Sprintf("execution.arguments is %d bytes, over this host's limit of %d bytes", len(ex.GetArguments()), h.cfg.MaxArgumentBytes)}
	}
	if h.cfg.CheckContext != nil {
		if err := h.cfg.CheckContext(tc); err != nil {
			return nil, &requestError{err.Error()}
		}
	}
	if h.cfg.VetContext != nil {
		if vetted, err = h.cfg.VetContext(tc); err != nil {
			return nil, &requestError{err.Error()}
		}
	}
	return vetted, nil
}

var errTimeout = errors.New("tool timeout")

// Run executes one call in process, without the request checks of Execute:
// the same unknown-tool, validation, panic, timeout and presentation
// handling, returning exactly one result. output receives live output and
// may be nil.
func (h *Host) Run(ctx context.Context, ex *toolsv1.ToolExecution, output func(stream, text string)) *toolsv1.ToolExecutionResult {
	return h.run(ctx, ex, output, nil)
}

// run is Run with the call's Vetted value (Execute's VetContext answer).
func (h *Host) run(ctx context.Context, ex *toolsv1.ToolExecution, output func(stream, text string), vetted any) *toolsv1.ToolExecutionResult {
	t, ok := h.Tool(ex.GetName())
	if !ok {
		return errorResult(NewError("ToolNotFoundError", CodeUnknownTool, fmt.Sprintf("unknown tool %q", ex.GetName()), nil))
	}
	timeout := time.Duration(t.Descriptor().GetTimeoutMs()) * time.Millisecond
	if timeout <= 0 {
		timeout = h.cfg.DefaultTimeout
	}
	call := NewCall(ex, output)
	call.Vetted = vetted
	runCtx, cancel := context.WithTimeoutCause(ctx, timeout, errTimeout)
	defer cancel()
	r, present, err := h.invoke(runCtx, t, call)
	var res *toolsv1.ToolExecutionResult
	switch {
	case err != nil && errors.Is(context.Cause(runCtx), errTimeout) && ctx.Err() == nil:
		res = errorResult(NewError("TimeoutError", CodeToolTimeout, fmt.Sprintf("tool %s timed out after %dms", call.Name, timeout.Milliseconds()), err))
	case ctx.Err() != nil && !isTyped(err):
		res = errorResult(NewError(abortErrorName, CodeAborted, "tool call aborted", ctx.Err()))
	case err != nil:
		res = errorResult(err)
	default:
		res, err = h.buildResult(r)
		if err != nil {
			res = errorResult(NewError(defaultErrorName, CodeInvalidResult, err.Error(), err))
		}
	}
	switch {
	case r.View != nil && !res.GetIsError():
		res.View = r.View
	case present != nil:
		res.View = present(res)
	default:
		res.View = t.PresentResult(ex.GetArguments(), res)
	}
	return res
}

func isTyped(err error) bool {
	var c interface{ Code() string }
	return errors.As(err, &c)
}

func (h *Host) invoke(ctx context.Context, t Tool, call *Call) (r Result, present func(*toolsv1.ToolExecutionResult) *toolsv1.ToolResultView, err error) {
	defer func() {
		if v := recover(); v != nil {
			h.log.Error("tool panicked", "tool", call.Name, "call_id", call.ID, "panic", v, "stack", string(debug.Stack()))
			r, err = Result{}, NewError("ToolPanicError", CodeToolPanic, fmt.Sprintf("tool %s crashed: %v", call.Name, v), nil)
		}
	}()
	if pt, ok := t.(presentingTool); ok {
		return pt.runPresent(ctx, call)
	}
	r, err = t.Run(ctx, call)
	return r, nil, err
}

func (h *Host) buildResult(r Result) (*toolsv1.ToolExecutionResult, error) {
	res := &toolsv1.ToolExecutionResult{Content: r.Content, AdditionalContexts: r.Contexts, Enforcement: r.Enforcement}
	if res.Content == nil {
		res.Content = []*llmv1.ContentBlock{}
	}
	if r.Meta != nil {
		var b []byte
		switch m := r.Meta.(type) {
		case json.RawMessage:
			b = m
		default:
			var err error
			if b, err = json.Marshal(m); err != nil {
				return nil, fmt.Errorf("tool meta is not JSON: %w", err)
			}
		}
		if !json.Valid(b) {
			return nil, errors.New("tool meta is not valid JSON")
		}
		s := string(b)
		res.Meta = &s
	}
	return res, nil
}

// errorResult renders a failure as the model sees it: "Error: <message>",
// is_error, and {name, code} when the error is typed.
func errorResult(err error) *toolsv1.ToolExecutionResult {
	res := &toolsv1.ToolExecutionResult{
		Content: []*llmv1.ContentBlock{TextBlock("Error: " + err.Error())},
		IsError: true,
	}
	var coded interface{ Code() string }
	if errors.As(err, &coded) {
		name := defaultErrorName
		var named interface{ ErrorName() string }
		if errors.As(err, &named) {
			name = named.ErrorName()
		}
		res.Error = &toolsv1.ToolErrorInfo{Name: name, Code: coded.Code()}
	}
	return res
}

// ErrorResult is the result a failure becomes; exported for interceptors and
// in-process callers that need the same rendering.
func ErrorResult(err error) *toolsv1.ToolExecutionResult { return errorResult(err) }

// EndSession releases what the host holds for a session (HostConfig.EndSession);
// it is idempotent, and a session the host never saw is not an error.
func (h *Host) EndSession(ctx context.Context, req *toolsv1.EndSessionRequest) (*toolsv1.EndSessionResponse, error) {
	if req.GetSessionId() == "" {
		return nil, status.Error(codes.InvalidArgument, "session_id is required")
	}
	if h.cfg.EndSession == nil {
		return &toolsv1.EndSessionResponse{}, nil
	}
	n, err := h.cfg.EndSession(ctx, req.GetSessionId())
	if err != nil {
		return nil, status.Errorf(codes.Internal, "end session %s: %v", req.GetSessionId(), err)
	}
	return &toolsv1.EndSessionResponse{TasksStopped: int32(n)}, nil
}

package fakes

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

// Tool is one fake tool.
type Tool struct {
	Name string
	// Parallel makes every call parallel-safe.
	Parallel bool
	// Run executes a call; nil echoes the arguments.
	Run func(ctx context.Context, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult
	// View, when set, is the call view PrepareCalls answers.
	View func(ex *toolsv1.ToolExecution) *toolsv1.ToolCallView
}

// ToolHost is a fake ToolHost serving Go funcs.
type ToolHost struct {
	toolsv1.UnimplementedToolHostServer

	mu       sync.Mutex
	tools    map[string]Tool
	revision int64
	changed  chan struct{}
	executed []string
	// Support is the sandbox support the host declares.
	Support          toolsv1.SandboxSupport
	ended            []string
	noPrepareExecute bool // RefusePrepareExecute

	rpcs     RPCs
	open     int           // PrepareExecute handlers running
	openDone chan struct{} // closed and replaced whenever open changes
}

// RefusePrepareExecute makes PrepareExecute answer UNIMPLEMENTED from now
// on, as a host that predates it does.
func (h *ToolHost) RefusePrepareExecute() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.noPrepareExecute = true
}

// RPCs counts the calls a ToolHost answered: Execute counts Execute RPCs
// only (a body PrepareExecute runs is in Executed).
type RPCs struct {
	PrepareCalls, Execute, PrepareExecute int
}

// Counts returns how many calls of each RPC the host answered
// (PrepareExecute counts the refused ones too).
func (h *ToolHost) Counts() RPCs {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rpcs
}

// WaitStreamsEnded blocks until no PrepareExecute handler is running, or
// ctx ends.
func (h *ToolHost) WaitStreamsEnded(ctx context.Context) error {
	for {
		h.mu.Lock()
		n, changed := h.open, h.openChanged()
		h.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("%d PrepareExecute streams still open: %w", n, ctx.Err())
		}
	}
}

func (h *ToolHost) openChanged() chan struct{} {
	if h.openDone == nil {
		h.openDone = make(chan struct{})
	}
	return h.openDone
}

func (h *ToolHost) addOpen(d int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.open += d
	close(h.openChanged())
	h.openDone = make(chan struct{})
}

// EndSession records the ended session.
func (h *ToolHost) EndSession(_ context.Context, req *toolsv1.EndSessionRequest) (*toolsv1.EndSessionResponse, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ended = append(h.ended, req.GetSessionId())
	return &toolsv1.EndSessionResponse{}, nil
}

// Ended returns the sessions EndSession was called for, in order.
func (h *ToolHost) Ended() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.ended...)
}

// NewToolHost returns a host serving tools.
func NewToolHost(tools ...Tool) *ToolHost {
	h := &ToolHost{tools: map[string]Tool{}, changed: make(chan struct{})}
	h.SetTools(tools...)
	return h
}

// SetTools replaces the tool set and notifies watchers.
func (h *ToolHost) SetTools(tools ...Tool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tools = map[string]Tool{}
	for _, t := range tools {
		h.tools[t.Name] = t
	}
	h.revision++
	close(h.changed)
	h.changed = make(chan struct{})
}

// Executed returns the call ids whose bodies ran, in start order.
func (h *ToolHost) Executed() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.executed...)
}

func (h *ToolHost) snapshot() ([]*toolsv1.ToolDescriptor, int64, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	names := make([]string, 0, len(h.tools))
	for n := range h.tools {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []*toolsv1.ToolDescriptor
	for _, n := range names {
		t := h.tools[n]
		c := toolsv1.ConcurrencySafety_CONCURRENCY_SAFETY_UNSPECIFIED
		if t.Parallel {
			c = toolsv1.ConcurrencySafety_CONCURRENCY_SAFETY_ALWAYS
		}
		out = append(out, &toolsv1.ToolDescriptor{
			Schema:      &llmv1.ToolSchema{Name: n, Description: "fake tool " + n, Parameters: `{"type":"object"}`},
			Concurrency: c,
		})
	}
	return out, h.revision, h.changed
}

// ListTools returns the tool set.
func (h *ToolHost) ListTools(context.Context, *toolsv1.ListToolsRequest) (*toolsv1.ListToolsResponse, error) {
	tools, rev, _ := h.snapshot()
	return &toolsv1.ListToolsResponse{Tools: tools, Revision: rev, SandboxSupport: h.Support}, nil
}

// WatchTools streams snapshots.
func (h *ToolHost) WatchTools(_ *toolsv1.WatchToolsRequest, stream grpc.ServerStreamingServer[toolsv1.WatchToolsResponse]) error {
	for {
		tools, rev, changed := h.snapshot()
		if err := stream.Send(&toolsv1.WatchToolsResponse{Tools: tools, Revision: rev, SandboxSupport: h.Support}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

// PrepareCalls classifies calls by their tool's Parallel flag.
func (h *ToolHost) PrepareCalls(_ context.Context, req *toolsv1.PrepareCallsRequest) (*toolsv1.PrepareCallsResponse, error) {
	h.mu.Lock()
	h.rpcs.PrepareCalls++
	h.mu.Unlock()
	return h.prepare(req), nil
}

func (h *ToolHost) prepare(req *toolsv1.PrepareCallsRequest) *toolsv1.PrepareCallsResponse {
	h.mu.Lock()
	defer h.mu.Unlock()
	resp := &toolsv1.PrepareCallsResponse{}
	for _, ex := range req.GetExecutions() {
		pc := &toolsv1.PreparedCall{CallId: ex.GetCallId(), Mode: toolsv1.ExecutionMode_EXECUTION_MODE_EXCLUSIVE}
		if t, ok := h.tools[ex.GetName()]; ok {
			if t.Parallel {
				pc.Mode = toolsv1.ExecutionMode_EXECUTION_MODE_PARALLEL
			}
			if t.View != nil {
				pc.View = t.View(ex)
			}
		}
		resp.Calls = append(resp.Calls, pc)
	}
	return resp
}

// PrepareExecute serves the protocol with the host's own PrepareCalls and
// Execute (UNIMPLEMENTED after RefusePrepareExecute) in the order
// toolsdk.ServePrepareExecute runs, as toolsdk.Host does: prepare,
// prepared, then execute and the close of the client's send side, then
// Execute's messages. A client that closes or cancels before that runs
// nothing.
func (h *ToolHost) PrepareExecute(stream grpc.BidiStreamingServer[toolsv1.PrepareExecuteRequest, toolsv1.PrepareExecuteResponse]) error {
	h.mu.Lock()
	h.rpcs.PrepareExecute++
	refuse := h.noPrepareExecute
	h.mu.Unlock()
	if refuse {
		return status.Error(codes.Unimplemented, "method PrepareExecute not implemented")
	}
	h.addOpen(1)
	defer h.addOpen(-1)
	return toolsdk.ServePrepareExecute(stream, func(_ context.Context, req *toolsv1.PrepareCallsRequest) (*toolsv1.PrepareCallsResponse, error) {
		return h.prepare(req), nil
	}, func(ctx context.Context, req *toolsv1.ExecuteRequest, out toolsdk.ExecuteSender) error {
		return h.execute(ctx, req, out)
	})
}

// Execute runs a call.
func (h *ToolHost) Execute(req *toolsv1.ExecuteRequest, stream grpc.ServerStreamingServer[toolsv1.ExecuteResponse]) error {
	h.mu.Lock()
	h.rpcs.Execute++
	h.mu.Unlock()
	return h.execute(stream.Context(), req, stream)
}

func (h *ToolHost) execute(ctx context.Context, req *toolsv1.ExecuteRequest, out toolsdk.ExecuteSender) error {
	ex := req.GetExecution()
	h.mu.Lock()
	t, ok := h.tools[ex.GetName()]
	h.executed = append(h.executed, ex.GetCallId())
	h.mu.Unlock()
	var res *toolsv1.ToolExecutionResult
	switch {
	case !ok:
		res = &toolsv1.ToolExecutionResult{IsError: true, Content: []*llmv1.ContentBlock{TextContent("Error: unknown tool: " + ex.GetName())},
			Error: &toolsv1.ToolErrorInfo{Name: "ToolNotFoundError", Code: "UNKNOWN_TOOL"}}
	case t.Run == nil:
		res = &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{TextContent(ex.GetName() + ": " + ex.GetArguments())}}
	default:
		res = t.Run(ctx, ex)
	}
	if res == nil {
		return ctx.Err()
	}
	return out.Send(&toolsv1.ExecuteResponse{Event: &toolsv1.ExecuteResponse_Result{Result: res}})
}

// TextContent is a text content block.
func TextContent(s string) *llmv1.ContentBlock {
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}
}

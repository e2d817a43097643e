package toolsdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk/toolhostconformance"
)

type echoArgs struct {
	Text   string `json:"text" jsonschema:"required,description=Text to echo."`
	Shout  bool   `json:"shout"`
	Repeat int    `json:"repeat"`
}

func echoTool() toolsdk.Tool {
	return toolsdk.Define("echo", "Echo text back.",
		func(ctx context.Context, call *toolsdk.Call, a echoArgs) (toolsdk.Result, error) {
			call.Output("stdout", "partial:"+a.Text)
			out := strings.Repeat(a.Text, max(a.Repeat, 1))
			if a.Shout {
				out = strings.ToUpper(out)
			}
			return toolsdk.Result{Content: []*llmv1.ContentBlock{toolsdk.TextBlock(out)}, Meta: map[string]int{"len": len(out)}}, nil
		},
		toolsdk.ConcurrencySafe(func(a echoArgs) bool { return !a.Shout }),
		toolsdk.PresentCall(func(a echoArgs) *toolsv1.ToolCallView {
			return &toolsv1.ToolCallView{Card: &toolsv1.ToolCallView_Generic{Generic: &toolsv1.GenericCallView{Title: "echo " + a.Text}}}
		}),
		toolsdk.PresentResult(func(a echoArgs, r *toolsv1.ToolExecutionResult) *toolsv1.ToolResultView {
			return &toolsv1.ToolResultView{Card: &toolsv1.ToolResultView_Generic{Generic: &toolsv1.GenericResultView{Title: "echoed " + r.GetMeta()}}}
		}),
	)
}

type sleepArgs struct {
	Ms int `json:"ms" jsonschema:"required"`
}

func sleepTool() toolsdk.Tool {
	return toolsdk.Define("sleep", "Sleep cooperatively.",
		func(ctx context.Context, call *toolsdk.Call, a sleepArgs) (toolsdk.Result, error) {
			select {
			case <-time.After(time.Duration(a.Ms) * time.Millisecond):
				return toolsdk.Text("slept"), nil
			case <-ctx.Done():
				return toolsdk.Result{}, ctx.Err()
			}
		}, toolsdk.Timeout(100*time.Millisecond))
}

func panicTool() toolsdk.Tool {
	return toolsdk.Define("boom", "Panics.", func(context.Context, *toolsdk.Call, struct{}) (toolsdk.Result, error) {
		panic("kaboom")
	})
}

func failTool() toolsdk.Tool {
	return toolsdk.Define("fail", "Fails with a typed error.", func(context.Context, *toolsdk.Call, struct{}) (toolsdk.Result, error) {
		return toolsdk.Result{}, toolsdk.NewError("FsError", "FS_NOT_FOUND", "file not found: /x", nil)
	})
}

func rawTool() toolsdk.Tool {
	return toolsdk.RawTool("raw", "Raw schema.", []byte(`{"type":"object","properties":{"q":{"type":"string"}}}`),
		func(ctx context.Context, call *toolsdk.Call, args json.RawMessage) (toolsdk.Result, error) {
			return toolsdk.Text("raw:" + string(args)), nil
		}, toolsdk.AlwaysConcurrencySafe())
}

// startHost serves h on a loopback port and returns a client.
func startHost(t testing.TB, h *toolsdk.Host) toolsv1.ToolHostClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Serve(ctx, lis) }()
	conn, err := grpcserver.Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return toolsv1.NewToolHostClient(conn)
}

func newHost(t testing.TB, cfg toolsdk.HostConfig) (*toolsdk.Host, toolsv1.ToolHostClient) {
	t.Helper()
	h, err := toolsdk.NewHost(cfg, echoTool(), sleepTool(), panicTool(), failTool(), rawTool())
	if err != nil {
		t.Fatal(err)
	}
	return h, startHost(t, h)
}

func exec(name, args string) *toolsv1.ExecuteRequest {
	return &toolsv1.ExecuteRequest{Execution: &toolsv1.ToolExecution{
		CallId: "c1", Name: name, Arguments: args,
		Context: &toolsv1.ToolContext{SessionId: "s1", Cwd: "/tmp"},
	}}
}

// collect runs Execute and returns the outputs and the single result.
func collect(ctx context.Context, t testing.TB, c toolsv1.ToolHostClient, req *toolsv1.ExecuteRequest) ([]*toolsv1.ToolOutput, *toolsv1.ToolExecutionResult, error) {
	t.Helper()
	st, err := c.Execute(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	var outs []*toolsv1.ToolOutput
	var res *toolsv1.ToolExecutionResult
	for {
		m, err := st.Recv()
		if err != nil {
			if res == nil {
				return outs, nil, err
			}
			return outs, res, nil
		}
		if res != nil {
			t.Fatalf("message after the result: %v", m)
		}
		if o := m.GetOutput(); o != nil {
			outs = append(outs, o)
		} else {
			res = m.GetResult()
		}
	}
}

func text(s string) []*llmv1.ContentBlock { return []*llmv1.ContentBlock{toolsdk.TextBlock(s)} }
func ptr[T any](v T) *T                   { return &v }

func TestExecuteResults(t *testing.T) {
	t.Parallel()
	_, c := newHost(t, toolsdk.HostConfig{})
	tests := []struct {
		name, tool, args string
		want             *toolsv1.ToolExecutionResult
	}{
		{"success with meta and view", "echo", `{"text":"hi","repeat":2}`, &toolsv1.ToolExecutionResult{
			Content: text("hihi"), Meta: ptr(`{"len":4}`),
			View: &toolsv1.ToolResultView{Card: &toolsv1.ToolResultView_Generic{Generic: &toolsv1.GenericResultView{Title: `echoed {"len":4}`}}},
		}},
		{"invalid args list every violation", "echo", `{"shout":"yes","repeat":1.5}`, &toolsv1.ToolExecutionResult{
			Content: text(`Error: invalid arguments: missing required property "text"; "shout" must be a boolean; "repeat" must be an integer`),
			IsError: true, Error: &toolsv1.ToolErrorInfo{Name: "ToolArgsError", Code: "INVALID_ARGS"},
		}},
		{"not json", "echo", `{"text":`, &toolsv1.ToolExecutionResult{
			Content: text(`Error: invalid arguments: arguments are not valid JSON: unexpected end of JSON input`),
			IsError: true, Error: &toolsv1.ToolErrorInfo{Name: "ToolArgsError", Code: "INVALID_ARGS"},
		}},
		{"not an object", "echo", `"hi"`, &toolsv1.ToolExecutionResult{
			Content: text(`Error: invalid arguments: "arguments" must be an object`),
			IsError: true, Error: &toolsv1.ToolErrorInfo{Name: "ToolArgsError", Code: "INVALID_ARGS"},
		}},
		{"unknown tool", "nope", `{}`, &toolsv1.ToolExecutionResult{
			Content: text(`Error: unknown tool "nope"`),
			IsError: true, Error: &toolsv1.ToolErrorInfo{Name: "ToolNotFoundError", Code: "UNKNOWN_TOOL"},
		}},
		{"panic", "boom", `{}`, &toolsv1.ToolExecutionResult{
			Content: text(`Error: tool boom crashed: kaboom`),
			IsError: true, Error: &toolsv1.ToolErrorInfo{Name: "ToolPanicError", Code: "TOOL_PANIC"},
		}},
		{"typed failure", "fail", `{}`, &toolsv1.ToolExecutionResult{
			Content: text(`Error: file not found: /x`),
			IsError: true, Error: &toolsv1.ToolErrorInfo{Name: "FsError", Code: "FS_NOT_FOUND"},
		}},
		{"timeout", "sleep", `{"ms":5000}`, &toolsv1.ToolExecutionResult{
			Content: text(`Error: tool sleep timed out after 100ms`),
			IsError: true, Error: &toolsv1.ToolErrorInfo{Name: "TimeoutError", Code: "TOOL_TIMEOUT"},
		}},
		{"raw tool gets raw args", "raw", `{"q":1}`, &toolsv1.ToolExecutionResult{Content: text(`raw:{"q":1}`)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, got, err := collect(t.Context(), t, c, exec(tt.tool, tt.args))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
		})
	}
}

func TestExecuteStreamsOutputBeforeResult(t *testing.T) {
	t.Parallel()
	_, c := newHost(t, toolsdk.HostConfig{})
	outs, res, err := collect(t.Context(), t, c, exec("echo", `{"text":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	want := []*toolsv1.ToolOutput{{Stream: "stdout", Text: "partial:x"}}
	if diff := cmp.Diff(want, outs, protocmp.Transform()); diff != "" {
		t.Errorf("outputs (-want +got):\n%s", diff)
	}
	if res.GetIsError() {
		t.Errorf("result is an error: %v", res)
	}
}

func TestExecuteBadRequests(t *testing.T) {
	t.Parallel()
	_, c := newHost(t, toolsdk.HostConfig{MaxArgumentBytes: 64})
	tests := []struct {
		name string
		req  *toolsv1.ExecuteRequest
		msg  string
	}{
		{"no execution", &toolsv1.ExecuteRequest{}, "execution is required"},
		{"no cwd", &toolsv1.ExecuteRequest{Execution: &toolsv1.ToolExecution{Name: "echo", Arguments: "{}"}}, "cwd is required"},
		{"relative cwd", &toolsv1.ExecuteRequest{Execution: &toolsv1.ToolExecution{Name: "echo", Arguments: "{}", Context: &toolsv1.ToolContext{Cwd: "rel"}}}, "must be an absolute path"},
		{"relative root", &toolsv1.ExecuteRequest{Execution: &toolsv1.ToolExecution{Name: "echo", Arguments: "{}", Context: &toolsv1.ToolContext{Cwd: "/", WorkspaceRoot: "ws"}}}, "workspace_root"},
		{"oversized", exec("echo", `{"text":"`+strings.Repeat("a", 100)+`"}`), "over this host's limit of 64 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := collect(t.Context(), t, c, tt.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.msg) {
				t.Errorf("err = %v, want InvalidArgument containing %q", err, tt.msg)
			}
		})
	}
}

func TestPrepareCalls(t *testing.T) {
	t.Parallel()
	_, c := newHost(t, toolsdk.HostConfig{})
	req := &toolsv1.PrepareCallsRequest{Executions: []*toolsv1.ToolExecution{
		{CallId: "a", Name: "echo", Arguments: `{"text":"q"}`},
		{CallId: "b", Name: "echo", Arguments: `{"text":"q","shout":true}`},
		{CallId: "c", Name: "echo", Arguments: `{"text":5}`}, // old shape: soft-fails
		{CallId: "d", Name: "raw", Arguments: `{}`},
		{CallId: "e", Name: "missing", Arguments: `{}`},
	}}
	got, err := c.PrepareCalls(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	par, exc := toolsv1.ExecutionMode_EXECUTION_MODE_PARALLEL, toolsv1.ExecutionMode_EXECUTION_MODE_EXCLUSIVE
	view := &toolsv1.ToolCallView{Card: &toolsv1.ToolCallView_Generic{Generic: &toolsv1.GenericCallView{Title: "echo q"}}}
	want := &toolsv1.PrepareCallsResponse{Calls: []*toolsv1.PreparedCall{
		{CallId: "a", Mode: par, View: view},
		{CallId: "b", Mode: exc, View: view},
		{CallId: "c", Mode: exc},
		{CallId: "d", Mode: par},
		{CallId: "e", Mode: exc},
	}}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("PrepareCalls (-want +got):\n%s", diff)
	}
}

func TestWatchToolsFollowsAddAndRemove(t *testing.T) {
	t.Parallel()
	h, err := toolsdk.NewHost(toolsdk.HostConfig{DefaultTimeout: time.Second}, echoTool())
	if err != nil {
		t.Fatal(err)
	}
	c := startHost(t, h)
	st, err := c.WatchTools(t.Context(), &toolsv1.WatchToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	names := func() ([]string, int64) {
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var n []string
		for _, d := range m.GetTools() {
			n = append(n, d.GetSchema().GetName())
		}
		return n, m.GetRevision()
	}
	n, r1 := names()
	if diff := cmp.Diff([]string{"echo"}, n); diff != "" {
		t.Fatalf("initial snapshot (-want +got):\n%s", diff)
	}
	if err := h.Add(sleepTool()); err != nil {
		t.Fatal(err)
	}
	n, r2 := names()
	if diff := cmp.Diff([]string{"echo", "sleep"}, n); diff != "" || r2 <= r1 {
		t.Fatalf("after Add rev %d→%d (-want +got):\n%s", r1, r2, diff)
	}
	if err := h.Add(echoTool()); err == nil {
		t.Error("Add accepted a duplicate name")
	}
	if got := h.Remove("echo", "absent"); got != 1 {
		t.Errorf("Remove = %d, want 1", got)
	}
	n, r3 := names()
	if diff := cmp.Diff([]string{"sleep"}, n); diff != "" || r3 <= r2 {
		t.Fatalf("after Remove rev %d→%d (-want +got):\n%s", r2, r3, diff)
	}
	list, err := c.ListTools(t.Context(), &toolsv1.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := &toolsv1.ListToolsResponse{Revision: r3, Tools: []*toolsv1.ToolDescriptor{{
		Schema:             &llmv1.ToolSchema{Name: "sleep", Description: "Sleep cooperatively.", Parameters: `{"type":"object","properties":{"ms":{"type":"integer"}},"required":["ms"]}`},
		TimeoutMs:          100,
		ValidatesArguments: true,
	}}}
	if diff := cmp.Diff(want, list, protocmp.Transform()); diff != "" {
		t.Errorf("ListTools (-want +got):\n%s", diff)
	}
}

func TestCancelReachesBody(t *testing.T) {
	t.Parallel()
	var started chan struct{} // made per RPC below
	stopped := make(chan error, 1)
	block := toolsdk.Define("block", "Blocks until cancelled.", func(ctx context.Context, _ *toolsdk.Call, _ struct{}) (toolsdk.Result, error) {
		close(started)
		<-ctx.Done()
		stopped <- context.Cause(ctx)
		return toolsdk.Result{}, ctx.Err()
	}, toolsdk.Timeout(time.Minute))
	h, err := toolsdk.NewHost(toolsdk.HostConfig{}, block)
	if err != nil {
		t.Fatal(err)
	}
	c := startHost(t, h)
	ex := exec("block", `{}`)
	for _, rpc := range []struct {
		name string
		call func(context.Context) error
	}{
		{"Execute", func(ctx context.Context) error { _, _, err := collect(ctx, t, c, ex); return err }},
		{"PrepareExecute", func(ctx context.Context) error {
			_, err := toolhostconformance.Exchange(ctx, c, toolhostconformance.Prepare(ex.GetExecution()), toolhostconformance.Execute(ex.GetExecution()))
			return err
		}},
	} {
		started = make(chan struct{})
		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error, 1)
		go func() { errc <- rpc.call(ctx) }()
		<-started
		cancel()
		select {
		case cause := <-stopped:
			if !errors.Is(cause, context.Canceled) {
				t.Errorf("%s: body saw cause %v, want context.Canceled", rpc.name, cause)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: cancelling the RPC did not cancel the body", rpc.name)
		}
		if err := <-errc; status.Code(err) != codes.Canceled {
			t.Errorf("%s: client err = %v, want Canceled", rpc.name, err)
		}
	}
}

func TestDefinePanicsOnBadDefinitions(t *testing.T) {
	t.Parallel()
	body := func(context.Context, *toolsdk.Call, echoArgs) (toolsdk.Result, error) { return toolsdk.Result{}, nil }
	for name, f := range map[string]func(){
		"bad name": func() { toolsdk.Define("bad name", "", body) },
		"non-struct args": func() {
			toolsdk.Define("x", "", func(context.Context, *toolsdk.Call, string) (toolsdk.Result, error) { return toolsdk.Result{}, nil })
		},
		"option type":      func() { toolsdk.Define("x", "", body, toolsdk.ConcurrencySafe(func(sleepArgs) bool { return true })) },
		"negative timeout": func() { toolsdk.Define("x", "", body, toolsdk.Timeout(-time.Second)) },
		"raw not object": func() {
			toolsdk.RawTool("x", "", []byte(`{"type":"string"}`), func(context.Context, *toolsdk.Call, json.RawMessage) (toolsdk.Result, error) {
				return toolsdk.Result{}, nil
			})
		},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: Define did not panic", name)
				}
			}()
			f()
		}()
	}
}

func TestServeStopsWatchersOnShutdown(t *testing.T) {
	t.Parallel()
	h, err := toolsdk.NewHost(toolsdk.HostConfig{}, echoTool())
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- h.Serve(ctx, lis) }()
	conn, err := grpcserver.Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := toolsv1.NewToolHostClient(conn).WatchTools(t.Context(), &toolsv1.WatchToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("an open WatchTools stream held up shutdown")
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("shutdown took %v", el)
	}
}

func TestSlowCallerNeverStallsTheTool(t *testing.T) {
	t.Parallel()
	finished := make(chan struct{})
	chatty := toolsdk.Define("chatty", "Writes a lot of live output.", func(_ context.Context, call *toolsdk.Call, _ struct{}) (toolsdk.Result, error) {
		chunk := strings.Repeat("x", 4096)
		for range 5000 { // 20 MB, far past any flow-control window
			call.Output("stdout", chunk)
		}
		close(finished)
		return toolsdk.Text("done"), nil
	})
	h, err := toolsdk.NewHost(toolsdk.HostConfig{}, chatty)
	if err != nil {
		t.Fatal(err)
	}
	c := startHost(t, h)
	st, err := c.Execute(t.Context(), exec("chatty", `{}`))
	if err != nil {
		t.Fatal(err)
	}
	// Read nothing until the body has finished.
	select {
	case <-finished:
	case <-time.After(20 * time.Second):
		t.Fatal("a caller that does not read stalled the tool body")
	}
	var res *toolsv1.ToolExecutionResult
	for res == nil {
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		res = m.GetResult()
	}
	if toolsdk.ResultText(res.GetContent()) != "done" {
		t.Errorf("result %v", res)
	}
}

func TestEndSession(t *testing.T) {
	t.Parallel()
	var ended []string
	hook := func(_ context.Context, id string) (int, error) {
		if id == "broken" {
			return 0, errors.New("disk on fire")
		}
		ended = append(ended, id)
		return 2, nil
	}
	_, noop := newHost(t, toolsdk.HostConfig{})
	_, hooked := newHost(t, toolsdk.HostConfig{EndSession: hook})
	tests := []struct {
		name    string
		c       toolsv1.ToolHostClient
		id      string
		code    codes.Code
		stopped int32
	}{
		{"no hook is a no-op", noop, "s1", codes.OK, 0},
		{"hook counts tasks", hooked, "s1", codes.OK, 2},
		{"missing id", hooked, "", codes.InvalidArgument, 0},
		{"missing id without hook", noop, "", codes.InvalidArgument, 0},
		{"hook failure", hooked, "broken", codes.Internal, 0},
	}
	for _, tt := range tests {
		r, err := tt.c.EndSession(t.Context(), &toolsv1.EndSessionRequest{SessionId: tt.id})
		if status.Code(err) != tt.code {
			t.Errorf("%s: err = %v, want %v", tt.name, err, tt.code)
			continue
		}
		if err == nil && r.GetTasksStopped() != tt.stopped {
			t.Errorf("%s: tasks_stopped = %d, want %d", tt.name, r.GetTasksStopped(), tt.stopped)
		}
	}
	if !slices.Equal(ended, []string{"s1"}) {
		t.Errorf("hook saw %v, want [s1]", ended)
	}
}

// TestVetContext: VetContext's answer for a call's context is what that
// call's tool sees as Call.Vetted (one answer per call, never another
// call's), its error refuses the call with INVALID_ARGUMENT before the
// tool runs, and Host.Run, which checks nothing, leaves Vetted nil.
func TestVetContext(t *testing.T) {
	t.Parallel()
	var ran int
	seen := toolsdk.Define("seen", "Reports its call's Vetted.", func(_ context.Context, call *toolsdk.Call, _ struct{}) (toolsdk.Result, error) {
		ran++
		v, _ := call.Vetted.(string)
		return toolsdk.Text("vetted=" + v), nil
	})
	h, err := toolsdk.NewHost(toolsdk.HostConfig{VetContext: func(tc *toolsv1.ToolContext) (any, error) {
		if tc.GetWorkspaceRoot() == "/refused" {
			return nil, errors.New("root refused by the host")
		}
		return "root:" + tc.GetWorkspaceRoot(), nil
	}}, seen)
	if err != nil {
		t.Fatal(err)
	}
	c := startHost(t, h)
	call := func(root string) *toolsv1.ExecuteRequest {
		return &toolsv1.ExecuteRequest{Execution: &toolsv1.ToolExecution{CallId: "c", Name: "seen", Arguments: "{}",
			Context: &toolsv1.ToolContext{SessionId: "s", Cwd: "/tmp", WorkspaceRoot: root}}}
	}
	for _, root := range []string{"/a", "/b", "/a"} {
		_, res, err := collect(t.Context(), t, c, call(root))
		if err != nil || res.GetIsError() || !cmp.Equal(res.GetContent(), text("vetted=root:"+root), protocmp.Transform()) {
			t.Fatalf("root %s: %v %v", root, res, err)
		}
	}
	_, _, err = collect(t.Context(), t, c, call("/refused"))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "root refused by the host") || ran != 3 {
		t.Fatalf("refused root: %v after %d runs; want InvalidArgument before the tool ran", err, ran)
	}
	if res := h.Run(t.Context(), call("/a").GetExecution(), nil); !cmp.Equal(res.GetContent(), text("vetted="), protocmp.Transform()) {
		t.Fatalf("Run: %v, want no vetted value", res)
	}
	// PrepareExecute vets the execution of its execute message (the one
	// that runs) as Execute does: a prepare with an accepted context does
	// not let a refused one through.
	got, err := toolhostconformance.Exchange(t.Context(), c, toolhostconformance.Prepare(call("/a").GetExecution()), toolhostconformance.Execute(call("/a").GetExecution()))
	if err != nil || len(got) != 2 || !cmp.Equal(got[1].GetEvent().GetResult().GetContent(), text("vetted=root:/a"), protocmp.Transform()) || ran != 5 {
		t.Fatalf("PrepareExecute of an accepted root: %v %v", got, err)
	}
	for _, prep := range []string{"/a", "/refused"} {
		_, err := toolhostconformance.Exchange(t.Context(), c, toolhostconformance.Prepare(call(prep).GetExecution()), toolhostconformance.Execute(call("/refused").GetExecution()))
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "root refused by the host") || ran != 5 {
			t.Errorf("PrepareExecute prepared with %s, executed with /refused: %v after %d runs; want INVALID_ARGUMENT before the tool ran", prep, err, ran)
		}
	}
}

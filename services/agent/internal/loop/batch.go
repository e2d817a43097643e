package loop

import (
	"context"
	"encoding/json"
	"strings"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/internal/telemetry"
)

// TodoWriteTool is the tool whose successful calls are also logged as
// todo/write snapshots.
const TodoWriteTool = "todo_write"

type batchCall struct {
	ex      *toolsv1.ToolExecution
	mode    toolsv1.ExecutionMode
	view    *toolsv1.ToolCallView
	callSeq int64
	call    ToolCall
	settled bool
	span    trace.Span // the call's execute_tool span, until it ends
}

// runBatch executes one assistant message's tool calls (semantics.md §4.9):
// calls start in model order (tool/call appended, then the pre-dispatch
// stages); an exclusive call runs alone; parallel-safe calls overlap up to
// MaxParallelToolCalls; results are committed strictly in model order; after
// a cancel no new call starts and every unstarted call gets a synthetic
// tool/call + ABORTED_BEFORE_DISPATCH result pair.
func (a *Agent) runBatch(ctx context.Context, turn, step int32, blocks []*llmv1.ToolCallBlock) error {
	calls := make([]*batchCall, len(blocks))
	execs := make([]*toolsv1.ToolExecution, len(blocks))
	sandbox := a.effectiveSandbox()
	for i, b := range blocks {
		execs[i] = &toolsv1.ToolExecution{CallId: b.GetId(), Name: b.GetName(), Arguments: b.GetArguments(),
			Context: &toolsv1.ToolContext{SessionId: a.ID(), Cwd: a.h.GetCwd(),
				WorkspaceRoot: a.h.GetOptions().GetWorkspaceRoot(), Turn: turn, Step: step, Tenant: a.h.GetTenant(), Sandbox: sandbox}}
		calls[i] = &batchCall{ex: execs[i], mode: toolsv1.ExecutionMode_EXECUTION_MODE_EXCLUSIVE}
	}
	defer func() {
		for _, c := range calls {
			if c.span != nil { // a call that never started or never settled
				c.span.End()
			}
		}
	}()
	if a.cfg.Tools != nil && ctx.Err() == nil {
		defer a.cfg.Tools.Release(execs) // whatever was prepared for a call never started
		pctx := ctx
		if len(calls) == 1 {
			// A batch of one call is prepared and run on one stream
			// (toolpipe's PrepareExecute), opened here: the call's span
			// starts first, so the host's span of the stream sits under
			// it as its Execute's did.
			c := calls[0]
			pctx, c.span = telemetry.StartToolCall(ctx, a.ID(), c.ex.GetName(), c.ex.GetCallId(), "")
		}
		for i, pc := range a.cfg.Tools.PrepareCalls(pctx, a.visibleHosts(), execs) {
			if i < len(calls) {
				calls[i].mode, calls[i].view = pc.GetMode(), pc.GetView()
			}
		}
	}
	settled := make(chan int, len(calls))
	started, committed, inflight := 0, 0, 0

	commitReady := func() error {
		for committed < started && calls[committed].settled {
			if err := a.commit(ctx, turn, step, calls[committed]); err != nil {
				return err
			}
			committed++
		}
		return nil
	}
	waitOne := func() error {
		i := <-settled
		calls[i].settled = true
		inflight--
		return commitReady()
	}
	drain := func() error {
		for inflight > 0 {
			if err := waitOne(); err != nil {
				return err
			}
		}
		return nil
	}
	dispatch := func(ctx context.Context, c *batchCall, i int) {
		if c.call != nil {
			c.call.Dispatch(ctx, a.flush)
		}
		settled <- i // buffered for every call: never blocks
	}
	start := func(i int) error {
		c := calls[i]
		ev, err := a.appendOwned(toolCallEvent(turn, step, c.ex, c.view)) // strings, and a view decoded for this batch
		if err != nil {
			return err
		}
		c.callSeq = ev.GetSeq()
		var cctx context.Context
		if c.span != nil { // started before the prepare
			cctx = trace.ContextWithSpan(ctx, c.span)
		} else {
			cctx, c.span = telemetry.StartToolCall(ctx, a.ID(), c.ex.GetName(), c.ex.GetCallId(), "")
		}
		if a.cfg.Tools != nil {
			c.call = a.cfg.Tools.Begin(cctx, a.visibleHosts(), c.ex)
		}
		started++
		inflight++
		// The next call may run beside this one only when both are
		// parallel and more than one call may be in flight.
		overlaps := c.mode == toolsv1.ExecutionMode_EXECUTION_MODE_PARALLEL && started < len(calls) &&
			calls[started].mode == toolsv1.ExecutionMode_EXECUTION_MODE_PARALLEL && a.cfg.MaxParallelToolCalls > 1
		if inflight == 1 && !overlaps {
			// Nothing else in flight, and the driver would wait for this
			// call next (an exclusive call is drained at once; a call the
			// next one cannot overlap is drained or waited for before the
			// next starts; the batch's last call is followed by the final
			// drain): dispatched on the driver itself, without a goroutine
			// of its own, a stack to grow and a wake-up. The results
			// commit as before.
			dispatch(cctx, c, i)
			return nil
		}
		go dispatch(cctx, c, i)
		return nil
	}

	var err error
	for started < len(calls) && err == nil {
		if calls[started].mode == toolsv1.ExecutionMode_EXECUTION_MODE_PARALLEL {
			for inflight >= a.cfg.MaxParallelToolCalls && err == nil {
				err = waitOne()
			}
		} else {
			err = drain()
		}
		if err != nil || ctx.Err() != nil {
			break
		}
		if err = start(started); err != nil {
			break
		}
		if calls[started-1].mode != toolsv1.ExecutionMode_EXECUTION_MODE_PARALLEL {
			err = drain()
		}
	}
	if derr := drain(); err == nil {
		err = derr
	}
	if err != nil {
		return err
	}
	if err := commitReady(); err != nil {
		return err
	}
	for i := started; i < len(calls); i++ {
		c := calls[i]
		ev, err := a.appendOwned(toolCallEvent(turn, step, c.ex, c.view)) // strings, and a view decoded for this batch
		if err != nil {
			return err
		}
		res := abortedBeforeDispatch()
		// Every call the log records has its span, whether or not it
		// started before the prepare.
		if c.span == nil {
			_, c.span = telemetry.StartToolCall(ctx, a.ID(), c.ex.GetName(), c.ex.GetCallId(), "")
		}
		telemetry.EndToolCall(c.span, true, res.GetError().GetCode())
		c.span = nil
		if _, err := a.appendOwned(toolResultEvent(turn, step, c.ex.GetCallId(), res, ev.GetSeq())); err != nil { // built here
			return err
		}
	}
	return nil
}

// commit finishes one settled call and appends its tool/result (and a
// todo/write snapshot for todo_write); its contexts join the batch FIFO.
func (a *Agent) commit(ctx context.Context, turn, step int32, c *batchCall) error {
	var res *toolsv1.ToolExecutionResult
	if c.call != nil {
		res = c.call.Finish(ctx)
	} else {
		res = &toolsv1.ToolExecutionResult{IsError: true, Content: []*llmv1.ContentBlock{session.Text("Error: unknown tool: " + c.ex.GetName())},
			Error: &toolsv1.ToolErrorInfo{Name: "ToolNotFoundError", Code: "UNKNOWN_TOOL"}}
	}
	if c.span != nil {
		telemetry.EndToolCall(c.span, res.GetIsError(), res.GetError().GetCode())
		c.span = nil
	}
	// The result is the call's to give (ToolCall.Finish) or built here: the
	// log takes its parts without a copy.
	if _, err := a.appendOwned(toolResultEvent(turn, step, c.ex.GetCallId(), res, c.callSeq)); err != nil {
		return err
	}
	if c.ex.GetName() == TodoWriteTool && !res.GetIsError() {
		if todos, ok := parseTodos(c.ex.GetArguments()); ok {
			if _, err := a.appendOwned(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_TodoWrite{ // parsed here
				TodoWrite: &sessionv1.TodoWrite{Todos: todos}}}); err != nil {
				return err
			}
		}
	}
	a.mu.Lock()
	for _, hc := range res.GetAdditionalContexts() {
		if len(hc.GetContent()) > 0 {
			a.batchFIFO = append(a.batchFIFO, contextEvent(hc.GetContent(), sourceOr(hc.GetSource(), "tool:"+c.ex.GetName()), hc.Meta))
		}
	}
	a.mu.Unlock()
	return nil
}

func toolCallEvent(turn, step int32, ex *toolsv1.ToolExecution, view *toolsv1.ToolCallView) *sessionv1.SessionEvent {
	return session.ToolCallEvent(turn, step, ex.GetCallId(), ex.GetName(), ex.GetArguments(), view)
}

func toolResultEvent(turn, step int32, callID string, res *toolsv1.ToolExecutionResult, callSeq int64) *sessionv1.SessionEvent {
	ev := session.ToolResultEvent(turn, step, callID, res.GetContent(), res.GetIsError(), res.GetError(), callSeq)
	tr := ev.GetToolResult()
	if res.Meta != nil {
		tr.Meta = proto.String(res.GetMeta())
	}
	tr.View = res.GetView()
	return ev
}

func abortedBeforeDispatch() *toolsv1.ToolExecutionResult {
	return &toolsv1.ToolExecutionResult{IsError: true,
		Content: []*llmv1.ContentBlock{session.Text("Error: tool call aborted before dispatch")},
		Error:   &toolsv1.ToolErrorInfo{Name: "AbortError", Code: "ABORTED_BEFORE_DISPATCH"}}
}

// parseTodos reads todo_write arguments {"todos":[{"content","status"}]}.
func parseTodos(args string) ([]*sessionv1.TodoItem, bool) {
	var in struct {
		Todos []struct {
			Content string `json:"content"`
			Status  string `json:"status"`
		} `json:"todos"`
	}
	if err := json.Unmarshal([]byte(args), &in); err != nil || in.Todos == nil {
		return nil, false
	}
	out := make([]*sessionv1.TodoItem, 0, len(in.Todos))
	for _, t := range in.Todos {
		st := sessionv1.TodoStatus_TODO_STATUS_PENDING
		switch strings.ToLower(t.Status) {
		case "in_progress", "in-progress":
			st = sessionv1.TodoStatus_TODO_STATUS_IN_PROGRESS
		case "completed", "done":
			st = sessionv1.TodoStatus_TODO_STATUS_COMPLETED
		}
		out = append(out, &sessionv1.TodoItem{Content: t.Content, Status: st})
	}
	return out, true
}

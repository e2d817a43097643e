package toolpipe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/internal/toolstream"
	"github.com/dsh-dev/dsh/services/agent/internal/hooks"
)

// Stable codes of pipeline-made results.
const (
	CodeUnknownTool           = "UNKNOWN_TOOL"
	CodeAborted               = "ABORTED"
	CodeAbortedBeforeDispatch = "ABORTED_BEFORE_DISPATCH"
	CodeHostUnavailable       = "TOOL_HOST_UNAVAILABLE"
	CodeHostProtocol          = "TOOL_HOST_PROTOCOL_ERROR"
	CodeCheckpointFailed      = "CHECKPOINT_FAILED"
	CodeSandboxUnavailable    = "SANDBOX_UNAVAILABLE"
)

func text(s string) *llmv1.ContentBlock {
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}
}

// ErrorResult is a model-facing failure: "Error: <message>", with a
// structured class when name and code are set.
func ErrorResult(message, name, code string) *toolsv1.ToolExecutionResult {
	r := &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{text("Error: " + message)}, IsError: true}
	if code != "" {
		r.Error = &toolsv1.ToolErrorInfo{Name: name, Code: code}
	}
	return r
}

// AbortedBeforeDispatch is the canonical result of a call cancelled before
// its body started.
func AbortedBeforeDispatch() *toolsv1.ToolExecutionResult {
	return ErrorResult("tool call aborted before dispatch", "AbortError", CodeAbortedBeforeDispatch)
}

// Aborted is the canonical result of a call cancelled while its body ran.
func Aborted() *toolsv1.ToolExecutionResult {
	return ErrorResult("tool call aborted", "AbortError", CodeAborted)
}

// Call is one call moving through the pipeline.
type Call struct {
	p       *Pipeline
	hosts   []string
	ex      *toolsv1.ToolExecution
	result  *toolsv1.ToolExecutionResult
	final   bool // skip post-execute
	bodyRan bool
	pre     *preparedStream // the PrepareExecute stream PrepareCalls opened for ex, until sent or released
}

// Begin runs materialisation and the pre-dispatch stages: the pre-aborted
// check, tools/pre-execute (local links, then remote interceptors), approval
// (the session's Gate: its policy and rules decide, and an interceptor's ask
// becomes an approval request; without a gate an ask denies), guards and the
// cancellation re-check. hosts is the session's toolhost visibility (empty =
// all).
func (p *Pipeline) Begin(ctx context.Context, hosts []string, ex *toolsv1.ToolExecution) *Call {
	c := &Call{p: p, hosts: hosts, ex: ex, pre: p.take(ex)}
	if ctx.Err() != nil {
		c.result, c.final = AbortedBeforeDispatch(), true
		return c
	}
	d, err := p.Pre.Run(ctx, &PreIn{Execution: ex}, func(context.Context, *PreIn) (*toolsv1.PreToolDecision, error) {
		return &toolsv1.PreToolDecision{Kind: &toolsv1.PreToolDecision_Allow{Allow: &toolsv1.PreAllow{}}}, nil
	})
	var gate Gate
	if p.cfg.Gates != nil {
		gate = p.cfg.Gates(ex.GetContext().GetSessionId())
	}
	var reason string
	switch {
	case err != nil:
		reason = fmt.Sprintf("pre-execute policy failed: %v", err)
	case d.GetDeny() != nil:
		reason = d.GetDeny().GetReason()
		if reason == "" {
			reason = fmt.Sprintf("tool %s was denied", ex.GetName())
		}
	case gate != nil:
		// A prepared stream is not held open on the host while a person
		// decides (that may take hours): the call then runs with Execute.
		var waiting func()
		if c.pre != nil {
			waiting = c.release
		}
		if ok, why := gate.Approve(ctx, ex, d.GetAsk(), p.pathKey(hosts, ex.GetName()), waiting); !ok {
			reason = why
		}
	case d.GetAsk() != nil:
		reason = d.GetAsk().GetReason()
		if reason == "" {
			reason = fmt.Sprintf("tool %s requires approval and no approval channel is configured", ex.GetName())
		}
	}
	if reason == "" {
		for _, g := range p.cfg.Guards {
			if r := g(ex); r != "" {
				reason = r
				break
			}
		}
	}
	if ctx.Err() != nil {
		c.result = AbortedBeforeDispatch()
		return c
	}
	if reason != "" {
		c.result = ErrorResult(reason, "", "")
	}
	return c
}

// Dispatch runs the body on the owning host after checkpoint succeeded (the
// loop's durability flush). Safe to run concurrently with other calls.
func (c *Call) Dispatch(ctx context.Context, checkpoint func(context.Context) error) {
	defer c.release() // a call that does not reach its host ends its prepared stream unsent
	if c.result != nil {
		return
	}
	if ctx.Err() != nil {
		c.result = AbortedBeforeDispatch()
		return
	}
	hs, _ := c.p.lookup(c.hosts, c.ex.GetName())
	if hs == nil {
		c.result = c.p.unknown(c.hosts, c.ex.GetName())
		return
	}
	if r := c.p.refuseUnenforced(hs, c.ex); r != nil {
		c.result = r
		return
	}
	if checkpoint != nil {
		if err := checkpoint(ctx); err != nil {
			if ctx.Err() != nil {
				c.result = AbortedBeforeDispatch()
				return
			}
			c.result = ErrorResult("checkpoint before the tool failed: "+err.Error(), "CheckpointError", CodeCheckpointFailed)
			return
		}
	}
	if ctx.Err() != nil {
		c.result = AbortedBeforeDispatch()
		return
	}
	c.bodyRan = true
	if hs.host.Local != nil {
		// An in-process host may keep what it returns: copied, so the
		// result Finish hands out is the caller's alone.
		c.result = proto.CloneOf(hs.host.Local.Execute(ctx, c.ex))
	} else {
		c.result = c.execute(ctx, hs)
	}
	if ctx.Err() != nil && !c.result.GetIsError() {
		c.result = withContexts(Aborted(), c.result)
	}
}

// execute runs the call on its remote host: on the stream PrepareCalls
// prepared for it when there is one for this host, else (or when that
// stream ended before the go-ahead: the host ran nothing) with Execute.
func (c *Call) execute(ctx context.Context, hs *hostState) *toolsv1.ToolExecutionResult {
	if c.pre != nil && c.pre.hs == hs {
		if res, ok := c.executePrepared(ctx, hs); ok {
			return res
		}
	}
	return c.executeUnary(ctx, hs)
}

// executeUnary runs the call with Execute.
func (c *Call) executeUnary(ctx context.Context, hs *hostState) *toolsv1.ToolExecutionResult {
	c.release()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel() // releases the stream (and ends its span) however the call ends
	stream, err := hs.host.Client.Execute(rctx, &toolsv1.ExecuteRequest{Execution: c.ex})
	if err != nil {
		return c.rpcFailure(ctx, hs, err)
	}
	return c.readStream(ctx, hs, stream.Recv)
}

// readStream reads one call's Execute messages from recv (an Execute
// stream's, or a PrepareExecute stream's events) and returns its result:
// live output goes to Progress, a broken stream contract is a protocol
// result and an RPC error is mapped by rpcFailure.
func (c *Call) readStream(ctx context.Context, hs *hostState, recv func() (*toolsv1.ExecuteResponse, error)) *toolsv1.ToolExecutionResult {
	var check toolstream.StreamChecker
	for {
		resp, err := recv()
		if errors.Is(err, io.EOF) {
			r, perr := check.End()
			if perr != nil {
				return hostProtocolResult(hs, perr)
			}
			return r
		}
		if err != nil {
			return c.rpcFailure(ctx, hs, err)
		}
		if _, perr := check.Push(resp); perr != nil {
			return hostProtocolResult(hs, perr)
		}
		if out := resp.GetOutput(); out != nil && c.p.cfg.Progress != nil {
			c.p.cfg.Progress(c.ex, out)
		}
		if resp.GetResult() != nil {
			// The result must be the stream's last message: read the end of
			// the stream so the RPC completes cleanly, and refuse a host that
			// sends anything after it. A transport error after a valid
			// result does not undo the result.
			if next, err := recv(); err == nil {
				if _, perr := check.Push(next); perr != nil {
					return hostProtocolResult(hs, perr)
				}
			}
			r, _ := check.End()
			return r
		}
	}
}

// hostProtocolResult is the result of a call whose host broke the Execute
// stream contract (no result, two results, malformed content): it fails the
// call, never the turn, and the host connection stays usable.
func hostProtocolResult(hs *hostState, err error) *toolsv1.ToolExecutionResult {
	return ErrorResult(fmt.Sprintf("tool host %s broke the Execute protocol: %v", hs.host.Name, err), "ToolHostProtocolError", CodeHostProtocol)
}

func (c *Call) rpcFailure(ctx context.Context, hs *hostState, err error) *toolsv1.ToolExecutionResult {
	if ctx.Err() != nil {
		return Aborted()
	}
	st := status.Convert(err)
	switch st.Code() {
	case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded, codes.Unknown, codes.Internal, codes.Aborted:
		return ErrorResult(fmt.Sprintf("the host of tool %s (toolhost %q) is unavailable: %s", c.ex.GetName(), hs.host.Name, st.Message()), "ToolHostUnavailableError", CodeHostUnavailable)
	case codes.NotFound:
		return ErrorResult("unknown tool: "+c.ex.GetName(), "ToolNotFoundError", CodeUnknownTool)
	default:
		return ErrorResult(fmt.Sprintf("tool host %s refused the call: %s", hs.host.Name, st.Message()), "ToolHostProtocolError", CodeHostProtocol)
	}
}

// unknown is the result of a call to a tool no reachable host serves: when
// a visible host is down (it was never listed, or it may have gained the
// tool) the model is told the host is unavailable, not that the tool does
// not exist.
func (p *Pipeline) unknown(hosts []string, name string) *toolsv1.ToolExecutionResult {
	if down := p.downHosts(hosts); len(down) > 0 {
		return ErrorResult(fmt.Sprintf("tool %s is not available: its host may be toolhost %s, which is unavailable; try again later",
			name, strings.Join(quoteAll(down), " or ")), "ToolHostUnavailableError", CodeHostUnavailable)
	}
	return ErrorResult("unknown tool: "+name, "ToolNotFoundError", CodeUnknownTool)
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strconv.Quote(s)
	}
	return out
}

func withContexts(r, prior *toolsv1.ToolExecutionResult) *toolsv1.ToolExecutionResult {
	r.AdditionalContexts = prior.GetAdditionalContexts()
	return r
}

// Finish runs tools/post-execute (local links, then remote interceptors) and
// the final cancellation rule, and returns the call's final result.
//
// The result is the caller's alone (the loop hands it to the session log
// without a copy): a remote host's result is decoded for this call, a
// local host's is copied as it returns (Dispatch), content a post-execute
// decision supplies is copied here, and the pipeline never changes a result
// after returning it. Post-execute links see the result (PostIn.Result)
// and must neither keep nor change it.
func (c *Call) Finish(ctx context.Context) *toolsv1.ToolExecutionResult {
	c.release() // a call finished without Dispatch
	if c.final {
		return c.result
	}
	if c.result == nil {
		c.result = AbortedBeforeDispatch()
	}
	res := c.result
	d, err := c.p.Post.Run(ctx, &PostIn{Execution: c.ex, Result: res}, func(context.Context, *PostIn) (*toolsv1.PostToolDecision, error) {
		return &toolsv1.PostToolDecision{Kind: &toolsv1.PostToolDecision_Accept{Accept: &toolsv1.PostAccept{}}}, nil
	})
	switch {
	case err != nil:
		res = ErrorResult(fmt.Sprintf("post-execute policy failed: %v", err), "", "")
	case d.GetBlock() != nil:
		res = &toolsv1.ToolExecutionResult{Content: session.CloneAll(d.GetBlock().GetFeedback()), IsError: true,
			AdditionalContexts: d.GetBlock().GetAdditionalContexts()}
	case d.GetAccept() != nil:
		a := d.GetAccept()
		if a.GetReplaceContent() || len(a.GetAdditionalContexts()) > 0 {
			// res is the call's own (Dispatch): changed in place.
			if a.GetReplaceContent() {
				res.Content = session.CloneAll(a.GetContent())
			}
			res.AdditionalContexts = append(res.AdditionalContexts, a.GetAdditionalContexts()...)
		}
	}
	if ctx.Err() != nil && !res.GetIsError() {
		if c.bodyRan {
			res = withContexts(Aborted(), res)
		} else {
			res = withContexts(AbortedBeforeDispatch(), res)
		}
	}
	c.result = res
	return res
}

func (ic Interceptor) call(ctx context.Context) (context.Context, context.CancelFunc) {
	d := ic.Timeout
	if d <= 0 {
		d = 5 * time.Second
	}
	return context.WithTimeout(ctx, d)
}

func (ic Interceptor) failed(log *slog.Logger, point string, err error) bool {
	if status.Code(err) == codes.Unimplemented {
		return false
	}
	log.Warn("tool interceptor failed", "interceptor", ic.Name, "point", point, "failOpen", ic.FailOpen, "err", err)
	return true
}

func (ic Interceptor) preLink(log *slog.Logger) hooks.Link[*PreIn, *toolsv1.PreToolDecision] {
	return func(ctx context.Context, in *PreIn, next hooks.Next[*PreIn, *toolsv1.PreToolDecision]) (*toolsv1.PreToolDecision, error) {
		cctx, cancel := ic.call(ctx)
		resp, err := ic.Client.PreExecute(cctx, &toolsv1.PreExecuteRequest{Execution: in.Execution})
		cancel()
		if err != nil {
			if !ic.failed(log, "pre-execute", err) || ic.FailOpen {
				return next(ctx, in)
			}
			return &toolsv1.PreToolDecision{Kind: &toolsv1.PreToolDecision_Deny{Deny: &toolsv1.PreDeny{
				Reason: fmt.Sprintf("tool interceptor %s unavailable: %s", ic.Name, status.Convert(err).Message())}}}, nil
		}
		if d := resp.GetDecision(); d.GetDeny() != nil || d.GetAsk() != nil {
			return d, nil
		}
		return next(ctx, in)
	}
}

func (ic Interceptor) postLink(log *slog.Logger) hooks.Link[*PostIn, *toolsv1.PostToolDecision] {
	return func(ctx context.Context, in *PostIn, next hooks.Next[*PostIn, *toolsv1.PostToolDecision]) (*toolsv1.PostToolDecision, error) {
		cctx, cancel := ic.call(ctx)
		resp, err := ic.Client.PostExecute(cctx, &toolsv1.PostExecuteRequest{Execution: in.Execution, Result: in.Result})
		cancel()
		if err != nil {
			if !ic.failed(log, "post-execute", err) || ic.FailOpen {
				return next(ctx, in)
			}
			return &toolsv1.PostToolDecision{Kind: &toolsv1.PostToolDecision_Block{Block: &toolsv1.PostBlock{
				Feedback: []*llmv1.ContentBlock{text(fmt.Sprintf("Error: tool interceptor %s unavailable: %s", ic.Name, status.Convert(err).Message()))}}}}, nil
		}
		mine := resp.GetDecision()
		if mine.GetBlock() != nil {
			return mine, nil
		}
		down, err := next(ctx, in)
		if err != nil || down.GetBlock() != nil || mine.GetAccept() == nil {
			return down, err
		}
		a := proto.CloneOf(down.GetAccept())
		if a == nil {
			a = &toolsv1.PostAccept{}
		}
		if mine.GetAccept().GetReplaceContent() && !a.GetReplaceContent() {
			a.ReplaceContent, a.Content = true, mine.GetAccept().GetContent()
		}
		a.AdditionalContexts = append(mine.GetAccept().GetAdditionalContexts(), a.AdditionalContexts...)
		return &toolsv1.PostToolDecision{Kind: &toolsv1.PostToolDecision_Accept{Accept: a}}, nil
	}
}

// refuseUnenforced fails closed: a confined call on a host that does not
// declare enforcement is not dispatched unless the deployment allows it.
func (p *Pipeline) refuseUnenforced(hs *hostState, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
	if p.cfg.AllowUnenforced {
		return nil
	}
	switch ex.GetContext().GetSandbox().GetMode() {
	case toolsv1.SandboxMode_SANDBOX_MODE_READ_ONLY, toolsv1.SandboxMode_SANDBOX_MODE_WORKSPACE_WRITE:
	default:
		return nil
	}
	p.mu.RLock()
	support := hs.support
	p.mu.RUnlock()
	if support == toolsv1.SandboxSupport_SANDBOX_SUPPORT_ENFORCED {
		return nil
	}
	return ErrorResult(fmt.Sprintf("the command was not run: tool host %s does not enforce sandbox policies and this session is confined (%s); "+
		"the deployment can allow it with --allow-unenforced-hosts", hs.host.Name, ex.GetContext().GetSandbox().GetMode()), "SandboxError", CodeSandboxUnavailable)
}

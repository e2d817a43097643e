package hooks

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/services/agent/internal/prompt"
)

// Remote joins a remote AgentHooks service to a Set. Each call has Timeout
// as its deadline. A point the service does not implement (Unimplemented)
// delegates. Any other failure (deadline, unavailable, an error status)
// delegates when FailOpen is set; otherwise it fails closed: prompt-submit
// blocks the prompt, request-error fails the request, turn-continuation
// stops, turn-stop stops, and pre-step, post-step and session-start fail
// with an error (which ends the turn).
type Remote struct {
	Name     string
	Client   agentv1.AgentHooksClient
	Timeout  time.Duration
	FailOpen bool
	Logger   *slog.Logger

	// unimplemented remembers the points the remote answered Unimplemented
	// for, so they are not called again (one round trip per point, not per
	// step).
	unimplemented sync.Map // point name -> struct{}
}

func (r *Remote) skip(point string) bool {
	_, ok := r.unimplemented.Load(point)
	return ok
}

func (r *Remote) call(ctx context.Context) (context.Context, context.CancelFunc) {
	d := r.Timeout
	if d <= 0 {
		d = 5 * time.Second
	}
	return context.WithTimeout(ctx, d)
}

// failed reports whether err must be treated as a failure (false for
// Unimplemented, which delegates) and logs it.
func (r *Remote) failed(point string, err error) bool {
	if status.Code(err) == codes.Unimplemented {
		r.unimplemented.Store(point, struct{}{})
		return false
	}
	if r.Logger != nil {
		r.Logger.Warn("remote hook failed", "hook", r.Name, "point", point, "failOpen", r.FailOpen, "err", err)
	}
	return true
}

func (r *Remote) errorf(point string, err error) error {
	return fmt.Errorf("remote hook %s %s: %w", r.Name, point, err)
}

// Install adds the remote's links and listeners to s, after those already
// there.
func (r *Remote) Install(s *Set) {
	s.PromptSubmit.Use(r.promptSubmit)
	s.RequestError.Use(r.requestError)
	s.TurnContinuation.Use(r.turnContinuation)
	s.TurnStop.Use(r.turnStop)
	s.PromptSections.Use(r.promptSections)
	s.PreStep.Use(func(ctx context.Context, in *Step) ([]*toolsv1.HookContext, error) {
		if r.skip("pre-step") {
			return nil, nil
		}
		cctx, cancel := r.call(ctx)
		defer cancel()
		resp, err := r.Client.PreStep(cctx, &agentv1.PreStepRequest{SessionId: in.SessionID, Turn: in.Turn, Step: in.Step})
		return r.contexts("pre-step", resp.GetContexts(), err)
	})
	s.PostStep.Use(func(ctx context.Context, in *Step) ([]*toolsv1.HookContext, error) {
		if r.skip("post-step") {
			return nil, nil
		}
		cctx, cancel := r.call(ctx)
		defer cancel()
		resp, err := r.Client.PostStep(cctx, &agentv1.PostStepRequest{SessionId: in.SessionID, Turn: in.Turn, Step: in.Step})
		return r.contexts("post-step", resp.GetContexts(), err)
	})
	s.SessionStart.Use(func(ctx context.Context, in *SessionStart) ([]*toolsv1.HookContext, error) {
		if r.skip("session-start") {
			return nil, nil
		}
		cctx, cancel := r.call(ctx)
		defer cancel()
		resp, err := r.Client.SessionStart(cctx, &agentv1.SessionStartRequest{SessionId: in.SessionID, Source: in.Source})
		return r.contexts("session-start", resp.GetContexts(), err)
	})
}

// promptSections merges the remote's sections over the earlier links'; a
// failure fails the turn closed, or keeps the earlier sections open.
func (r *Remote) promptSections(ctx context.Context, in *PromptSections, next Next[*PromptSections, []prompt.Section]) ([]prompt.Section, error) {
	cur, err := next(ctx, in)
	if err != nil || r.skip("prompt-sections") {
		return cur, err
	}
	req := &agentv1.PromptSectionsRequest{SessionId: in.SessionID, Cwd: in.Cwd, Turn: in.Turn}
	for _, s := range cur {
		req.Current = append(req.Current, &agentv1.PromptSection{Name: s.Name, Order: s.Order, Text: s.Text, Literal: s.Literal})
	}
	cctx, cancel := r.call(ctx)
	defer cancel()
	resp, err := r.Client.PromptSections(cctx, req)
	if err != nil {
		if !r.failed("prompt-sections", err) || r.FailOpen {
			return cur, nil
		}
		return nil, r.errorf("prompt-sections", err)
	}
	add := make([]prompt.Section, 0, len(resp.GetSections()))
	for _, s := range resp.GetSections() {
		if s.GetName() == "" {
			return nil, r.errorf("prompt-sections", fmt.Errorf("a returned section has no name"))
		}
		add = append(add, prompt.Section{Name: s.GetName(), Order: s.GetOrder(), Text: s.GetText(), Literal: s.GetLiteral()})
	}
	return prompt.Override(cur, add), nil
}

func (r *Remote) contexts(point string, cs []*toolsv1.HookContext, err error) ([]*toolsv1.HookContext, error) {
	if err == nil {
		return cs, nil
	}
	if !r.failed(point, err) || r.FailOpen {
		return nil, nil
	}
	return nil, r.errorf(point, err)
}

func (r *Remote) promptSubmit(ctx context.Context, in *PromptSubmit, next Next[*PromptSubmit, *agentv1.PromptDecision]) (*agentv1.PromptDecision, error) {
	cur, err := next(ctx, in)
	if err != nil || cur.GetBlock() != nil || r.skip("prompt-submit") {
		return cur, err
	}
	cctx, cancel := r.call(ctx)
	defer cancel()
	resp, err := r.Client.PromptSubmit(cctx, &agentv1.PromptSubmitRequest{
		SessionId: in.SessionID, Turn: in.Turn, Content: in.Content, Source: in.Source, Current: cur})
	if err != nil {
		if !r.failed("prompt-submit", err) || r.FailOpen {
			return cur, nil
		}
		why := status.Convert(err).Message()
		if dl, ok := cctx.Deadline(); ok && !time.Now().Before(dl) && ctx.Err() == nil {
			// The hook's own deadline passed: say so, whichever way the
			// transport reported it (under load the server's reset can
			// arrive before the client's deadline timer fires).
			why = context.DeadlineExceeded.Error()
		}
		return Block(fmt.Sprintf("prompt hook %s unavailable: %v", r.Name, why)), nil
	}
	if d := resp.GetDecision(); d.GetAllow() != nil || d.GetBlock() != nil {
		return d, nil
	}
	return cur, nil
}

func (r *Remote) requestError(ctx context.Context, in *RequestError, next Next[*RequestError, *agentv1.RequestErrorDecision]) (*agentv1.RequestErrorDecision, error) {
	if r.skip("request-error") {
		return next(ctx, in)
	}
	cctx, cancel := r.call(ctx)
	defer cancel()
	resp, err := r.Client.RequestError(cctx, &agentv1.RequestErrorRequest{
		SessionId: in.SessionID, Turn: in.Turn, Step: in.Step, Failure: in.Failure, PriorFailures: in.PriorFailures})
	if err != nil {
		if !r.failed("request-error", err) || r.FailOpen {
			return next(ctx, in)
		}
		return Fail(), nil
	}
	if d := resp.GetDecision(); d.GetFail() != nil || d.GetRetry() != nil {
		return d, nil
	}
	return next(ctx, in)
}

func (r *Remote) turnContinuation(ctx context.Context, in *Continuation, next Next[*Continuation, *agentv1.ContinuationDecision]) (*agentv1.ContinuationDecision, error) {
	cur, err := next(ctx, in)
	if err != nil || r.skip("turn-continuation") {
		return cur, err
	}
	cctx, cancel := r.call(ctx)
	defer cancel()
	resp, err := r.Client.TurnContinuation(cctx, &agentv1.TurnContinuationRequest{SessionId: in.SessionID, Turn: in.Turn, Current: cur})
	if err != nil {
		if !r.failed("turn-continuation", err) || r.FailOpen {
			return cur, nil
		}
		return Stop(), nil
	}
	if d := resp.GetDecision(); d.GetStop() != nil || d.GetContinue() != nil {
		return d, nil
	}
	return cur, nil
}

func (r *Remote) turnStop(ctx context.Context, in *TurnStop) (bool, error) {
	if r.skip("turn-stop") {
		return false, nil
	}
	cctx, cancel := r.call(ctx)
	defer cancel()
	resp, err := r.Client.TurnStop(cctx, &agentv1.TurnStopRequest{SessionId: in.SessionID, Turn: in.Turn})
	if err != nil {
		if !r.failed("turn-stop", err) || r.FailOpen {
			return false, nil
		}
		return true, nil
	}
	return resp.GetStop(), nil
}

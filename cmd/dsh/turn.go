package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/dsh-dev/dsh/cmd/dsh/internal/render"
	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// sessionFlags are the flags that pick or create a session.
type sessionFlags struct {
	id, provider, model, cwd string
	approval                 sessionv1.ApprovalPolicy // unset: the deployment's
	rules                    []*sessionv1.ApprovalRule
}

// cwdFlag registers --cwd: a new session's working directory as the agent
// (its toolhosts) sees it. Empty by default, so the agent's --default-cwd
// applies: this machine's path means nothing to a remote agent (only `dsh
// dev`, which runs the toolhost here, sends the local directory).
func cwdFlag(e *env, fs *flag.FlagSet, f *sessionFlags) {
	fs.StringVar(&f.cwd, "cwd", envOr(e, "DSH_CWD", ""), "working directory of a new session, as the agent's toolhost sees it (default: the agent's --default-cwd; env DSH_CWD)")
}

// openSession returns the session named by f.id, or creates one.
func openSession(ctx context.Context, c agentv1.AgentServiceClient, f sessionFlags) (*agentv1.Session, error) {
	if f.id != "" {
		resp, err := c.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: f.id})
		if err != nil {
			return nil, rpcError("get session "+f.id, err)
		}
		return resp.GetSession(), nil
	}
	resp, err := c.CreateSession(ctx, &agentv1.CreateSessionRequest{
		RequestId: requestID(),
		Cwd:       f.cwd,
		Options:   &sessionv1.SessionOptions{Provider: f.provider, Model: f.model, WorkspaceRoot: f.cwd, Approval: f.approval, ApprovalRules: f.rules},
	})
	if err != nil {
		return nil, rpcError("create session", err)
	}
	return resp.GetSession(), nil
}

// follow streams a session's events from seq onward until ctx ends or the
// stream fails; the error channel gets exactly one value when it stops.
func follow(ctx context.Context, c agentv1.AgentServiceClient, id string, from int64) (<-chan *sessionv1.SessionEvent, <-chan error, error) {
	return followStream(ctx, c, &agentv1.StreamEventsRequest{SessionId: id, FromSeq: from},
		func(r *agentv1.StreamEventsResponse) (*sessionv1.SessionEvent, bool) {
			return r.GetEvent(), r.GetEvent() != nil
		})
}

// followStream streams req's responses, each picked into a T (or skipped),
// until ctx ends or the stream fails; the error channel gets exactly one
// value when it stops.
func followStream[T any](ctx context.Context, c agentv1.AgentServiceClient, req *agentv1.StreamEventsRequest, pick func(*agentv1.StreamEventsResponse) (T, bool)) (<-chan T, <-chan error, error) {
	stream, err := c.StreamEvents(ctx, req)
	if err != nil {
		return nil, nil, rpcError("stream events", err)
	}
	evc := make(chan T, 256)
	errc := make(chan error, 1)
	go func() {
		defer close(evc)
		for {
			resp, err := stream.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = errors.New("the agent ended the event stream")
				}
				errc <- err
				return
			}
			v, ok := pick(resp)
			if !ok {
				continue
			}
			select {
			case evc <- v:
			case <-ctx.Done():
				errc <- ctx.Err()
				return
			}
		}
	}()
	return evc, errc, nil
}

func textPrompt(s string) []*llmv1.ContentBlock {
	return []*llmv1.ContentBlock{{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}}
}

// turnResult is how one prompt's turn ended.
type turnResult struct {
	end    *sessionv1.TurnEnd
	answer string
}

func (r turnResult) completed() bool {
	_, ok := r.end.GetReason().GetKind().(*sessionv1.TurnEndReason_Completed)
	return ok
}

// waitTurn consumes events until the turn/end of the first turn that starts
// at or after the stream position, calling onEvent for each event.
func waitTurn(ctx context.Context, evc <-chan *sessionv1.SessionEvent, errc <-chan error, onEvent func(*sessionv1.SessionEvent)) (turnResult, error) {
	var res turnResult
	turn := int32(-1)
	for {
		select {
		case ev, ok := <-evc:
			if !ok {
				return res, fmt.Errorf("event stream: %w", <-errc)
			}
			if onEvent != nil {
				onEvent(ev)
			}
			switch p := ev.GetPayload().(type) {
			case *sessionv1.SessionEvent_TurnStart:
				if turn < 0 {
					turn = p.TurnStart.GetTurn()
				}
			case *sessionv1.SessionEvent_AssistantMessage:
				if p.AssistantMessage.GetTurn() == turn {
					if t := render.AnswerText(p.AssistantMessage); strings.TrimSpace(t) != "" {
						res.answer = t
					}
				}
			case *sessionv1.SessionEvent_TurnEnd:
				if p.TurnEnd.GetTurn() == turn {
					res.end = p.TurnEnd
					return res, nil
				}
			}
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
}

// oneShot sends prompt to the session and waits for its turn to end.
func oneShot(ctx context.Context, c agentv1.AgentServiceClient, s *agentv1.Session, prompt string, onEvent func(*sessionv1.SessionEvent)) (turnResult, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	id := s.GetHeader().GetId()
	evc, errc, err := follow(sctx, c, id, s.GetNextSeq())
	if err != nil {
		return turnResult{}, err
	}
	if _, err := c.Send(ctx, &agentv1.SendRequest{SessionId: id, Content: textPrompt(prompt), RequestId: requestID()}); err != nil {
		return turnResult{}, rpcError("send", err)
	}
	return waitTurn(ctx, evc, errc, onEvent)
}

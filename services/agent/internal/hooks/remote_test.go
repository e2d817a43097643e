package hooks_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
	"github.com/dsh-dev/dsh/services/agent/internal/hooks"
)

type policy struct {
	agentv1.UnimplementedAgentHooksServer
	preStepCalls atomic.Int64
}

func (p *policy) PromptSubmit(_ context.Context, req *agentv1.PromptSubmitRequest) (*agentv1.PromptSubmitResponse, error) {
	if req.GetContent()[0].GetText().GetText() == "rm -rf /" {
		return &agentv1.PromptSubmitResponse{Decision: hooks.Block("dangerous")}, nil
	}
	return &agentv1.PromptSubmitResponse{}, nil
}

func (p *policy) RequestError(_ context.Context, req *agentv1.RequestErrorRequest) (*agentv1.RequestErrorResponse, error) {
	if req.GetFailure().GetCode() == "QUOTA" {
		return &agentv1.RequestErrorResponse{Decision: hooks.Retry()}, nil
	}
	return &agentv1.RequestErrorResponse{}, nil
}

func (p *policy) PreStep(context.Context, *agentv1.PreStepRequest) (*agentv1.PreStepResponse, error) {
	p.preStepCalls.Add(1)
	return nil, status.Error(codes.Unimplemented, "not here")
}

func (p *policy) PostStep(context.Context, *agentv1.PostStepRequest) (*agentv1.PostStepResponse, error) {
	return &agentv1.PostStepResponse{Contexts: []*toolsv1.HookContext{{Content: []*llmv1.ContentBlock{fakes.TextContent("checked")}}}}, nil
}

func TestRemoteHooks(t *testing.T) {
	t.Parallel()
	p := &policy{}
	addr := fakes.Serve(t, func(s *grpc.Server) { agentv1.RegisterAgentHooksServer(s, p) })
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	var set hooks.Set
	(&hooks.Remote{Name: "policy", Client: agentv1.NewAgentHooksClient(conn), Timeout: 5 * time.Second}).Install(&set)
	ctx := t.Context()

	allow := func(_ context.Context, in *hooks.PromptSubmit) (*agentv1.PromptDecision, error) {
		return hooks.Allow(in.Contexts), nil
	}
	text := func(s string) []*llmv1.ContentBlock { return []*llmv1.ContentBlock{fakes.TextContent(s)} }
	if d, err := set.PromptSubmit.Run(ctx, &hooks.PromptSubmit{Content: text("rm -rf /")}, allow); err != nil || d.GetBlock().GetReason() != "dangerous" {
		t.Errorf("block: %v %v", d, err)
	}
	if d, err := set.PromptSubmit.Run(ctx, &hooks.PromptSubmit{Content: text("ls")}, allow); err != nil || d.GetAllow() == nil {
		t.Errorf("absent decision keeps the current one: %v %v", d, err)
	}
	fail := func(context.Context, *hooks.RequestError) (*agentv1.RequestErrorDecision, error) {
		return hooks.Fail(), nil
	}
	if d, _ := set.RequestError.Run(ctx, &hooks.RequestError{Failure: &llmv1.LlmFailure{Code: "QUOTA", Message: "x"}}, fail); d.GetRetry() == nil {
		t.Errorf("remote retry: %v", d)
	}
	if d, _ := set.RequestError.Run(ctx, &hooks.RequestError{Failure: &llmv1.LlmFailure{Code: "AUTH", Message: "x"}}, fail); d.GetFail() == nil {
		t.Errorf("delegated fail: %v", d)
	}
	for range 3 {
		if cs, err := set.PreStep.Run(ctx, &hooks.Step{Turn: 1, Step: 1}); err != nil || len(cs) != 0 {
			t.Fatalf("unimplemented pre-step: %v %v", cs, err)
		}
	}
	if n := p.preStepCalls.Load(); n != 1 {
		t.Errorf("an unimplemented point was called %d times, want once", n)
	}
	if cs, err := set.PostStep.Run(ctx, &hooks.Step{Turn: 1, Step: 1}); err != nil || len(cs) != 1 {
		t.Errorf("post-step contexts: %v %v", cs, err)
	}
}

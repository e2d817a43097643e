package agent_test

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
	"github.com/dsh-dev/dsh/services/toolhost/toolhosttest"
)

// restartingGateway forwards Generate to a first gateway for the first
// `after` calls and to a second (which remembers nothing: a restarted or
// another replica) afterwards, counting what each answered.
type restartingGateway struct {
	llmv1.UnimplementedLlmGatewayServer
	gws                   [2]llmv1.LlmGatewayClient
	after                 int32
	calls, misses, served atomic.Int32
	referenced            atomic.Int32
}

func (g *restartingGateway) ListProviders(ctx context.Context, req *llmv1.ListProvidersRequest) (*llmv1.ListProvidersResponse, error) {
	return g.gws[0].ListProviders(ctx, req)
}

func (g *restartingGateway) GetModelContext(ctx context.Context, req *llmv1.GetModelContextRequest) (*llmv1.GetModelContextResponse, error) {
	return g.gws[0].GetModelContext(ctx, req)
}

func (g *restartingGateway) Generate(req *llmv1.GenerateRequest, stream grpc.ServerStreamingServer[llmv1.GenerateResponse]) error {
	gw := g.gws[0]
	if g.calls.Add(1) > g.after {
		gw = g.gws[1]
	}
	if req.GetPrefix() != nil {
		g.referenced.Add(1)
	}
	s, err := gw.Generate(stream.Context(), req)
	if err != nil {
		return err
	}
	for first := true; ; first = false {
		resp, err := s.Recv()
		if first {
			if md, herr := s.Header(); herr == nil && len(md) > 0 {
				if err := stream.SendHeader(md); err != nil {
					return err
				}
			}
		}
		if errors.Is(err, io.EOF) {
			g.served.Add(1)
			return nil
		}
		if err != nil {
			if status.Code(err) == codes.FailedPrecondition {
				g.misses.Add(1)
			}
			return err
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// TestPrefixGatewayRestartMidTurn: the gateway restarts in the middle of a
// turn of tool steps. The step after the restart names a conversation the
// new gateway does not hold; the agent sends it whole, transparently: the
// turn completes, the provider answered each step exactly once, the log
// holds each step's chunks once (the agent runs with its debug invariant
// checks: the log's grammar and the request equation at every step), and
// the steps after the resend are incremental again.
func TestPrefixGatewayRestartMidTurn(t *testing.T) {
	t.Parallel()
	const script = `{"turns": [[
 {"text": "one", "tool_calls": [{"id": "c1", "name": "bash", "arguments": {"command": "echo 1", "description": "one"}}]},
 {"tool_calls": [{"id": "c2", "name": "bash", "arguments": {"command": "echo 2", "description": "two"}}]},
 {"tool_calls": [{"id": "c3", "name": "bash", "arguments": {"command": "echo 3", "description": "three"}}]},
 {"tool_calls": [{"id": "c4", "name": "bash", "arguments": {"command": "echo 4", "description": "four"}}]},
 {"text": "done"}]]}`
	rg := &restartingGateway{after: 2}
	for i := range rg.gws {
		gw := scriptedGateway(t, script)
		conn, err := grpcserver.Dial(fakes.Serve(t, gw.Register))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		rg.gws[i] = llmv1.NewLlmGatewayClient(conn)
	}
	host := toolhosttest.Start(t)
	p := startAgent(t, backend{gwAddr: fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, rg) }), thAddr: host.Addr}, t.TempDir())
	ctx := t.Context()
	if _, err := p.client.CreateSession(ctx, &agentv1.CreateSessionRequest{SessionId: "r", Cwd: host.Workspace,
		Options: &sessionv1.SessionOptions{Provider: "scripted", Model: "scripted"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.client.Send(ctx, &agentv1.SendRequest{SessionId: "r", Content: []*llmv1.ContentBlock{session.Text("count")}}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err := p.client.WaitIdle(wctx, &agentv1.WaitIdleRequest{SessionId: "r"}); err != nil {
		t.Fatal(err)
	}
	evs := streamAll(t, p.client, "r")
	if end := evs[len(evs)-1].GetTurnEnd(); end.GetReason().GetCompleted() == nil {
		t.Fatalf("turn ended %v", evs[len(evs)-1])
	}
	var steps, results, finishes int
	for _, ev := range evs {
		switch {
		case ev.GetStepStart() != nil:
			steps++
		case ev.GetToolResult() != nil:
			results++
		}
		for c := range session.Chunks(ev.GetAssistantChunk()) {
			if c.GetFinish() != nil {
				finishes++
			}
		}
	}
	if steps != 5 || results != 4 || finishes != 5 {
		t.Errorf("log: %d steps, %d tool results, %d finish chunks; want 5, 4, 5", steps, results, finishes)
	}
	// Five steps answered once each, one refused reference (the first
	// step after the restart) sent again whole.
	if s, m := rg.served.Load(), rg.misses.Load(); s != 5 || m != 1 {
		t.Errorf("gateways served %d requests and refused %d; want 5 and 1", s, m)
	}
	// Steps 2 and 3 (first gateway), the refused one, and step 5 (the
	// second gateway, after the resend) named a conversation.
	if r := rg.referenced.Load(); r != 4 {
		t.Errorf("%d requests named a conversation, want 4", r)
	}
}

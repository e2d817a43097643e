package agent_test

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
	"github.com/dsh-dev/dsh/services/llmgateway"
	"github.com/dsh-dev/dsh/services/toolhost/toolhosttest"
)

// backend is what the end-to-end flow runs against.
type backend struct {
	gwAddr, thAddr  string
	provider, model string
	cwd             string
	titles          bool // session titles on (off by default: a title call would consume a scripted fake response)
}

// agentProc is an in-process agent (agent.Run) on a loopback port.
type agentProc struct {
	client agentv1.AgentServiceClient
	cancel context.CancelFunc
	done   chan error
}

func startAgent(t *testing.T, b backend, dir string) *agentProc {
	t.Helper()
	return startAgentWith(t, b, dir, nil)
}

// startAgentWith is startAgent with the ServerConfig adjusted by edit.
func startAgentWith(t *testing.T, b backend, dir string, edit func(*agent.ServerConfig)) *agentProc {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &agentProc{cancel: cancel, done: make(chan error, 1)}
	sc := agent.ServerConfig{Listener: lis, Gateway: b.gwAddr, Toolhosts: []string{"main=" + b.thAddr},
		DataDir: dir, Service: agent.Config{Debug: true}, ShutdownTimeout: 10 * time.Second, NoTitles: !b.titles}
	if edit != nil {
		edit(&sc)
	}
	go func() { p.done <- agent.Run(ctx, sc, slog.New(slog.DiscardHandler)) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	p.client = agentv1.NewAgentServiceClient(conn)
	t.Cleanup(func() { p.stop(t) })
	return p
}

func (p *agentProc) stop(t *testing.T) {
	if p.cancel == nil {
		return
	}
	p.cancel()
	if err := <-p.done; err != nil {
		t.Errorf("agent.Run: %v", err)
	}
	p.cancel = nil
}

// follow streams a session's events into a channel until ctx ends.
func follow(t *testing.T, ctx context.Context, c agentv1.AgentServiceClient, id string) <-chan *sessionv1.SessionEvent {
	t.Helper()
	st, err := c.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: id})
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan *sessionv1.SessionEvent, 1024)
	go func() {
		defer close(ch)
		for {
			resp, err := st.Recv()
			if err != nil {
				return
			}
			ch <- resp.GetEvent()
		}
	}()
	return ch
}

// until reads events until pred matches one, returning everything read.
func until(t *testing.T, ch <-chan *sessionv1.SessionEvent, what string, pred func(*sessionv1.SessionEvent) bool) []*sessionv1.SessionEvent {
	t.Helper()
	var out []*sessionv1.SessionEvent
	timeout := time.After(60 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("stream ended before %s; got %v", what, types(out))
			}
			out = append(out, ev)
			if pred(ev) {
				return out
			}
		case <-timeout:
			t.Fatalf("timed out waiting for %s; got %v", what, types(out))
		}
	}
}

func turnEnd(turn int32) func(*sessionv1.SessionEvent) bool {
	return func(ev *sessionv1.SessionEvent) bool { return ev.GetTurnEnd().GetTurn() == turn }
}

// runDoneWhen is the acceptance flow: create a session, send a
// prompt, stream the events of a multi-step tool-using turn, cancel a second
// turn mid-tool, restart the agent on the same data dir, continue.
func runDoneWhen(t *testing.T, b backend) {
	dir := t.TempDir()
	p := startAgent(t, b, dir)
	ctx := t.Context()
	created, err := p.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Cwd: b.cwd,
		Options: &sessionv1.SessionOptions{Provider: b.provider, Model: b.model}})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetSession().GetHeader().GetId()
	sctx, stopStream := context.WithCancel(ctx)
	events := follow(t, sctx, p.client, id)

	send := func(text string) {
		if _, err := p.client.Send(ctx, &agentv1.SendRequest{SessionId: id, Content: []*llmv1.ContentBlock{session.Text(text)}}); err != nil {
			t.Fatal(err)
		}
	}
	send("write a file and read it back")
	turn1 := until(t, events, "turn 1 to end", turnEnd(1))
	calls, steps := 0, 0
	for _, ev := range turn1 {
		if ev.GetToolCall() != nil {
			calls++
		}
		if r := ev.GetToolResult(); r != nil && r.GetIsError() {
			t.Errorf("tool failed: %v", r)
		}
		if ev.GetStepStart() != nil {
			steps++
		}
	}
	if calls < 2 || steps < 3 || turn1[len(turn1)-1].GetTurnEnd().GetReason().GetCompleted() == nil {
		t.Fatalf("turn 1: %d calls, %d steps, ended %v", calls, steps, turn1[len(turn1)-1])
	}

	send("now wait for a long time")
	until(t, events, "the long tool call", func(ev *sessionv1.SessionEvent) bool { return ev.GetToolCall() != nil })
	time.Sleep(50 * time.Millisecond) // let the body start; a cancel before it is also correct
	if resp, err := p.client.Cancel(ctx, &agentv1.CancelRequest{SessionId: id}); err != nil || !resp.GetEffective() {
		t.Fatalf("cancel: %v %v", resp, err)
	}
	turn2 := until(t, events, "turn 2 to end", turnEnd(2))
	var result *sessionv1.ToolResult
	for _, ev := range turn2 {
		if r := ev.GetToolResult(); r != nil {
			result = r
		}
	}
	if c := result.GetError().GetCode(); c != "ABORTED" && c != "ABORTED_BEFORE_DISPATCH" {
		t.Errorf("cancelled call result %v", result)
	}
	if turn2[len(turn2)-1].GetTurnEnd().GetReason().GetAborted() == nil {
		t.Fatalf("turn 2 ended %v", turn2[len(turn2)-1])
	}
	stopStream()

	p.stop(t)
	p = startAgent(t, b, dir)
	if _, err := p.client.Send(ctx, &agentv1.SendRequest{SessionId: id, Content: []*llmv1.ContentBlock{session.Text("are you still there?")}}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err := p.client.WaitIdle(wctx, &agentv1.WaitIdleRequest{SessionId: id}); err != nil {
		t.Fatal(err)
	}
	all := streamAll(t, p.client, id)
	if err := session.CheckLog(all); err != nil {
		t.Fatal(err)
	}
	last := all[len(all)-1].GetTurnEnd()
	if last.GetTurn() != 3 || last.GetReason().GetCompleted() == nil {
		t.Fatalf("turn 3 ended %v", all[len(all)-1])
	}
	resumed := false
	for _, ev := range all {
		if ev.GetRequestHeader().GetReason() == sessionv1.HeaderReason_HEADER_REASON_RESUME {
			resumed = true
		}
	}
	if !resumed {
		t.Error("the restarted agent did not log a resume request/header")
	}
}

func TestE2EWithFakes(t *testing.T) {
	t.Parallel()
	gw := &fakes.Gateway{}
	host := fakes.NewToolHost(fakes.Tool{Name: "echo"}, fakes.Tool{Name: "slow", Run: func(ctx context.Context, _ *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
		<-ctx.Done()
		return nil
	}})
	gw.Script(
		fakes.Response{Chunks: fakes.ToolCalls("writing", fakes.Call{ID: "c1", Name: "echo", Args: `{"write":"a.txt"}`})},
		fakes.Response{Chunks: fakes.ToolCalls("reading", fakes.Call{ID: "c2", Name: "echo", Args: `{"read":"a.txt"}`})},
		fakes.Response{Chunks: fakes.Text("The file says hello.")},
		fakes.Response{Chunks: fakes.ToolCalls("", fakes.Call{ID: "c3", Name: "slow", Args: `{}`})},
		fakes.Response{Chunks: fakes.Text("Still here.")},
	)
	runDoneWhen(t, backend{
		gwAddr:   fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) }),
		thAddr:   fakes.Serve(t, func(s *grpc.Server) { toolsv1.RegisterToolHostServer(s, host) }),
		provider: "fake", model: "m1", cwd: "/work",
	})
}

const e2eScript = `{"turns": [
 [ {"text": "I'll write a file.", "tool_calls": [{"id": "c1", "name": "bash", "arguments": {"command": "echo hello > a.txt", "description": "write a file"}}]},
   {"tool_calls": [{"id": "c2", "name": "bash", "arguments": {"command": "cat a.txt", "description": "read it back"}}]},
   {"text": "The file says hello."} ],
 [ {"tool_calls": [{"id": "c3", "name": "bash", "arguments": {"command": "sleep 30", "description": "wait a long time"}}]} ],
 [ {"text": "Still here after the restart."} ]
]}`

// TestE2EWithRealServices runs the flow against the real gateway (scripted
// route) and the real built-in toolhost (bash in a temp workspace).
func TestE2EWithRealServices(t *testing.T) {
	t.Parallel()
	gw := scriptedGateway(t, e2eScript)
	host := toolhosttest.Start(t)
	runDoneWhen(t, backend{
		gwAddr:   fakes.Serve(t, gw.Register),
		thAddr:   host.Addr,
		provider: "scripted", model: "scripted", cwd: host.Workspace,
	})
}

// TestMalformedArgumentsReachTheTool: the model's broken argument JSON goes
// to the real toolhost as the raw string and comes back as an INVALID_ARGS
// result; the turn continues.
func TestMalformedArgumentsReachTheTool(t *testing.T) {
	t.Parallel()
	gw := &fakes.Gateway{}
	gw.Script(
		fakes.Response{Chunks: fakes.ToolCalls("", fakes.Call{ID: "b1", Name: "bash", Args: `{"command": "echo hi", `},
			fakes.Call{ID: "b2", Name: "bash", Args: `{"description":"no command"}`})},
		fakes.Response{Chunks: fakes.Text("I will fix my arguments.")},
	)
	host := toolhosttest.Start(t)
	p := startAgent(t, backend{gwAddr: fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) }),
		thAddr: host.Addr}, t.TempDir())
	ctx := t.Context()
	if _, err := p.client.CreateSession(ctx, &agentv1.CreateSessionRequest{SessionId: "m", Cwd: host.Workspace,
		Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.client.Send(ctx, &agentv1.SendRequest{SessionId: "m", Content: []*llmv1.ContentBlock{session.Text("run it")}}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err := p.client.WaitIdle(wctx, &agentv1.WaitIdleRequest{SessionId: "m"}); err != nil {
		t.Fatal(err)
	}
	evs := streamAll(t, p.client, "m")
	var codes []string
	for _, ev := range evs {
		if r := ev.GetToolResult(); r != nil {
			codes = append(codes, r.GetError().GetCode())
		}
	}
	if !slicesEqual(codes, []string{"INVALID_ARGS", "INVALID_ARGS"}) {
		t.Errorf("result codes %v", codes)
	}
	if end := evs[len(evs)-1].GetTurnEnd(); end.GetReason().GetCompleted() == nil {
		t.Errorf("turn ended %v", evs[len(evs)-1])
	}
}

// scriptedGateway is a real gateway in this process whose one route,
// "scripted", plays script; it closes when the test ends. Register it on a
// server (fakes.Serve(t, gw.Register)).
func scriptedGateway(t *testing.T, script string) *llmgateway.Service {
	t.Helper()
	gw, err := llmgateway.New(llmgateway.Config{Routes: []llmgateway.RouteConfig{{Name: "scripted", Kind: "scripted", Script: script}}},
		slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	return gw
}

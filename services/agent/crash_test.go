package agent_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/pgtest"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
)

// TestMain lets the test binary double as the agent process of the crash
// test: with DSH_AGENT_CHILD set it runs agent.Run until killed.
func TestMain(m *testing.M) {
	if os.Getenv("DSH_AGENT_CHILD") != "" {
		childMain()
		return
	}
	// A PostgreSQL server only once a test or benchmark asks for one
	// (replicas, BenchmarkStepStores): starting one costs seconds most
	// tests do not need.
	os.Exit(pgtest.Lazy(m))
}

func childMain() {
	sc := agent.ServerConfig{
		Listen: "127.0.0.1:0", Gateway: os.Getenv("DSH_AGENT_GATEWAY"), Toolhosts: []string{"fake=" + os.Getenv("DSH_AGENT_TOOLHOST")},
		DataDir: os.Getenv("DSH_AGENT_DATA"), Store: os.Getenv("DSH_AGENT_STORE"),
		Service: agent.Config{Debug: true, DefaultCwd: "/work"},
		Ready:   func(addr string) { fmt.Println("READY " + addr) },
		// No title calls: they would consume the fake gateway's script.
		NoTitles: true,
	}
	if os.Getenv("DSH_AGENT_ASK") != "" {
		sc.Service.Approval.Rules = agent.DefaultApprovalRules()
	}
	if err := agent.Run(context.Background(), sc, slog.New(slog.NewTextHandler(os.Stderr, nil))); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(1)
	}
}

type child struct {
	cmd    *exec.Cmd
	client agentv1.AgentServiceClient
}

func startChild(t *testing.T, gw, th, dir, store string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "DSH_AGENT_CHILD=1", "DSH_AGENT_GATEWAY="+gw, "DSH_AGENT_TOOLHOST="+th,
		"DSH_AGENT_DATA="+dir, "DSH_AGENT_STORE="+store)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if addr, ok := strings.CutPrefix(sc.Text(), "READY "); ok {
				ready <- addr
			}
		}
	}()
	var addr string
	select {
	case addr = <-ready:
	case <-time.After(60 * time.Second):
		t.Fatal("child agent did not become ready")
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &child{cmd: cmd, client: agentv1.NewAgentServiceClient(conn)}
}

func (c *child) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestCrashRecovery(t *testing.T) {
	t.Parallel()
	type point struct {
		name  string
		store string
		// arm scripts the gateway and returns a condition that holds once
		// the agent is at the kill point.
		arm func(gw *fakes.Gateway, host *fakes.ToolHost, released <-chan struct{}) func() bool
		// check inspects the repaired turn's closing events.
		check func(t *testing.T, tail []*sessionv1.SessionEvent)
	}
	points := []point{
		{
			name: "mid_tool", store: "sqlite",
			arm: func(gw *fakes.Gateway, host *fakes.ToolHost, _ <-chan struct{}) func() bool {
				gw.Script(fakes.Response{Chunks: fakes.ToolCalls("", fakes.Call{ID: "c1", Name: "hang", Args: `{}`}, fakes.Call{ID: "c2", Name: "hang", Args: `{}`})})
				return func() bool { return len(host.Executed()) == 1 }
			},
			check: func(t *testing.T, tail []*sessionv1.SessionEvent) {
				want := []string{"tool/call", "tool/result", "tool/result", "step/end", "turn/end"}
				if got := types(tail[len(tail)-5:]); !slicesEqual(got, want) {
					t.Fatalf("tail %v, want %v", got, want)
				}
				r1, r2 := tail[len(tail)-4].GetToolResult(), tail[len(tail)-3].GetToolResult()
				if r1.GetCallId() != "c1" || r1.GetError().GetCode() != session.ToolOutcomeUnknownCode {
					t.Errorf("c1 result %v", r1)
				}
				if r2.GetCallId() != "c2" || r2.GetError().GetCode() != session.ToolNotStartedCode {
					t.Errorf("c2 result %v", r2)
				}
			},
		},
		{
			name: "mid_stream", store: "jsonl",
			arm: func(gw *fakes.Gateway, _ *fakes.ToolHost, _ <-chan struct{}) func() bool {
				gw.Script(fakes.Response{Chunks: fakes.TextBlock(0, "half")[:2], Block: true})
				n := len(gw.Requests())
				return func() bool { return len(gw.Requests()) == n+1 }
			},
			check: func(t *testing.T, tail []*sessionv1.SessionEvent) {
				if got := types(tail[len(tail)-2:]); !slicesEqual(got, []string{"step/end", "turn/end"}) {
					t.Fatalf("tail %v", got)
				}
			},
		},
	}
	for _, p := range points {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			gw := &fakes.Gateway{}
			host := fakes.NewToolHost(fakes.Tool{Name: "hang", Run: func(ctx context.Context, _ *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
				<-ctx.Done()
				return nil
			}})
			gwAddr := fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) })
			thAddr := fakes.Serve(t, func(s *grpc.Server) { toolsv1.RegisterToolHostServer(s, host) })
			dir := t.TempDir()

			c := startChild(t, gwAddr, thAddr, dir, p.store)
			ctx := t.Context()
			if _, err := c.client.CreateSession(ctx, &agentv1.CreateSessionRequest{SessionId: "crash",
				Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}}); err != nil {
				t.Fatal(err)
			}
			// One complete turn first, so the crash hits the second.
			gw.Script(fakes.Response{Chunks: fakes.Text("warm")})
			if _, err := c.client.Send(ctx, &agentv1.SendRequest{SessionId: "crash", Content: []*llmv1.ContentBlock{session.Text("one")}}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.client.WaitIdle(ctx, &agentv1.WaitIdleRequest{SessionId: "crash"}); err != nil {
				t.Fatal(err)
			}
			atPoint := p.arm(gw, host, nil)
			if _, err := c.client.Send(ctx, &agentv1.SendRequest{SessionId: "crash", Content: []*llmv1.ContentBlock{session.Text("two")}}); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "the kill point", atPoint)
			c.kill(t)

			c = startChild(t, gwAddr, thAddr, dir, p.store)
			events := streamAll(t, c.client, "crash")
			if err := session.CheckLog(events); err != nil {
				t.Fatalf("invariants after repair: %v", err)
			}
			last := events[len(events)-1].GetTurnEnd()
			if last.GetTurn() != 2 || last.GetReason().GetInterrupted() == nil {
				t.Fatalf("last event %v, want turn/end 2 interrupted", events[len(events)-1])
			}
			p.check(t, events)

			gw.Script(fakes.Response{Chunks: fakes.Text("back")})
			if _, err := c.client.Send(ctx, &agentv1.SendRequest{SessionId: "crash", Content: []*llmv1.ContentBlock{session.Text("three")}}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.client.WaitIdle(ctx, &agentv1.WaitIdleRequest{SessionId: "crash"}); err != nil {
				t.Fatal(err)
			}
			events = streamAll(t, c.client, "crash")
			if err := session.CheckLog(events); err != nil {
				t.Fatal(err)
			}
			if last := events[len(events)-1].GetTurnEnd(); last.GetTurn() != 3 || last.GetReason().GetCompleted() == nil {
				t.Fatalf("turn after restart ended %v", events[len(events)-1])
			}
		})
	}
}

func streamAll(t *testing.T, c agentv1.AgentServiceClient, id string) []*sessionv1.SessionEvent {
	t.Helper()
	st, err := c.StreamEvents(t.Context(), &agentv1.StreamEventsRequest{SessionId: id, NoFollow: true})
	if err != nil {
		t.Fatal(err)
	}
	var out []*sessionv1.SessionEvent
	for {
		resp, err := st.Recv()
		if err != nil {
			return out
		}
		out = append(out, resp.GetEvent())
	}
}

func slicesEqual(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }

// TestCrashAtRandomPoints kills the agent at random moments of a multi-step
// tool turn: every reload satisfies the invariants, ends with a closed turn
// (completed if the kill came late, interrupted otherwise) and accepts a new
// send.
func TestCrashAtRandomPoints(t *testing.T) {
	t.Parallel()
	gw := &fakes.Gateway{}
	host := fakes.NewToolHost(fakes.Tool{Name: "nap", Parallel: true, Run: func(ctx context.Context, _ *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
		select {
		case <-time.After(3 * time.Millisecond):
		case <-ctx.Done():
			return nil
		}
		return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{session.Text("rested")}}
	}})
	gwAddr := fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) })
	thAddr := fakes.Serve(t, func(s *grpc.Server) { toolsv1.RegisterToolHostServer(s, host) })
	step := 0
	var mu sync.Mutex
	gw.Default = func(*llmv1.GenerateRequest) fakes.Response {
		mu.Lock()
		defer mu.Unlock()
		step++
		if step%3 == 0 {
			return fakes.Response{Chunks: fakes.Text("rested enough")}
		}
		id := fmt.Sprintf("n%d", step)
		return fakes.Response{Chunks: fakes.ToolCalls("napping", fakes.Call{ID: id + "a", Name: "nap", Args: `{}`}, fakes.Call{ID: id + "b", Name: "nap", Args: `{}`})}
	}
	dir := t.TempDir()
	c := startChild(t, gwAddr, thAddr, dir, "sqlite")
	ctx := t.Context()
	if _, err := c.client.CreateSession(ctx, &agentv1.CreateSessionRequest{SessionId: "r", Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}}); err != nil {
		t.Fatal(err)
	}
	// A session is materialised by its first durable events: run one turn
	// (its turn/end flush completes before the session reports idle).
	if _, err := c.client.Send(ctx, &agentv1.SendRequest{SessionId: "r", Content: []*llmv1.ContentBlock{session.Text("warm up")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.client.WaitIdle(ctx, &agentv1.WaitIdleRequest{SessionId: "r"}); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if _, err := c.client.Send(ctx, &agentv1.SendRequest{SessionId: "r", Content: []*llmv1.ContentBlock{session.Text(fmt.Sprint("go ", i))}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond) // the kill point
		c.kill(t)
		c = startChild(t, gwAddr, thAddr, dir, "sqlite")
		events := streamAll(t, c.client, "r")
		if err := session.CheckLog(events); err != nil {
			t.Fatalf("iteration %d: invariants after repair: %v", i, err)
		}
		if len(events) > 0 {
			if end := events[len(events)-1].GetTurnEnd(); end == nil || (end.GetReason().GetInterrupted() == nil && end.GetReason().GetCompleted() == nil) {
				t.Fatalf("iteration %d: log ends with %v", i, events[len(events)-1])
			}
		}
	}
	if _, err := c.client.Send(ctx, &agentv1.SendRequest{SessionId: "r", Content: []*llmv1.ContentBlock{session.Text("final")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.client.WaitIdle(ctx, &agentv1.WaitIdleRequest{SessionId: "r"}); err != nil {
		t.Fatal(err)
	}
	events := streamAll(t, c.client, "r")
	if err := session.CheckLog(events); err != nil {
		t.Fatal(err)
	}
	if end := events[len(events)-1].GetTurnEnd(); end.GetReason().GetCompleted() == nil {
		t.Fatalf("final turn ended %v", events[len(events)-1])
	}
}

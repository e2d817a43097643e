package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
)

// startCompactAgent runs agent.Run in process on loopback against gwAddr and
// a fake toolhost serving tools, SQLite at NORMAL (the dsh dev setting).
func startCompactAgent(t *testing.T, gwAddr string, tools ...fakes.Tool) agentv1.AgentServiceClient {
	t.Helper()
	th := fakes.Serve(t, func(s *grpc.Server) { toolsv1.RegisterToolHostServer(s, fakes.NewToolHost(tools...)) })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(ctx, agent.ServerConfig{Listener: lis, Gateway: gwAddr, Toolhosts: []string{"main=" + th},
			DataDir: t.TempDir(), Synchronous: "NORMAL", Service: agent.Config{Debug: true}, ShutdownTimeout: 10 * time.Second, NoTitles: true},
			slog.New(slog.DiscardHandler))
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent.Run: %v", err)
		}
	})
	return agentv1.NewAgentServiceClient(conn)
}

func waitIdle(t *testing.T, c agentv1.AgentServiceClient, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	if _, err := c.WaitIdle(ctx, &agentv1.WaitIdleRequest{SessionId: id}); err != nil {
		t.Fatal(err)
	}
}

// longRunScript is a sequential scripted task of n tool steps and a final
// answer on a model with a small context window.
func longRunScript(n int, window int64) string {
	type call struct {
		Name      string `json:"name"`
		Arguments any    `json:"arguments"`
	}
	type step struct {
		Text      string `json:"text,omitempty"`
		ToolCalls []call `json:"tool_calls,omitempty"`
	}
	steps := make([]step, 0, n+1)
	for i := range n {
		steps = append(steps, step{Text: fmt.Sprintf("Step %d: reading the next chunk.", i+1),
			ToolCalls: []call{{Name: "produce", Arguments: map[string]int{"chunk": i + 1}}}})
	}
	steps = append(steps, step{Text: "All chunks processed."})
	b, _ := json.Marshal(map[string]any{"sequential": true, "steps": steps,
		"models": []map[string]any{{"id": "small", "context_window": window}}})
	return string(b)
}

// produce returns a large output (about 400 tokens) per call.
var produce = fakes.Tool{Name: "produce", Run: func(_ context.Context, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
	return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{session.Text(ex.GetArguments() + "\n" + strings.Repeat("lorem ipsum dolor sit amet ", 60))}}
}}

// TestLongRunSmallWindow is the long run: a 300-step tool task
// with large outputs on a 4,000-token window completes in one turn without
// a failed request; every request fits the window (the scripted provider
// enforces it with the meter's own estimate, so an overflow would show as
// a CONTEXT_WINDOW_EXCEEDED finish); the checkers run on every request
// (debug mode).
func TestLongRunSmallWindow(t *testing.T) {
	t.Parallel()
	const steps, window = 300, 4000
	gw := scriptedGateway(t, longRunScript(steps, window))
	c := startCompactAgent(t, fakes.Serve(t, gw.Register), produce)
	ctx := t.Context()
	created, err := c.CreateSession(ctx, &agentv1.CreateSessionRequest{Cwd: t.TempDir(), Options: &sessionv1.SessionOptions{Provider: "scripted", Model: "small"}})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetSession().GetHeader().GetId()
	if _, err := c.Send(ctx, &agentv1.SendRequest{SessionId: id, Content: []*llmv1.ContentBlock{session.Text("process every chunk")}}); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, c, id)
	evs := streamAll(t, c, id)
	var results, compactions, failures, compactErrors int
	for _, ev := range evs {
		switch {
		case ev.GetToolResult() != nil && ev.GetSurfaceOp().GetAppend() != nil:
			results++
		case ev.GetCompactSummary() != nil:
			compactions++
		case ev.GetCompactEnd().GetError() != "":
			compactErrors++
		}
		for c := range session.Chunks(ev.GetAssistantChunk()) {
			if c.GetFinish().GetReason().GetError() != nil {
				failures++
			}
		}
	}
	last := evs[len(evs)-1].GetTurnEnd()
	if last.GetReason().GetCompleted() == nil || results != steps || failures != 0 || compactErrors != 0 || compactions == 0 {
		t.Fatalf("turn end %v; %d results of %d, %d failed requests, %d compactions (%d failed)", last.GetReason(), results, steps, failures, compactions, compactErrors)
	}
	s, err := c.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: id})
	if err != nil {
		t.Fatal(err)
	}
	m := s.GetSession().GetContext()
	if m.GetContextWindow() != window || m.GetRatio() <= 0 || m.GetRatio() > 1 || m.GetLogRevision() != int64(len(evs)) || m.GetBaseline() == "" {
		t.Errorf("context measurement %v", m)
	}
	t.Logf("%d events, %d compactions, final context %d/%d tokens", len(evs), compactions, m.GetTotalTokens(), window)
}

// TestCompactRPC: a manual compaction through the API, its errors, and the
// lock seen from a second caller.
func TestCompactRPC(t *testing.T) {
	t.Parallel()
	gw := &fakes.Gateway{}
	c := startCompactAgent(t, fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) }), produce)
	ctx := t.Context()
	if _, err := c.CreateSession(ctx, &agentv1.CreateSessionRequest{SessionId: "s", Cwd: t.TempDir(), Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}}); err != nil {
		t.Fatal(err)
	}
	calls := func(ids ...string) {
		for _, id := range ids {
			gw.Script(fakes.Response{Chunks: fakes.ToolCalls("", fakes.Call{ID: id, Name: "produce", Args: `{}`})})
		}
		gw.Script(fakes.Response{Chunks: fakes.Text("Done.")})
	}
	send := func(text string) {
		if _, err := c.Send(ctx, &agentv1.SendRequest{SessionId: "s", Content: []*llmv1.ContentBlock{session.Text(text)}}); err != nil {
			t.Fatal(err)
		}
		waitIdle(t, c, "s")
	}
	// Before any request there is nothing to compact.
	if _, err := c.Compact(ctx, &agentv1.CompactRequest{SessionId: "s"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("compact of an empty session: %v", err)
	}
	calls("c1", "c2", "c3")
	send("go")
	gs, err := c.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: "s"})
	if err != nil {
		t.Fatal(err)
	}
	before := gs.GetSession().GetContext()
	if before.GetTotalTokens() <= 0 || before.ContextWindow != nil || before.Ratio != nil {
		t.Fatalf("a gateway that does not know the window: the window must be unknown, not guessed: %v", before)
	}

	var first int64 = -1
	for _, ev := range streamAll(t, c, "s") {
		if ev.GetUserMessage() != nil && first < 0 {
			first = ev.GetSeq()
		}
	}
	one := first
	bad := []struct {
		req  *agentv1.CompactRequest
		code codes.Code
		msg  string
	}{
		{&agentv1.CompactRequest{SessionId: "s", Start: &one}, codes.InvalidArgument, "give both start and end"},
		{&agentv1.CompactRequest{SessionId: "s", Start: &one, End: proto64(999)}, codes.InvalidArgument, "end 999 is not a node"},
		{&agentv1.CompactRequest{SessionId: "s", Start: proto64(999), End: &one}, codes.InvalidArgument, "start 999 is not a node"},
		{&agentv1.CompactRequest{SessionId: "nope"}, codes.NotFound, "nope"},
	}
	for _, b := range bad {
		_, err := c.Compact(ctx, b.req)
		if status.Code(err) != b.code || !strings.Contains(status.Convert(err).Message(), b.msg) {
			t.Errorf("Compact(%v): %v, want %v mentioning %q", b.req, err, b.code, b.msg)
		}
	}

	// A compaction whose summarization call hangs holds the lock.
	release := make(chan struct{})
	gw.Script(fakes.Response{Wait: release, Chunks: fakes.Text("Summary: three chunks were produced.")})
	done := make(chan error, 1)
	var res *agentv1.CompactResponse
	go func() {
		var err error
		res, err = c.Compact(ctx, &agentv1.CompactRequest{SessionId: "s"})
		done <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for len(gw.Requests()) < 5 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if _, err := c.Compact(ctx, &agentv1.CompactRequest{SessionId: "s"}); status.Code(err) != codes.FailedPrecondition ||
		!strings.Contains(status.Convert(err).Message(), "in progress") {
		t.Errorf("second Compact while one runs: %v, want FAILED_PRECONDITION saying a compaction is in progress", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if res.GetSummary() != "Summary: three chunks were produced." || len(res.GetShadowedSeqs()) == 0 || res.GetShadowedTokenCount() <= 0 ||
		res.GetContext().GetTotalTokens() >= before.GetTotalTokens() {
		t.Errorf("compact response %v (before: %d tokens)", res, before.GetTotalTokens())
	}
	if r := gw.Requests()[4]; r.GetPurpose() != llmv1.Purpose_PURPOSE_COMPACTION {
		t.Errorf("the summarization call's purpose is %v", r.GetPurpose())
	}
	// A fork of the compacted session has the same (compacted) history.
	fork, err := c.ForkSession(ctx, &agentv1.ForkSessionRequest{SessionId: "s", NewSessionId: "f"})
	if err != nil {
		t.Fatal(err)
	}
	orig, err := c.GetMessages(ctx, &agentv1.GetMessagesRequest{SessionId: "s"})
	if err != nil {
		t.Fatal(err)
	}
	forked, err := c.GetMessages(ctx, &agentv1.GetMessagesRequest{SessionId: fork.GetSession().GetHeader().GetId()})
	if err != nil {
		t.Fatal(err)
	}
	if len(orig.GetMessages()) == 0 || !proto.Equal(&agentv1.GetMessagesResponse{Messages: orig.GetMessages()}, &agentv1.GetMessagesResponse{Messages: forked.GetMessages()}) {
		t.Errorf("the fork's history differs from the compacted session's: %d vs %d messages", len(forked.GetMessages()), len(orig.GetMessages()))
	}
	// The session goes on from the checkpoint.
	calls()
	send("more")
	msgs := gw.Requests()[5].GetMessages()
	if !strings.Contains(msgs[0].GetContent()[0].GetText().GetText(), "<compacted-summary>") {
		t.Errorf("the next request does not start with the checkpoint: %v", msgs[0])
	}
}

func proto64(v int64) *int64 { return &v }

// TestCompactRightAfterTurnEnd: a client that sees a turn's turn/end and
// asks for a compaction at once (what `dsh chat` does with piped input) is
// not told the session is running a turn while its driver settles to idle.
func TestCompactRightAfterTurnEnd(t *testing.T) {
	t.Parallel()
	gw := &fakes.Gateway{}
	c := startCompactAgent(t, fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) }), produce)
	ctx := t.Context()
	if _, err := c.CreateSession(ctx, &agentv1.CreateSessionRequest{SessionId: "s", Cwd: t.TempDir(), Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}}); err != nil {
		t.Fatal(err)
	}
	stream, err := c.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: "s"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		gw.Script(fakes.Response{Chunks: fakes.Text(fmt.Sprintf("answer %d", i))})
		if _, err := c.Send(ctx, &agentv1.SendRequest{SessionId: "s", Content: []*llmv1.ContentBlock{session.Text(fmt.Sprintf("prompt %d", i))}}); err != nil {
			t.Fatal(err)
		}
		// This prompt's turn/end (a compaction's own zero-step turn ends too).
		answered := false
		for {
			resp, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			ev := resp.GetEvent()
			if m := ev.GetAssistantMessage(); m != nil && strings.Contains(fmt.Sprint(m.GetContent()), fmt.Sprintf("answer %d", i)) {
				answered = true
			}
			if answered && ev.GetTurnEnd() != nil {
				break
			}
		}
		_, err := c.Compact(ctx, &agentv1.CompactRequest{SessionId: "s"})
		if err != nil && strings.Contains(err.Error(), "running a turn") {
			t.Fatalf("Compact right after turn %d's turn/end: %v", i+1, err)
		}
	}
}

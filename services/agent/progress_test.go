package agent_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"google.golang.org/grpc"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
)

// A client that asks for progress sees a long tool's live output while the
// tool runs (the tool waits until the client saw it), before the call's
// tool/result; a client that does not ask sees none; the durable log keeps
// only the result.
func TestStreamEventsLiveToolProgress(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	host, err := toolsdk.NewHost(toolsdk.HostConfig{}, toolsdk.RawTool("long", "a long tool", json.RawMessage(`{"type":"object"}`),
		func(ctx context.Context, call *toolsdk.Call, _ json.RawMessage) (toolsdk.Result, error) {
			call.Output("stdout", "step 1\n")
			call.Output("stdout", "step 2\n")
			select {
			case <-release:
			case <-ctx.Done():
				return toolsdk.Result{}, ctx.Err()
			}
			return toolsdk.Text("done"), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	addr := fakes.Serve(t, func(s *grpc.Server) { host.Register(s) })
	e := newEnvFull(t, func(e *env) { e.toolhosts = []string{"sdk=" + addr} })
	e.gw.Script(fakes.Response{Chunks: fakes.ToolCalls("", fakes.Call{ID: "c1", Name: "long", Args: `{}`})},
		fakes.Response{Chunks: fakes.Text("finished")})
	e.create("p")

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	live, err := e.client.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: "p", IncludeProgress: true})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := e.client.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: "p"})
	if err != nil {
		t.Fatal(err)
	}
	e.send("p", "go")

	var texts []string
	var callSeq int64 = -1
	for len(texts) < 2 {
		m, err := live.Recv()
		if err != nil {
			t.Fatalf("stream: %v", err)
		}
		if ev := m.GetEvent(); ev != nil {
			if ev.GetToolResult() != nil {
				t.Fatal("tool/result before the progress")
			}
			if ev.GetToolCall() != nil {
				callSeq = ev.GetSeq()
			}
			continue
		}
		p := m.GetProgress()
		if p.GetCallId() != "c1" || p.GetToolName() != "long" || p.GetTurn() != 1 || p.GetOutput().GetStream() != "stdout" {
			t.Errorf("progress %v", p)
		}
		if callSeq < 0 || p.GetAfterSeq() < callSeq {
			t.Errorf("progress after_seq %d, but the call event (seq %d) was not delivered before it", p.GetAfterSeq(), callSeq)
		}
		texts = append(texts, p.GetOutput().GetText())
	}
	if texts[0] != "step 1\n" || texts[1] != "step 2\n" {
		t.Errorf("progress texts %q", texts)
	}
	close(release) // the tool was still running: only now may it finish
	for {
		m, err := live.Recv()
		if err != nil {
			t.Fatalf("stream: %v", err)
		}
		if m.GetProgress() != nil {
			t.Errorf("more progress: %v", m.GetProgress())
		}
		if m.GetEvent().GetToolResult() != nil {
			break
		}
	}
	e.waitIdle("p")
	for {
		m, err := plain.Recv()
		if err != nil {
			t.Fatalf("plain stream: %v", err)
		}
		if m.GetProgress() != nil {
			t.Fatal("progress on a stream that did not ask for it")
		}
		if m.GetEvent().GetToolResult() != nil {
			break
		}
	}
	for _, ev := range e.events("p") {
		if tr := ev.GetToolResult(); tr != nil {
			if got := toolsdk.ResultText(tr.GetContent()); got != "done" {
				t.Errorf("durable result %q, want only the result", got)
			}
		}
	}
}

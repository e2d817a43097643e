package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/grpcserver"
)

// approvalScript runs bash, asks a question, then answers.
const approvalScript = `{"models":[{"id":"scripted"}],"steps":[
 {"text":"Deploying.","tool_calls":[{"name":"bash","arguments":{"command":"echo deployed","description":"deploy"}}]},
 {"text":"One question.","tool_calls":[{"name":"ask_user_question","arguments":{"questions":[{"id":"env","question":"Which environment next?","options":[{"label":"staging"},{"label":"prod"}]}]}}]},
 {"text":"Noted: {{last_tool_result}}"}
]}`

// TestPlatformClientApprovalFlow is the "done when": a platform
// client creates an on_request session against the real binaries (the
// agent with its default approval flags), watches the stream, answers the
// bash approval and the ask_user_question question through Respond,
// switches the model with UpdateSession mid-turn, and after an agent
// restart the whole exchange replays from the log.
func TestPlatformClientApprovalFlow(t *testing.T) {
	t.Parallel()
	gwAddr, thAddr, agAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	workspace, data := t.TempDir(), t.TempDir()
	gw := start(t, "llmgateway", cleanEnv("DSH_SCRIPT="+approvalScript), "--listen", gwAddr)
	th := start(t, "toolhost", cleanEnv(), "--listen", thAddr, "--workspace", workspace)
	waitServing(t, gwAddr, gw)
	waitServing(t, thAddr, th)
	// Titles are off: the live stream ends at the turn's end, and an
	// asynchronous title turn after it would be in the replay only.
	agentArgs := []string{"--listen", agAddr, "--gateway", gwAddr, "--toolhost", "builtin=" + thAddr, "--data", data, "--no-titles"}
	ag := start(t, "agent", cleanEnv(), agentArgs...)
	waitServing(t, agAddr, ag)
	conn, err := grpcserver.Dial(agAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := agentv1.NewAgentServiceClient(conn)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	cr, err := c.CreateSession(ctx, &agentv1.CreateSessionRequest{Cwd: workspace, Options: &sessionv1.SessionOptions{
		Provider: "scripted", Model: "scripted", WorkspaceRoot: workspace, Approval: sessionv1.ApprovalPolicy_APPROVAL_POLICY_ON_REQUEST}})
	if err != nil {
		t.Fatal(err)
	}
	id := cr.GetSession().GetHeader().GetId()
	stream, err := c.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: id})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Send(ctx, &agentv1.SendRequest{SessionId: id, Content: textBlocks("deploy, then ask me")}); err != nil {
		t.Fatal(err)
	}
	var live []*sessionv1.SessionEvent
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("stream after %d events: %v", len(live), err)
		}
		ev := resp.GetEvent()
		live = append(live, ev)
		switch {
		case ev.GetApprovalAsked() != nil:
			if ev.GetApprovalAsked().GetToolName() != "bash" {
				t.Fatalf("asked about %v", ev.GetApprovalAsked())
			}
			if _, err := c.Respond(ctx, &agentv1.RespondRequest{SessionId: id, RequestId: ev.GetApprovalAsked().GetId(),
				Answer: &agentv1.RespondRequest_Approval{Approval: &agentv1.ApprovalResponse{Decision: agentv1.ApprovalDecision_APPROVAL_DECISION_ALLOW_ONCE}}}); err != nil {
				t.Fatal(err)
			}
		case ev.GetQuestionAsked() != nil:
			if _, err := c.UpdateSession(ctx, &agentv1.UpdateSessionRequest{SessionId: id, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"options.model"}},
				Options: &sessionv1.SessionOptions{Model: "scripted-next"}}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Respond(ctx, &agentv1.RespondRequest{SessionId: id, RequestId: ev.GetQuestionAsked().GetId(),
				Answer: &agentv1.RespondRequest_Question{Question: &agentv1.QuestionResponse{Answers: []*sessionv1.QuestionAnswer{{Id: "env", Selected: []string{"staging"}}}}}}); err != nil {
				t.Fatal(err)
			}
		}
		if ev.GetTurnEnd() != nil {
			break
		}
	}
	var ran, answered bool
	var lastModel, answer string
	for _, ev := range live {
		if r := ev.GetToolResult(); r != nil && strings.Contains(fmtBlocks(r), "deployed") && !r.GetIsError() {
			ran = true
		}
		if r := ev.GetToolResult(); r != nil && strings.Contains(fmtBlocks(r), `"selected":["staging"]`) {
			answered = true
		}
		if h := ev.GetRequestHeader(); h != nil {
			lastModel = h.GetHeader().GetConfig().GetModel()
		}
		if m := ev.GetAssistantMessage(); m != nil {
			answer = fmtContent(m.GetContent())
		}
	}
	if !ran || !answered || lastModel != "scripted-next" || !strings.Contains(answer, "staging") {
		t.Fatalf("bash ran %v, question answered %v, last model %q, answer %q", ran, answered, lastModel, answer)
	}
	if end := live[len(live)-1].GetTurnEnd(); end.GetReason().GetCompleted() == nil {
		t.Fatalf("turn ended %v", end)
	}

	// Restart the agent: the log replays the same exchange.
	ag.stop(t)
	ag = start(t, "agent", cleanEnv(), agentArgs...)
	waitServing(t, agAddr, ag)
	replay, err := c.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: id, NoFollow: true})
	if err != nil {
		t.Fatal(err)
	}
	var stored []*sessionv1.SessionEvent
	for {
		resp, err := replay.Recv()
		if err != nil {
			break
		}
		stored = append(stored, resp.GetEvent())
	}
	if len(stored) != len(live) {
		t.Fatalf("replayed %d events, saw %d live", len(stored), len(live))
	}
	for i := range live {
		if !proto.Equal(live[i], stored[i]) {
			t.Fatalf("event %d differs after the restart:\nlive   %v\nstored %v", i, live[i], stored[i])
		}
	}
	g, err := c.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: id})
	if err != nil {
		t.Fatal(err)
	}
	if g.GetSession().GetEffectiveOptions().GetModel() != "scripted-next" || len(g.GetSession().GetPending()) != 0 {
		t.Fatalf("after the restart: %v", g.GetSession())
	}
}

func fmtBlocks(r *sessionv1.ToolResult) string { return fmtContent(r.GetContent()) }

func fmtContent(bs []*llmv1.ContentBlock) string {
	var b strings.Builder
	for _, bl := range bs {
		b.WriteString(bl.GetText().GetText())
	}
	return b.String()
}

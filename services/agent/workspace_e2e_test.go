package agent_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
	"github.com/dsh-dev/dsh/services/toolhost/toolhosttest"
)

// workspaceScript: every turn loads the release skill, then answers.
const workspaceScript = `{"steps": [
 {"tool_calls": [{"id": "s1", "name": "skill", "arguments": {"name": "release"}}]},
 {"text": "Done, following the release skill."}
]}`

// TestWorkspaceContextE2E is issue 16's acceptance flow over a real toolhost
// in a temporary git repository and the real gateway: the first request's
// logged header carries AGENTS.md and the skill catalog, the model loads the
// skill through the tool, the session gets a title after turn one, and an
// edit of AGENTS.md between turns is a new request/header (history is never
// edited).
func TestWorkspaceContextE2E(t *testing.T) {
	t.Parallel()
	repo := t.TempDir()
	if out, err := exec.Command("git", "init", "-q", repo).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v: %s", err, out)
	}
	write := func(rel, body string) {
		t.Helper()
		p := filepath.Join(repo, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("AGENTS.md", "Always run the linter before committing.\n")
	write("svc/CLAUDE.md", "The svc folder is Go only.\n")
	write(".agents/skills/release/SKILL.md", "---\ndescription: Cut a release of this repository.\n---\n1. Tag.\n2. Push.\n")
	cwd := filepath.Join(repo, "svc")

	gw := scriptedGateway(t, workspaceScript)
	host := toolhosttest.Start(t, toolhosttest.WithWorkspace(repo))
	p := startAgent(t, backend{gwAddr: fakes.Serve(t, gw.Register), thAddr: host.Addr, titles: true}, t.TempDir())
	ctx := t.Context()
	created, err := p.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Cwd: cwd,
		Options: &sessionv1.SessionOptions{Provider: "scripted", Model: "scripted"}})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetSession().GetHeader().GetId()
	events := follow(t, ctx, p.client, id)
	send := func(text string) {
		t.Helper()
		if _, err := p.client.Send(ctx, &agentv1.SendRequest{SessionId: id, Content: []*llmv1.ContentBlock{session.Text(text)}}); err != nil {
			t.Fatal(err)
		}
	}

	send("please cut the next release of this repository now")
	turn1 := until(t, events, "turn 1 to end", turnEnd(1))
	var headers []*sessionv1.RequestHeader
	var skillResult string
	for _, ev := range turn1 {
		if h := ev.GetRequestHeader(); h != nil {
			headers = append(headers, h)
		}
		if r := ev.GetToolResult(); r != nil {
			skillResult = toolText(r.GetContent())
		}
	}
	if len(headers) != 1 || headers[0].GetReason() != sessionv1.HeaderReason_HEADER_REASON_INITIAL {
		t.Fatalf("turn 1 headers: %v", headers)
	}
	sys := headers[0].GetHeader().GetSystem()
	for _, want := range []string{
		"Always run the linter before committing.", "The svc folder is Go only.",
		`<instructions path="` + filepath.Join(repo, "AGENTS.md") + `">`,
	} {
		if !strings.Contains(sys, want) {
			t.Errorf("first system prompt lacks %q:\n%s", want, sys)
		}
	}
	if strings.Index(sys, "Always run the linter") > strings.Index(sys, "Go only") {
		t.Error("instructions are not outermost first")
	}
	prefix := headers[0].GetHeader().GetMessagePrefix()
	if len(prefix) != 1 || !strings.Contains(toolText(prefix[0].GetContent()), "- release: Cut a release of this repository.") {
		t.Errorf("first message prefix lacks the skill catalog: %v", prefix)
	}
	if !strings.Contains(skillResult, `<skill_content name="release">`) || !strings.Contains(skillResult, "1. Tag.\n2. Push.") ||
		!strings.Contains(skillResult, filepath.Join(repo, ".agents/skills/release")) {
		t.Errorf("skill tool result:\n%s", skillResult)
	}

	titleEvs := until(t, events, "the session title", func(ev *sessionv1.SessionEvent) bool { return ev.GetSessionTitle() != nil })
	st := titleEvs[len(titleEvs)-1].GetSessionTitle()
	if st.GetTitle() != "please cut the next release of" || st.GetSource() != "model" {
		t.Errorf("title %v", st)
	}
	// The session was idle: the title is recorded like a settings change,
	// in a zero-step turn with the plugin trigger session/title.
	if start := titleEvs[len(titleEvs)-2].GetTurnStart(); start.GetTurn() != 2 || start.GetTrigger().GetExtension().GetType() != "session/title" {
		t.Errorf("the title's turn starts with %v, want turn 2 with the plugin trigger session/title", titleEvs[len(titleEvs)-2])
	}
	until(t, events, "the title's turn to end", turnEnd(2))
	got, err := p.client.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: id})
	if err != nil || got.GetSession().GetTitle() != st.GetTitle() {
		t.Errorf("GetSession title %q, %v", got.GetSession().GetTitle(), err)
	}

	write("AGENTS.md", "Always run the linter and the tests before committing.\n")
	send("and now the changelog")
	turn3 := until(t, events, "turn 3 to end", turnEnd(3))
	headers = nil
	for _, ev := range turn3 {
		if h := ev.GetRequestHeader(); h != nil {
			headers = append(headers, h)
		}
	}
	if len(headers) != 1 || headers[0].GetReason() != sessionv1.HeaderReason_HEADER_REASON_CHANGE ||
		!strings.Contains(headers[0].GetHeader().GetSystem(), "the linter and the tests") {
		t.Fatalf("after editing AGENTS.md: headers %v", headers)
	}
	for _, ev := range streamAll(t, p.client, id) {
		if ev.GetSessionTitle() != nil && ev.GetSeq() != titleEvs[len(titleEvs)-1].GetSeq() {
			t.Errorf("a second title was generated: %v", ev)
		}
	}
}

func toolText(blocks []*llmv1.ContentBlock) string {
	var b strings.Builder
	for _, c := range blocks {
		b.WriteString(c.GetText().GetText())
	}
	return b.String()
}

// TestUnknownTemplateVariableFailsTurn: a persona naming an unknown
// variable fails the turn before any request, naming the variable.
func TestUnknownTemplateVariableFailsTurn(t *testing.T) {
	t.Parallel()
	gw := &fakes.Gateway{} // no script: any request would fail the test differently
	host := toolhosttest.Start(t)
	p := startAgent(t, backend{gwAddr: fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) }), thAddr: host.Addr}, t.TempDir())
	ctx := t.Context()
	if _, err := p.client.CreateSession(ctx, &agentv1.CreateSessionRequest{SessionId: "v", Cwd: host.Workspace,
		Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1", Persona: "You serve {{tenant_name}}."}}); err != nil {
		t.Fatal(err)
	}
	events := follow(t, ctx, p.client, "v")
	if _, err := p.client.Send(ctx, &agentv1.SendRequest{SessionId: "v", Content: []*llmv1.ContentBlock{session.Text("hi")}}); err != nil {
		t.Fatal(err)
	}
	evs := until(t, events, "turn 1 to end", turnEnd(1))
	for _, ev := range evs {
		if ev.GetRequestHeader() != nil || ev.GetStepStart() != nil {
			t.Errorf("a request was prepared: %v", ev)
		}
	}
	msg := evs[len(evs)-1].GetTurnEnd().GetReason().GetError().GetMessage()
	if !strings.Contains(msg, `unknown template variable "tenant_name"`) {
		t.Errorf("turn end %v", evs[len(evs)-1])
	}
}

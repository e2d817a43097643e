package agent_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
	"github.com/dsh-dev/dsh/services/toolhost/toolhosttest"
)

// TestWorkspaceContextWithinSessionRoot: a session whose workspace root is
// ws/a, on a real toolhost rooted at ws (with a .git, an AGENTS.md and a
// skill) beside a session tree ws/b, plants ws/a/AGENTS.md as a link to
// ws/b/AGENTS.md. The agent's context reads carry the session's root, so
// its first request's system prompt and skill catalog hold ws/a's skill and
// nothing of ws/b or ws (an agent sending only the cwd got both, the host
// reading within its own root); and CreateSession's cwd check, asked within
// that root, refuses a cwd in ws/a that is a link to ws/b.
func TestWorkspaceContextWithinSessionRoot(t *testing.T) {
	t.Parallel()
	const hostCanary, sibCanary = "HOST-ROOT-AGENTS-CANARY-7a31", "SIBLING-AGENTS-CANARY-c2d8"
	ws, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a, b := filepath.Join(ws, "a"), filepath.Join(ws, "b")
	for p, body := range map[string]string{
		".git/HEAD": "ref: refs/heads/main\n", "AGENTS.md": hostCanary,
		".agents/skills/hostskill.md": "---\ndescription: The host root's skill.\n---\n" + hostCanary,
		"b/AGENTS.md":                 sibCanary,
		"a/.agents/skills/own.md":     "---\ndescription: Session a's own skill.\n---\nown",
	} {
		p = filepath.Join(ws, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"a/AGENTS.md": filepath.Join(b, "AGENTS.md"), "a/to-b": b} {
		if err := os.Symlink(target, filepath.Join(ws, link)); err != nil {
			t.Fatal(err)
		}
	}
	gw := scriptedGateway(t, `{"steps": [{"text": "ok"}]}`)
	host := toolhosttest.Start(t, toolhosttest.WithWorkspace(ws))
	p := startAgent(t, backend{gwAddr: fakes.Serve(t, gw.Register), thAddr: host.Addr}, t.TempDir())
	ctx := t.Context()
	opts := &sessionv1.SessionOptions{Provider: "scripted", Model: "scripted", WorkspaceRoot: a}

	_, err = p.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Cwd: filepath.Join(a, "to-b"), Options: opts})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "outside workspace_root") {
		t.Errorf("CreateSession with a cwd in the session root linking to a sibling: %v, want INVALID_ARGUMENT (outside workspace_root)", err)
	}

	created, err := p.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Cwd: a, Options: opts})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetSession().GetHeader().GetId()
	events := follow(t, ctx, p.client, id)
	if _, err := p.client.Send(ctx, &agentv1.SendRequest{SessionId: id, Content: []*llmv1.ContentBlock{session.Text("hello")}}); err != nil {
		t.Fatal(err)
	}
	var header *sessionv1.RequestHeader
	for _, ev := range until(t, events, "turn 1 to end", turnEnd(1)) {
		if h := ev.GetRequestHeader(); h != nil && header == nil {
			header = h
		}
	}
	if header == nil {
		t.Fatal("turn 1 logged no request header")
	}
	text := header.GetHeader().GetSystem()
	for _, m := range header.GetHeader().GetMessagePrefix() {
		text += "\n" + toolText(m.GetContent())
	}
	for _, leak := range []string{hostCanary, sibCanary, "hostskill"} {
		if strings.Contains(text, leak) {
			t.Errorf("the session of %s got %s, from outside its workspace root, in its model context:\n%s", a, leak, text)
		}
	}
	if !strings.Contains(text, "- own: Session a's own skill.") {
		t.Errorf("the session's own skill is not in its context:\n%s", text)
	}
}

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
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
	"github.com/dsh-dev/dsh/services/toolhost/toolhosttest"
)

// TestSessionCwdInCluster is issue 21's "where sessions work": the agent's
// default cwd is the toolhost's workspace (in a cluster, its volume), so a
// session created without a cwd runs its tools there; a cwd the toolhost
// refuses (a client's local path, a missing directory) is INVALID_ARGUMENT at
// CreateSession, naming the toolhost, instead of failing every tool call.
func TestSessionCwdInCluster(t *testing.T) {
	t.Parallel()
	ws := t.TempDir()
	if err := os.Mkdir(filepath.Join(ws, "proj"), 0o755); err != nil {
		t.Fatal(err)
	}
	gw := scriptedGateway(t, `{"steps": [
 {"tool_calls": [{"id": "b1", "name": "bash", "arguments": {"command": "pwd && echo hi > made-here && ls", "description": "where"}}]},
 {"text": "done"}]}`)
	host := toolhosttest.Start(t, toolhosttest.WithWorkspace(ws))
	appr, err := agent.ParseApprovalFlags("on-request", []string{"*=allow"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	p := startAgentWith(t, backend{gwAddr: fakes.Serve(t, gw.Register), thAddr: host.Addr}, t.TempDir(), func(sc *agent.ServerConfig) {
		sc.Service.DefaultCwd, sc.Service.Approval = ws, appr
	})
	ctx := t.Context()
	opts := func() *sessionv1.SessionOptions {
		return &sessionv1.SessionOptions{Provider: "scripted", Model: "scripted"}
	}

	for _, tc := range []struct{ name, cwd, want string }{
		{"a client's local path", t.TempDir(), "toolhost main refuses cwd"},
		{"a missing directory in the workspace", filepath.Join(ws, "nope"), "is not a directory"},
		{"a path climbing out", ws + "/../..", "toolhost main refuses cwd"},
	} {
		_, err := p.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Cwd: tc.cwd, Options: opts()})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "--default-cwd") {
			t.Errorf("%s: CreateSession(cwd %s) = %v, want INVALID_ARGUMENT with %q", tc.name, tc.cwd, err, tc.want)
		}
	}
	if _, err := p.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Cwd: filepath.Join(ws, "proj"), Options: opts()}); err != nil {
		t.Errorf("a cwd inside the workspace: %v", err)
	}

	created, err := p.client.CreateSession(ctx, &agentv1.CreateSessionRequest{Options: opts()})
	if err != nil {
		t.Fatal(err)
	}
	if got := created.GetSession().GetHeader().GetCwd(); got != ws {
		t.Fatalf("default cwd %q, want the workspace %q", got, ws)
	}
	id := created.GetSession().GetHeader().GetId()
	events := follow(t, ctx, p.client, id)
	if _, err := p.client.Send(ctx, &agentv1.SendRequest{SessionId: id, Content: []*llmv1.ContentBlock{session.Text("where are you?")}}); err != nil {
		t.Fatal(err)
	}
	var result *sessionv1.ToolResult
	for _, ev := range until(t, events, "turn 1 to end", turnEnd(1)) {
		if r := ev.GetToolResult(); r != nil {
			result = r
		}
		if e := ev.GetTurnEnd(); e != nil && e.GetReason().GetCompleted() == nil {
			t.Fatalf("turn ended %v", e.GetReason())
		}
	}
	if out := toolText(result.GetContent()); result.GetIsError() || !strings.HasPrefix(out, ws+"\n") || !strings.Contains(out, "made-here") {
		t.Fatalf("bash at the default cwd: error %v, output %q", result.GetIsError(), out)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "made-here")); err != nil || string(b) != "hi\n" {
		t.Fatalf("the tool's file in the workspace: %q, %v", b, err)
	}
}

package e2e

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
)

// TestSendWorksInTheAgentsWorkspace: `dsh send` against a remote agent sends
// no local path, so the session works in the agent's --default-cwd (the
// toolhost's workspace) and its tools run there; a --cwd the toolhost
// refuses fails at creation with a message naming the toolhost.
func TestSendWorksInTheAgentsWorkspace(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	s := startStack(t)
	s.agent.stop(t)
	s.agentArgs = append(s.agentArgs, "--default-cwd", s.workspace)
	s.startAgent()

	out, errOut, code := dsh(t, "send", "--addr", s.agentAddr, "run the two commands")
	if code != 0 || !strings.Contains(out, "Both ran.") {
		t.Fatalf("dsh send: exit %d\n%s\n%s", code, out, errOut)
	}
	m := regexp.MustCompile(`session (\S+)`).FindStringSubmatch(errOut)
	if m == nil {
		t.Fatalf("dsh send named no session:\n%s", errOut)
	}
	got, err := s.client.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: m[1]})
	if err != nil {
		t.Fatal(err)
	}
	if cwd := got.GetSession().GetHeader().GetCwd(); cwd != s.workspace {
		t.Fatalf("the session works in %q, want the agent's default %q (not the client's directory)", cwd, s.workspace)
	}

	_, errOut, code = dsh(t, "send", "--addr", s.agentAddr, "--cwd", t.TempDir(), "hello")
	if code == 0 || !strings.Contains(errOut, "toolhost builtin refuses cwd") {
		t.Fatalf("dsh send --cwd outside the workspace: exit %d\n%s", code, errOut)
	}
}

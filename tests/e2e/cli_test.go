package e2e

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	"github.com/dsh-dev/dsh/internal/session"
)

// dsh runs the CLI binary and returns stdout, stderr and the exit code.
func dsh(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "dsh"), args...)
	cmd.Env = cleanEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return stdout.String(), stderr.String(), ee.ExitCode()
	case err != nil:
		t.Fatalf("dsh %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), 0
}

func TestCLIAgainstRunningServices(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	s := startStack(t)
	id := s.createSession(ctx)
	evs := s.runTurn(ctx, id, 0, "run the two commands")
	a := s.agentAddr

	must := func(args ...string) string {
		t.Helper()
		out, errOut, code := dsh(t, args...)
		if code != 0 {
			t.Fatalf("dsh %v: exit %d\n%s", args, code, errOut)
		}
		return out
	}
	if out := must("sessions", "list", "--addr", a); !strings.Contains(out, id) || !strings.Contains(out, "scripted/scripted") {
		t.Errorf("sessions list:\n%s", out)
	}
	if out := must("sessions", "show", "--addr", a, id); !strings.Contains(out, "id:       "+id) {
		t.Errorf("sessions show:\n%s", out)
	}
	lines := strings.Split(strings.TrimSpace(must("sessions", "events", "--addr", a, "--json", id)), "\n")
	if len(lines) != len(evs) {
		t.Fatalf("sessions events --json printed %d lines, the log has %d events", len(lines), len(evs))
	}
	last, err := session.UnmarshalEventJSON([]byte(lines[len(lines)-1]))
	if err != nil || last.GetTurnEnd() == nil {
		t.Fatalf("last event line %q: %v", lines[len(lines)-1], err)
	}
	rendered := must("sessions", "events", "--addr", a, id)
	for _, want := range []string{"› run the two commands", "⏺ $ echo one", "╰ exit 0", "Both ran."} {
		if !strings.Contains(rendered, want) {
			t.Errorf("sessions events lacks %q:\n%s", want, rendered)
		}
	}
	msgs, err := s.client.GetMessages(ctx, &agentv1.GetMessagesRequest{SessionId: id})
	if err != nil {
		t.Fatal(err)
	}
	if out := strings.TrimSpace(must("sessions", "messages", "--addr", a, id)); len(strings.Split(out, "\n")) != len(msgs.GetMessages()) {
		t.Errorf("sessions messages printed %q, want %d messages", out, len(msgs.GetMessages()))
	}
	child := strings.TrimSpace(must("sessions", "fork", "--addr", a, id))
	if child == "" || child == id {
		t.Fatalf("sessions fork printed %q", child)
	}
	if out := must("sessions", "show", "--addr", a, child); !strings.Contains(out, "parent:   "+id) {
		t.Errorf("the fork does not name its parent:\n%s", out)
	}
	if out := must("tools", "list", "--addr", s.toolhostAddr); !strings.Contains(out, "bash") {
		t.Errorf("tools list:\n%s", out)
	}
	if out := must("models", "list", "--addr", s.gatewayAddr); !strings.Contains(out, "scripted") {
		t.Errorf("models list:\n%s", out)
	}
	// send continues a session and exits 0 on a completed turn.
	out, errOut, code := dsh(t, "send", "--addr", a, "--session", id, "again")
	if code != 0 || !strings.Contains(out, "Both ran.") {
		t.Fatalf("send: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// An unknown session is one clear line and a non-zero exit.
	_, errOut, code = dsh(t, "sessions", "show", "--addr", a, "nope")
	if code == 0 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, "NotFound") {
		t.Fatalf("show of an unknown session: exit %d, stderr %q", code, errOut)
	}
}

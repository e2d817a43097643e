package e2e

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestFirstHour is a newcomer's first hour without a running server: a
// prompt piped into `dsh dev` runs to its answer (not dropped at the end of
// the input), and a piped command after it waits for its turn; `dsh sessions
// list|show|events|messages` read the local store
// when no agent answers, saying so; `dsh dev --continue` resumes the last
// session of the directory and replays its history first.
func TestFirstHour(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := filepath.Join(dir, ".dsh")
	dsh := func(stdin string, args ...string) (string, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "dsh"), args...)
		cmd.Dir = dir
		cmd.Env = cleanEnv("DSH_SCRIPT=" + script)
		cmd.Stdin = strings.NewReader(stdin)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("dsh %q: %v\nstdout:\n%s\nstderr:\n%s", args, err, stdout.String(), stderr.String())
		}
		return stdout.String(), stderr.String()
	}

	out, _ := dsh("run the two commands\n", devArgs(data, "--yes")...)
	if !strings.Contains(out, "Both ran. Last output: two") {
		t.Fatalf("the piped prompt did not run to its answer:\n%s", out)
	}

	offline := func(args ...string) string {
		t.Helper()
		out, stderr := dsh("", append(append([]string{"sessions"}, args...), "--addr", "127.0.0.1:1", "--data", data)...)
		if !strings.Contains(stderr, "no agent at 127.0.0.1:1; reading the local store") {
			t.Errorf("sessions %q does not say it reads the local store: %q", args, stderr)
		}
		return out
	}
	list := offline("list")
	lines := strings.Split(strings.TrimSpace(list), "\n")
	if len(lines) != 2 {
		t.Fatalf("sessions list offline:\n%s", list)
	}
	id := strings.Fields(lines[1])[0]
	if show := offline("show", id); !strings.Contains(show, "id:       "+id) || !strings.Contains(show, "scripted/") {
		t.Errorf("sessions show offline:\n%s", show)
	}
	if evs := offline("events", id); !strings.Contains(evs, "run the two commands") || !strings.Contains(evs, "echo two") {
		t.Errorf("sessions events offline:\n%s", evs)
	}
	if msgs := offline("messages", id, "--json"); !strings.Contains(msgs, "run the two commands") || !strings.Contains(msgs, "ROLE_ASSISTANT") {
		t.Errorf("sessions messages offline:\n%s", msgs)
	}

	// Piped lines are a script: /compact waits for the prompt's turn to end
	// instead of finding it running.
	out, _ = dsh("and again\n/compact\n", devArgs(data, "--yes", "--continue")...)
	if !strings.Contains(out, "run the two commands") || !strings.Contains(out, "resumed session "+id) {
		t.Fatalf("dsh dev --continue did not replay session %s:\n%s", id, out)
	}
	// The session is too short to summarize, so /compact answers "nothing
	// to compact"; what matters is that it ran after the turn, not into it.
	if !strings.Contains(out, "nothing to compact") || strings.Contains(out, "running a turn") {
		t.Fatalf("the piped /compact did not wait for the turn:\n%s", out)
	}
	if list := offline("list"); strings.Count(strings.TrimSpace(list), "\n") != 1 {
		t.Fatalf("--continue made a new session:\n%s", list)
	}
	if evs := offline("events", id); !strings.Contains(evs, "and again") {
		t.Errorf("the resumed session lacks the new prompt:\n%s", evs)
	}
}

// TestDevOneShotOnATerminal: `dsh dev -p` on a terminal shows the turn as it
// runs — the tool cards of both commands — and the answer; piped (the other
// tests) it prints only the answer.
func TestDevOneShotOnATerminal(t *testing.T) {
	t.Parallel()
	term, _, exited := startDevPTY(t, script, "-p", "run the two commands", "--yes")
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("dsh dev -p: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("dsh dev -p did not finish")
	}
	s := term.waitFor(t, "the tool cards and the answer", func(s string) bool {
		return strings.Contains(s, "Both ran. Last output: two")
	})
	for _, want := range []string{"echo one", "echo two", "Running the first command."} {
		if !strings.Contains(s, want) {
			t.Errorf("the terminal does not show %q:\n%s", want, s)
		}
	}
	if n := strings.Count(s, "Both ran. Last output: two"); n != 1 {
		t.Errorf("the answer shows %d times:\n%s", n, s)
	}
}

// TestChatSessionCommands: /new starts another session, /sessions lists
// both (the current one starred), /resume ID switches back and replays its
// history.
func TestChatSessionCommands(t *testing.T) {
	t.Parallel()
	term, write, _ := startDevPTY(t, script, "--yes")
	s := term.waitFor(t, "the first prompt", atPrompt)
	first := sessionOnScreen(t, s, 0)
	write([]byte("run the two commands\r"))
	term.waitFor(t, "the answer", func(s string) bool { return strings.Contains(s, "Both ran.") && atPrompt(s) })
	write([]byte("/new\r"))
	s = term.waitFor(t, "a second session", func(s string) bool { return strings.Count(s, "session ") >= 2 && atPrompt(s) })
	second := sessionOnScreen(t, s, 1)
	if second == first {
		t.Fatalf("/new kept session %s", first)
	}
	write([]byte("/sessions\r"))
	term.waitFor(t, "the list", func(s string) bool {
		return strings.Contains(s, "* "+second) && strings.Contains(s, "  "+first) && atPrompt(s)
	})
	write([]byte("/resume " + first + "\r"))
	term.waitFor(t, "the replayed first session", func(s string) bool {
		return strings.Contains(s, "resumed session "+first) && atPrompt(s)
	})
}

// sessionOnScreen returns the id of the n-th "session ID · ..." banner.
func sessionOnScreen(t *testing.T, screen string, n int) string {
	t.Helper()
	var ids []string
	for _, l := range strings.Split(screen, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "session "); ok && strings.Contains(rest, " · ") {
			ids = append(ids, strings.Fields(rest)[0])
		}
	}
	if len(ids) <= n {
		t.Fatalf("no session banner %d on screen:\n%s", n, screen)
	}
	return ids[n]
}

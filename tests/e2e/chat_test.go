package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/creack/pty"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
)

// vt is a minimal terminal screen: printable runes, \r, \n, and CSI
// sequences (erase-in-line, erase-below and cursor-up honoured, styling
// ignored).
type vt struct {
	mu   sync.Mutex
	raw  bytes.Buffer
	rows [][]rune
	r, c int
}

func (v *vt) Write(p []byte) (int, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.raw.Write(p)
	return len(p), nil
}

// screen replays the raw output and returns the screen's lines.
func (v *vt) screen() string {
	v.mu.Lock()
	data := append([]byte(nil), v.raw.Bytes()...)
	v.mu.Unlock()
	v.rows, v.r, v.c = [][]rune{nil}, 0, 0
	for len(data) > 0 {
		switch data[0] {
		case '\r':
			v.c = 0
			data = data[1:]
			continue
		case '\n':
			v.r++
			v.c = 0
			for len(v.rows) <= v.r {
				v.rows = append(v.rows, nil)
			}
			data = data[1:]
			continue
		case 0x1b:
			if len(data) > 1 && data[1] == '[' {
				i := 2
				for i < len(data) && (data[i] < 0x40 || data[i] > 0x7e) {
					i++
				}
				if i < len(data) && (data[i] == 'K' || data[i] == 'J') && v.c < len(v.rows[v.r]) {
					v.rows[v.r] = v.rows[v.r][:v.c]
				}
				if i < len(data) && data[i] == 'J' {
					v.rows = v.rows[:v.r+1]
				}
				if i < len(data) && data[i] == 'A' {
					n, err := strconv.Atoi(string(data[2:i]))
					if err != nil {
						n = 1
					}
					v.r = max(v.r-n, 0)
				}
				data = data[min(i+1, len(data)):]
				continue
			}
			data = data[1:]
			continue
		}
		rn, n := utf8.DecodeRune(data)
		data = data[n:]
		if rn < ' ' {
			continue
		}
		row := v.rows[v.r]
		for len(row) < v.c {
			row = append(row, ' ')
		}
		if v.c < len(row) {
			row[v.c] = rn
		} else {
			row = append(row, rn)
		}
		v.rows[v.r] = row
		v.c++
	}
	lines := make([]string, len(v.rows))
	for i, r := range v.rows {
		lines[i] = strings.TrimRight(string(r), " ")
	}
	return strings.Join(lines, "\n")
}

func (v *vt) waitFor(t *testing.T, what string, ok func(screen string) bool) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		s := v.screen()
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; screen:\n%s", what, s)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// devArgs runs dsh dev on OS-chosen ports in its own data directory.
func devArgs(data string, extra ...string) []string {
	return append([]string{"dev", "--data", data, "--agent-listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0",
		"--toolhost-listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0"}, extra...)
}

func TestChatInPseudoTerminal(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// A workspace with instructions and a skill: dsh dev says what it found.
	for p, body := range map[string]string{"AGENTS.md": "Be brief.\n", ".agents/skills/demo/SKILL.md": "---\ndescription: A demo skill.\n---\nSteps.\n"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(filepath.Join(binDir, "dsh"), devArgs(filepath.Join(dir, ".dsh"))...)
	cmd.Dir = dir
	cmd.Env = cleanEnv("DSH_SCRIPT="+script, "TERM=xterm-256color", "DSH_HOME="+filepath.Join(dir, "nohome"), "DSH_AGENTS_HOME="+filepath.Join(dir, "nohome"))
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 60, Cols: 160})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	term := &vt{}
	copied := make(chan struct{})
	go func() { _, _ = bytesCopy(term, f); close(copied) }()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("screen:\n%s", term.screen())
		}
	})

	term.waitFor(t, "the prompt", func(s string) bool { return strings.HasSuffix(s, "› ") || strings.HasSuffix(s, "›") })
	if _, err := f.Write([]byte("run the two commands\r")); err != nil {
		t.Fatal(err)
	}
	// `make run` asks before bash: answer the first card with y (once), the
	// second with a (always for this session).
	for i, answer := range []string{"y\r", "a\r"} {
		term.waitFor(t, fmt.Sprintf("approval card %d", i+1), func(s string) bool {
			return strings.Count(s, "⚠ approval needed · bash") == i+1 && strings.HasSuffix(strings.TrimRight(s, " "), "allow?")
		})
		if _, err := f.Write([]byte(answer)); err != nil {
			t.Fatal(err)
		}
	}
	screen := term.waitFor(t, "the end of the turn", func(s string) bool {
		return strings.Contains(s, "tokens:") && strings.HasSuffix(strings.TrimRight(s, " "), "›")
	})
	// The session is titled after its first turn (the scripted provider's
	// deterministic title: the prompt's first words).
	screen = term.waitFor(t, "the session title", func(s string) bool { return strings.Contains(s, "title: run the two commands") })
	for _, want := range []string{
		"workspace: 1 instruction file, 1 skill", // the workspace context found
		"nats      nats://127.0.0.1:",            // the addresses are printed
		"model     scripted/scripted",            // and the model
		"✻ I will run two commands.",             // reasoning
		"Running the first command.",             // streamed text
		"⏺ $ echo one",                           // a terminal card
		"  │ one",                                // its output
		"  ╰ exit 0",                             // its exit status
		"⏺ $ echo two",                           // the second step's card
		"  $ echo one",                           // the approval card shows the command
		"why: the rule",                          // and why it asks
		"↳ allowed by user",                      // the answers
		"↳ allowed for this session by user",
		"Both ran. Last output:", // the answer
		"tokens: ",               // usage after the turn
	} {
		if !strings.Contains(screen, want) {
			t.Errorf("screen lacks %q", want)
		}
	}
	if strings.Contains(screen, "running bash") {
		t.Errorf("spinner left on screen after the tool finished")
	}
	term.mu.Lock()
	raw := term.raw.String()
	term.mu.Unlock()
	if !strings.Contains(raw, "\x1b[32mexit 0") {
		t.Errorf("exit status not coloured on a TTY")
	}

	// Ctrl-C while idle asks for confirmation; Ctrl-D exits cleanly.
	if _, err := f.Write([]byte{0x03}); err != nil {
		t.Fatal(err)
	}
	term.waitFor(t, "the Ctrl-C hint", func(s string) bool { return strings.Contains(s, "(Ctrl-C again or Ctrl-D to exit)") })
	if _, err := f.Write([]byte{0x04}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("dsh dev exited with %v after Ctrl-D", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("dsh dev did not exit after Ctrl-D")
	}
	<-copied
	if s := term.screen(); !strings.Contains(s, "bye") {
		t.Errorf("no goodbye on exit")
	}
}

// startDevPTY runs `dsh dev` in a pseudo-terminal with the given script.
func startDevPTY(t *testing.T, scr string, extra ...string) (*vt, func([]byte), chan error) {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(filepath.Join(binDir, "dsh"), devArgs(filepath.Join(dir, ".dsh"), extra...)...)
	cmd.Dir = dir
	cmd.Env = cleanEnv("DSH_SCRIPT="+scr, "TERM=xterm-256color")
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 60, Cols: 160})
	if err != nil {
		t.Fatal(err)
	}
	term := &vt{}
	go func() { _, _ = bytesCopy(term, f) }()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case err := <-exited:
			exited <- err
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
		f.Close()
		if t.Failed() {
			t.Logf("screen:\n%s", term.screen())
		}
	})
	write := func(b []byte) {
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	return term, write, exited
}

func atPrompt(s string) bool { return strings.HasSuffix(strings.TrimRight(s, " "), "›") }

// A running bash's output shows live under the spinner (the card's tail,
// from StreamEvents progress) before the call ends.
func TestChatShowsLiveToolOutput(t *testing.T) {
	t.Parallel()
	slow := `{"models":[{"id":"scripted"}],"steps":[
 {"text":"Working.","tool_calls":[{"name":"bash","arguments":{"command":"echo tick-one; echo tick-two; sleep 30","description":"work"}}]},
 {"text":"Done."}]}`
	term, write, _ := startDevPTY(t, slow, "--yes")
	term.waitFor(t, "the prompt", atPrompt)
	write([]byte("work\r"))
	screen := term.waitFor(t, "the live tail while bash runs", func(s string) bool {
		return strings.Contains(s, "running bash…") && strings.Contains(s, "┊ bash: tick-one") && strings.Contains(s, "┊ bash: tick-two")
	})
	if strings.Contains(screen, "Done.") {
		t.Fatal("the turn ended before its output was seen live")
	}
	write([]byte{0x03})
	screen = term.waitFor(t, "the cancelled turn", func(s string) bool { return strings.Contains(s, "⏹ turn cancelled") && atPrompt(s) })
	if strings.Contains(screen, "running bash") || strings.Count(screen, "┊") != 0 {
		t.Errorf("the live area stayed after the call ended:\n%s", screen)
	}
}

func TestChatCtrlCCancelsTurn(t *testing.T) {
	t.Parallel()
	slow := `{"models":[{"id":"scripted"}],"steps":[
 {"text":"Sleeping.","tool_calls":[{"name":"bash","arguments":{"command":"sleep 30","description":"nap"}}]},
 {"text":"Woke up."}]}`
	term, write, exited := startDevPTY(t, slow, "--yes")
	term.waitFor(t, "the prompt", atPrompt)
	write([]byte("take a nap\r"))
	term.waitFor(t, "the spinner while bash runs", func(s string) bool { return strings.Contains(s, "running bash…") })
	write([]byte{0x03})
	screen := term.waitFor(t, "the cancelled turn and a new prompt", func(s string) bool {
		return strings.Contains(s, "⏹ turn cancelled") && atPrompt(s)
	})
	if !strings.Contains(screen, "⏺ $ sleep 30") {
		t.Errorf("no card for the cancelled call")
	}
	if strings.Contains(screen, "Woke up.") {
		t.Errorf("the turn went on after Ctrl-C")
	}
	// Two Ctrl-C while idle exit cleanly.
	write([]byte{0x03})
	term.waitFor(t, "the Ctrl-C hint", func(s string) bool { return strings.Contains(s, "(Ctrl-C again or Ctrl-D to exit)") })
	write([]byte{0x03})
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("dsh dev exited with %v after the second Ctrl-C", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("dsh dev did not exit after the second Ctrl-C")
	}
}

// bytesCopy copies until the pty reports EOF or EIO (the child exited).
func bytesCopy(dst *vt, src interface{ Read([]byte) (int, error) }) (int64, error) {
	buf := make([]byte, 4096)
	var n int64
	for {
		k, err := src.Read(buf)
		if k > 0 {
			_, _ = dst.Write(buf[:k])
			n += int64(k)
		}
		if err != nil {
			return n, err
		}
	}
}

func TestDevOneShot(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		script   string
		wantCode int
		json     bool
		noYes    bool // -p defaults to --approval never
	}{
		{name: "completed turn prints the answer", script: script, wantCode: 0},
		{name: "without --yes nothing is asked and bash is refused", script: script, wantCode: 0, noYes: true},
		{name: "json prints every event", script: script, wantCode: 0, json: true},
		{name: "failed turn exits non-zero", wantCode: 1,
			script: `{"models":[{"id":"scripted"}],"steps":[{"text":"x","failure":{"code":"INVALID_REQUEST","message":"scripted failure"}}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			args := devArgs(filepath.Join(dir, ".dsh"), "-p", "run the two commands")
			if !tt.noYes {
				args = append(args, "--yes")
			}
			if tt.json {
				args = append(args, "--json")
			}
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(binDir, "dsh"), args...)
			cmd.Dir = dir
			cmd.Env = cleanEnv("DSH_SCRIPT=" + tt.script)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tt.wantCode {
				t.Fatalf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.wantCode, stdout.String(), stderr.String())
			}
			out := stdout.String()
			switch {
			case tt.json:
				lines := strings.Split(strings.TrimSpace(out), "\n")
				var evs []*sessionv1.SessionEvent
				for _, l := range lines {
					ev, err := session.UnmarshalEventJSON([]byte(l))
					if err != nil {
						t.Fatalf("line %q: %v", l, err)
					}
					evs = append(evs, ev)
				}
				checkTurn(t, evs, 0)
			case tt.noYes:
				if !strings.Contains(out, "approval policy is never") {
					t.Fatalf("stdout = %q, want the refusal the model saw", out)
				}
			case tt.wantCode == 0:
				if !strings.Contains(stderr.String(), "--yes: every tool call runs without asking") {
					t.Errorf("stderr = %q, want --yes to say so", stderr.String())
				}
				if !strings.Contains(out, "Both ran. Last output:") || !strings.Contains(out, "two") {
					t.Fatalf("stdout = %q, want the answer", out)
				}
			default:
				if !strings.Contains(stderr.String(), "scripted failure") {
					t.Fatalf("stderr = %q, want the failure named", stderr.String())
				}
			}
		})
	}
}

func TestChatWithNoAgent(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t) // nothing listens there
	cmd := exec.Command(filepath.Join(binDir, "dsh"), "chat", "--addr", addr)
	cmd.Env = cleanEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("dsh chat with no agent: err %v, want a non-zero exit", err)
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "no agent service at "+addr) {
		t.Fatalf("stderr = %q, want one line naming the address", stderr.String())
	}
}

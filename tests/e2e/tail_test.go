package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
)

// TestDevWithEventsTail runs `dsh dev` (its chat on a pipe) and, as a second
// terminal would, `dsh events tail` against the NATS server dev prints; the
// tail, scoped to the default tenant (dsh dev has no auth), shows the
// session's events live, each once, in order.
func TestDevWithEventsTail(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	natsAddr := freeAddr(t)
	dev := exec.Command(filepath.Join(binDir, "dsh"), "dev", "--data", filepath.Join(dir, ".dsh"),
		"--agent-listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0", "--toolhost-listen", "127.0.0.1:0", "--nats-listen", natsAddr, "--yes")
	dev.Dir = dir
	dev.Env = cleanEnv("DSH_SCRIPT=" + script)
	stdin, err := dev.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	devOut := &syncBuffer{}
	dev.Stdout, dev.Stderr = devOut, devOut
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	devDone := make(chan error, 1)
	go func() { devDone <- dev.Wait() }()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-devDone:
		case <-time.After(20 * time.Second):
			_ = dev.Process.Kill()
			<-devDone
		}
		if t.Failed() {
			t.Logf("dsh dev output:\n%s", devOut.String())
		}
	})
	url := "nats://" + natsAddr
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(devOut.String(), "› ") {
		if time.Now().After(deadline) {
			t.Fatalf("dsh dev shows no prompt:\n%s", devOut.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(devOut.String(), url) {
		t.Fatalf("dsh dev does not print the NATS URL %s:\n%s", url, devOut.String())
	}

	full := startTail(t, url, deadline)
	lean := startTail(t, url, deadline, "--deltas=false")

	if _, err := io.WriteString(stdin, "run the two commands\n"); err != nil {
		t.Fatal(err)
	}
	evs := full.turn(t)
	checkTurn(t, evs, 0)
	// Without deltas: every event but the chunks, in the same order.
	var want, got []string
	for _, ev := range evs {
		if ev.GetAssistantChunk() == nil {
			want = append(want, fmt.Sprint(ev.GetSeq(), " ", session.TypeName(ev)))
		}
	}
	for _, ev := range lean.turn(t) {
		got = append(got, fmt.Sprint(ev.GetSeq(), " ", session.TypeName(ev)))
	}
	if len(want) == len(evs) || strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("events tail --deltas=false: %v\nwant %v (of %d events)", got, want, len(evs))
	}
}

// tailProc is a running `dsh events tail --json`.
type tailProc struct {
	out    io.Reader
	stderr *syncBuffer
}

// startTail starts `dsh events tail --json` on the default tenant and waits
// until it follows.
func startTail(t *testing.T, url string, deadline time.Time, extra ...string) *tailProc {
	t.Helper()
	tail := exec.Command(filepath.Join(binDir, "dsh"), append([]string{"events", "tail", "--nats", url, "--tenant", "default", "--json"}, extra...)...)
	tail.Env = cleanEnv()
	tailOut, err := tail.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	tailErr := &syncBuffer{}
	tail.Stderr = tailErr
	if err := tail.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tail.Process.Kill(); _ = tail.Wait() })
	// The tail follows new events only; it is subscribed once it says so.
	for !strings.Contains(tailErr.String(), "following") {
		if time.Now().After(deadline) {
			t.Fatalf("events tail did not start: %s", tailErr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &tailProc{out: tailOut, stderr: tailErr}
}

// turn reads the tail's events up to the first turn/end.
func (p *tailProc) turn(t *testing.T) []*sessionv1.SessionEvent {
	t.Helper()
	var evs []*sessionv1.SessionEvent
	got := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(p.out)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			var line struct {
				Tenant    string          `json:"tenant"`
				SessionID string          `json:"session_id"`
				Event     json.RawMessage `json:"event"`
			}
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				got <- err
				return
			}
			if line.Tenant != "default" {
				got <- fmt.Errorf("dsh dev session published under tenant %q, want default", line.Tenant)
				return
			}
			ev, err := session.UnmarshalEventJSON(line.Event)
			if err != nil {
				got <- err
				return
			}
			evs = append(evs, ev)
			if ev.GetTurnEnd() != nil {
				got <- nil
				return
			}
		}
		got <- sc.Err()
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("events tail showed no turn/end; stderr: %s", p.stderr.String())
	}
	return evs
}

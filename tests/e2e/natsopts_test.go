package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsh-dev/dsh/internal/natstest"
)

func TestAgentBadNATSOptions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{name: "wrong scheme", args: []string{"--nats", "http://127.0.0.1:4222"}, want: `--nats "http://127.0.0.1:4222"`},
		{name: "unreadable creds", args: []string{"--nats", "nats://127.0.0.1:4222", "--nats-creds", "/nonexistent/user.creds"}, want: "--nats-creds"},
		{name: "user without password", args: []string{"--nats", "nats://127.0.0.1:4222", "--nats-user", "agent"}, want: "DSH_NATS_PASSWORD"},
		// There is no password flag: a flag value is visible in ps.
		{name: "password flag", args: []string{"--nats", "nats://127.0.0.1:4222", "--nats-password", "x"}, want: "flag provided but not defined: -nats-password"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			args := append([]string{"--listen", freeAddr(t), "--gateway", freeAddr(t), "--toolhost", freeAddr(t), "--data", t.TempDir()}, tt.args...)
			cmd := exec.CommandContext(ctx, filepath.Join(binDir, "agent"), args...)
			cmd.Env = cleanEnv()
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("agent started with a bad NATS option:\n%s", out)
			}
			if !strings.Contains(string(out), tt.want) {
				t.Fatalf("the startup error does not name %s:\n%s", tt.want, out)
			}
		})
	}
}

func TestAgentServesWithNATSUnreachableAtStart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	s := &stack{t: t, nats: natstest.Start(t), dataDir: t.TempDir(), workspace: t.TempDir()}
	s.nats.Stop()
	s.gatewayAddr, s.toolhostAddr, s.agentAddr = freeAddr(t), freeAddr(t), freeAddr(t)
	s.gateway = start(t, "llmgateway", cleanEnv("DSH_SCRIPT="+script), "--listen", s.gatewayAddr)
	s.toolhost = start(t, "toolhost", cleanEnv(), "--listen", s.toolhostAddr, "--workspace", s.workspace)
	waitServing(t, s.gatewayAddr, s.gateway)
	waitServing(t, s.toolhostAddr, s.toolhost)
	s.startAgent()
	dialAgent(t, s)
	id := s.createSession(ctx)
	evs := s.runTurn(ctx, id, 0, "nats is not there yet")
	checkTurn(t, evs, 0)
	if !strings.Contains(strings.ToLower(s.agent.out.String()), "nats unreachable") {
		t.Errorf("no warning about the unreachable NATS server in the agent's log:\n%s", s.agent.out.String())
	}
	if err := s.nats.Restart(); err != nil {
		t.Fatal(err)
	}
	checkSame(t, "jetstream events once NATS is up", jetStreamEvents(t, s.nats.URL(), id, len(evs)), evs)
}

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/events"
	"github.com/dsh-dev/dsh/internal/natstest"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/internal/testpki"
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

// TestSecuredNATS runs the agent and `dsh events tail` as processes against
// a nats-server that requires mTLS and authenticates every user: the agent
// with an nkey seed file (--nats-nkey), the tail as a reader of the default
// tenant with --nats-user and the password from DSH_NATS_PASSWORD (never a
// flag). The tail replays the turn; the same reader asking for another
// tenant is refused by the server, and the tail says why.
func TestSecuredNATS(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "nats")
	srvCert := ca.Server("nats", testpki.Loopback())
	client := ca.Client("client", testpki.Names{CommonName: "dsh"})
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	seedFile := filepath.Join(t.TempDir(), "agent.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	password := "pw-" + t.Name()
	conf := fmt.Sprintf(`
tls { cert_file: %q, key_file: %q, ca_file: %q, verify: true }
accounts { DSH { jetstream: enabled, users: [
  { nkey: %q, permissions: %s }
  { user: reader, password: %q, permissions: %s }
] } }
`, srvCert.CertFile, srvCert.KeyFile, ca.CertFile, pub, natstest.Permissions(events.AgentPermissions()),
		password, natstest.Permissions(events.ConsumerPermissions(events.DefaultTenant)))
	tlsArgs := []string{"--nats-tls-ca", ca.CertFile, "--nats-tls-cert", client.CertFile, "--nats-tls-key", client.KeyFile}
	s := startStackWith(t, &stack{nats: natstest.StartWith(t, natstest.Options{Config: conf}),
		agentArgs: append([]string{"--nats-nkey", seedFile}, tlsArgs...)})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	id := s.createSession(ctx)
	evs := s.runTurn(ctx, id, 0, "publish through a secured NATS")

	tail := func(ctx context.Context, tenant string) *exec.Cmd {
		args := append([]string{"events", "tail", "--nats", s.nats.URL(), "--tenant", tenant, "--all", "--json",
			"--nats-user", "reader"}, tlsArgs...)
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "dsh"), args...)
		cmd.Env = cleanEnv("DSH_NATS_PASSWORD=" + password)
		return cmd
	}
	cmd := tail(ctx, events.DefaultTenant)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var got []*sessionv1.SessionEvent
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for len(got) < len(evs) && sc.Scan() {
		var line struct {
			Tenant    string          `json:"tenant"`
			SessionID string          `json:"session_id"`
			Event     json.RawMessage `json:"event"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatal(err)
		}
		ev, err := session.UnmarshalEventJSON(line.Event)
		if err != nil {
			t.Fatal(err)
		}
		if line.Tenant != events.DefaultTenant || line.SessionID != id {
			t.Fatalf("tail shows tenant %q session %q, want %s %s", line.Tenant, line.SessionID, events.DefaultTenant, id)
		}
		got = append(got, ev)
	}
	if len(got) < len(evs) {
		t.Fatalf("tail ended after %d of %d events: %v\n%s", len(got), len(evs), sc.Err(), stderr.String())
	}
	checkSame(t, "events tailed through the secured NATS", got, evs)

	// The same credentials cannot read another tenant.
	octx, ocancel := context.WithTimeout(ctx, time.Minute)
	defer ocancel()
	other := tail(octx, "globex")
	res, err := other.CombinedOutput()
	if err == nil || !strings.Contains(strings.ToLower(string(res)), "permissions violation") {
		t.Fatalf("tail of another tenant: err %v, output:\n%s", err, res)
	}
}

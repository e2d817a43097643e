// Package e2e runs dsh's real binaries — the LLM gateway with the scripted
// provider, the built-in toolhost, the agent and the dsh CLI, built with
// `go build` into a temporary directory — against an embedded NATS server
// with JetStream, on loopback ports chosen by the OS, and checks what a
// platform team would see from the outside: the API event stream, the same
// events in JetStream, the derived messages, the persisted log after a
// restart, a NATS outage, and the chat UI in a pseudo-terminal.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/events"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/internal/natstest"
	"github.com/dsh-dev/dsh/internal/pgtest"
	"github.com/dsh-dev/dsh/internal/proctest"
)

// binDir holds the binaries built once by TestMain.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dsh-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	cmd := exec.Command("go", "build", "-o", dir+string(os.PathSeparator),
		"github.com/dsh-dev/dsh/services/llmgateway/cmd/llmgateway",
		"github.com/dsh-dev/dsh/services/toolhost/cmd/toolhost",
		"github.com/dsh-dev/dsh/services/agent/cmd/agent",
		"github.com/dsh-dev/dsh/services/mcpbridge/cmd/mcpbridge",
		"github.com/dsh-dev/dsh/cmd/dsh",
	)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: go build:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := pgtest.Main(m) // a PostgreSQL server for the postgres-store tests
	os.RemoveAll(dir)
	os.Exit(code)
}

// script is the scripted model of every test: two bash steps, then an
// answer quoting the last tool result.
const script = `{"models":[{"id":"scripted"}],"steps":[
 {"reasoning":"I will run two commands.","text":"Running the first command.","tool_calls":[{"name":"bash","arguments":{"command":"echo one","description":"first"}}]},
 {"text":"Now the second.","tool_calls":[{"name":"bash","arguments":{"command":"echo two","description":"second"}}]},
 {"text":"Both ran. Last output: {{last_tool_result}}"}
]}`

// cleanEnv is the environment without provider keys, so the gateway serves
// only the scripted route.
func cleanEnv(extra ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasSuffix(k, "_API_KEY"), k == "OPENAI_BASE_URL", strings.HasPrefix(k, "DSH_"),
			strings.HasPrefix(k, "OTEL_"), strings.HasPrefix(k, "NATS_"), k == "NO_COLOR":
			continue
		}
		out = append(out, kv)
	}
	return append(out, extra...)
}

func freeAddr(t testing.TB) string {
	t.Helper()
	return proctest.FreeAddr(t)
}

// proc is a running binary.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func start(t testing.TB, name string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, name), args...)
	cmd.Env = env
	p := &proc{name: name, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", name, p.out.String())
		}
	})
	return p
}

// stop sends SIGTERM and waits for the process (SIGKILL after 15 s).
func (p *proc) stop(t testing.TB) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		t.Errorf("%s did not stop after SIGTERM; killing it", p.name)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// waitServing polls the health service at addr until it answers SERVING.
func waitServing(t testing.TB, addr string, p *proc, opts ...grpc.DialOption) {
	t.Helper()
	conn, err := grpcserver.Dial(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited before serving:\n%s", p.name, p.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s at %s not serving after 60s (last error %v):\n%s", p.name, addr, err, p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stack is a running set of services.
type stack struct {
	t                             testing.TB
	nats                          *natstest.Server
	gateway, toolhost, agent      *proc
	gatewayAddr, toolhostAddr     string
	agentAddr, dataDir, workspace string
	conn                          *grpc.ClientConn
	client                        agentv1.AgentServiceClient
	// agentArgs and agentEnv are added to the agent's command line and
	// environment (the NATS security options).
	agentArgs, agentEnv []string
	// script, when set, replaces the gateway's scripted model (script).
	script string
}

// startStack starts NATS, the gateway, the toolhost and the agent, whose
// environment gets agentEnv (e.g. DSH_STORE=postgres) on top of cleanEnv.
func startStack(t *testing.T, agentEnv ...string) *stack {
	t.Helper()
	return startStackWith(t, &stack{nats: natstest.Start(t), agentEnv: agentEnv})
}

// startStackWith starts the services of s (whose nats and agent options
// are set) and connects to its agent.
func startStackWith(t testing.TB, s *stack) *stack {
	t.Helper()
	s.t, s.dataDir, s.workspace = t, t.TempDir(), t.TempDir()
	s.gatewayAddr, s.toolhostAddr, s.agentAddr = freeAddr(t), freeAddr(t), freeAddr(t)
	if s.script == "" {
		s.script = script
	}
	s.gateway = start(t, "llmgateway", cleanEnv("DSH_SCRIPT="+s.script), "--listen", s.gatewayAddr)
	s.toolhost = start(t, "toolhost", cleanEnv(), "--listen", s.toolhostAddr, "--workspace", s.workspace)
	waitServing(t, s.gatewayAddr, s.gateway)
	waitServing(t, s.toolhostAddr, s.toolhost)
	s.startAgent()
	dialAgent(t, s)
	return s
}

// dialAgent connects the stack's client to its agent.
func dialAgent(t testing.TB, s *stack) *grpc.ClientConn {
	t.Helper()
	conn, err := grpcserver.Dial(s.agentAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s.conn, s.client = conn, agentv1.NewAgentServiceClient(conn)
	return conn
}

// startAgent runs the agent binary. Titles are off: these tests compare
// snapshots of the log, which an asynchronous title turn would race.
func (s *stack) startAgent() {
	args := append([]string{"--listen", s.agentAddr, "--gateway", s.gatewayAddr,
		"--toolhost", "builtin=" + s.toolhostAddr, "--data", s.dataDir, "--nats", s.nats.URL(),
		"--approval-rule", "*=allow", "--no-titles"}, s.agentArgs...) // nobody answers approvals here
	s.agent = start(s.t, "agent", cleanEnv(s.agentEnv...), args...)
	waitServing(s.t, s.agentAddr, s.agent)
	if s.conn != nil && s.conn.Target() == s.agentAddr {
		reconnect(s.t, s.conn)
	}
}

// reconnect brings conn, whose server was restarted on the same address,
// back to READY: after the old process died the channel waits out a
// reconnect backoff, and an RPC gRPC does not retry (StreamEvents) fails at
// once with the dead process's "connection refused" until then.
func reconnect(t testing.TB, conn *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn.ResetConnectBackoff()
	conn.Connect()
	for st := conn.GetState(); st != connectivity.Ready; st = conn.GetState() {
		if st == connectivity.TransientFailure {
			conn.ResetConnectBackoff()
		}
		if !conn.WaitForStateChange(ctx, st) {
			t.Fatalf("the agent's client connection is %v 30s after the agent served again", st)
		}
	}
}

func (s *stack) createSession(ctx context.Context) string {
	s.t.Helper()
	resp, err := s.client.CreateSession(ctx, &agentv1.CreateSessionRequest{
		Cwd:     s.workspace,
		Options: &sessionv1.SessionOptions{Provider: "scripted", Model: "scripted", WorkspaceRoot: s.workspace},
	})
	if err != nil {
		s.t.Fatalf("CreateSession: %v", err)
	}
	return resp.GetSession().GetHeader().GetId()
}

// runTurn sends a prompt and returns the events of the API stream from
// from through the turn/end.
func (s *stack) runTurn(ctx context.Context, id string, from int64, prompt string) []*sessionv1.SessionEvent {
	s.t.Helper()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := s.client.StreamEvents(sctx, &agentv1.StreamEventsRequest{SessionId: id, FromSeq: from})
	if err != nil {
		s.t.Fatalf("StreamEvents: %v", err)
	}
	if _, err := s.client.Send(ctx, &agentv1.SendRequest{SessionId: id, Content: textBlocks(prompt)}); err != nil {
		s.t.Fatalf("Send: %v", err)
	}
	var evs []*sessionv1.SessionEvent
	for {
		resp, err := stream.Recv()
		if err != nil {
			s.t.Fatalf("StreamEvents.Recv after %d events: %v", len(evs), err)
		}
		evs = append(evs, resp.GetEvent())
		if _, ok := resp.GetEvent().GetPayload().(*sessionv1.SessionEvent_TurnEnd); ok {
			return evs
		}
	}
}

// jetStreamEvents polls the stream until it holds want events of session
// id (or the deadline passes) and returns them in stream order.
func jetStreamEvents(t *testing.T, url, id string, want int) []*sessionv1.SessionEvent {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	deadline := time.Now().Add(30 * time.Second)
	var got []*sessionv1.SessionEvent
	for {
		got = got[:0]
		st, err := js.Stream(ctx, events.StreamName)
		if err == nil {
			info, ierr := st.Info(ctx, jetstream.WithSubjectFilter(events.EventSubject("", id)))
			if ierr == nil && info.State.Msgs > 0 {
				for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
					m, err := st.GetMsg(ctx, seq)
					if err != nil || m.Subject != events.EventSubject("", id) {
						continue
					}
					sid, ev, err := events.DecodeEvent(m.Header, m.Data)
					if err != nil {
						t.Fatal(err)
					}
					if sid != id {
						t.Fatalf("message on %s carries session %q", m.Subject, sid)
					}
					got = append(got, ev)
				}
			}
		}
		if len(got) >= want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}

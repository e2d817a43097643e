package mcpbridge_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/services/mcpbridge"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

const (
	muteEnv = "MCPBRIDGE_TEST_MUTE"
	httpEnv = "MCPBRIDGE_TEST_HTTP"
)

// serveHTTPChild serves testServer over streamable HTTP (with an event
// store, so streams are resumable) and prints its address; the test kills
// it to play a server that dies.
func serveHTTPChild() {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.Exit(1)
	}
	fmt.Printf("%s\n", lis.Addr())
	srv := testServer()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)})
	_ = http.Serve(lis, h)
	os.Exit(0)
}

// syncLog collects a bridge's log lines.
type syncLog struct {
	mu  sync.Mutex
	buf strings.Builder
	t   *testing.T
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return l.buf.Write(p)
}

func (l *syncLog) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), s)
}

// The attacker: a secret in the bridge's environment must not reach a
// stdio server (a tool that dumps its environment), while the allow-list,
// passEnv and env do.
func TestStdioServerEnvironmentIsAllowListed(t *testing.T) {
	t.Parallel()
	env := map[string]string{"PATH": "/usr/bin:/bin", "HOME": "/home/u", "DSH_PROVIDER_KEY": "canary-9f3c1e", "AWS_SECRET_ACCESS_KEY": "canary-aws", "WANTED": "yes"}
	srv := stdioServer(t)
	srv.PassEnv = []string{"WANTED"}
	srv.Env[" FROM_CONFIG"[1:]] = "set"
	c, _ := startBridgeWith(t, mcpbridge.Config{
		Servers: mcpbridge.FileConfig{Servers: map[string]mcpbridge.ServerConfig{"srv": srv}},
		Getenv:  func(k string) (string, bool) { v, ok := env[k]; return v, ok },
	}, logWriter{t})
	got := call(t, c, "srv__env", `{}`).GetContent()[0].GetText().GetText()
	for _, secret := range []string{"canary-9f3c1e", "canary-aws", "DSH_PROVIDER_KEY", "AWS_SECRET"} {
		if strings.Contains(got, secret) {
			t.Errorf("the server saw %q in its environment:\n%s", secret, got)
		}
	}
	for _, want := range []string{"PATH=/usr/bin:/bin", "HOME=/home/u", "WANTED=yes", "FROM_CONFIG=set", stdioEnv + "=1"} {
		if !strings.Contains(got, want) {
			t.Errorf("environment lacks %s:\n%s", want, got)
		}
	}
}

// A server that never answers initialize is logged, retried with backoff,
// and reported NOT_SERVING under its own health name while the other
// server is SERVING.
func TestSilentServerIsLoggedRetriedAndNotServing(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncLog{t: t}
	c, conn := startBridgeWith(t, mcpbridge.Config{
		Servers: mcpbridge.FileConfig{Servers: map[string]mcpbridge.ServerConfig{
			"mute": {Command: exe, Env: map[string]string{muteEnv: "1"}},
			"ok":   stdioServer(t),
		}},
		InitTimeout: 1500 * time.Millisecond, // room for the ok server to start under -race on a loaded box
	}, logs)
	poll(t, "two logged initialize timeouts", func() bool { return logs.count("did not answer initialize within 1.5s") >= 2 })
	h := healthpb.NewHealthClient(conn)
	status := func(name string) healthpb.HealthCheckResponse_ServingStatus {
		r, err := h.Check(t.Context(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil {
			t.Fatalf("health %s: %v", name, err)
		}
		return r.GetStatus()
	}
	if got := status(mcpbridge.HealthService("mute")); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("mute: %v, want NOT_SERVING", got)
	}
	poll(t, "ok SERVING", func() bool { return status(mcpbridge.HealthService("ok")) == healthpb.HealthCheckResponse_SERVING })
	if r := call(t, c, "ok__text", `{}`); r.GetIsError() {
		t.Errorf("ok__text = %v", r)
	}
}

// Server logging reaches the bridge's log; server instructions reach
// GetWorkspaceContext as an instruction file.
func TestServerLogsAndInstructions(t *testing.T) {
	t.Parallel()
	logs := &syncLog{t: t}
	c, _ := startBridgeWith(t, mcpbridge.Config{Servers: mcpbridge.FileConfig{Servers: map[string]mcpbridge.ServerConfig{"srv": stdioServer(t)}}}, logs)
	call(t, c, "srv__log", `{}`)
	poll(t, "the server's log line", func() bool {
		return logs.count(`level=WARN msg="mcp server log" mcp_server=srv mcp_level=warning mcp_logger=disk data="disk almost full"`) == 1
	})
	ws, err := c.GetWorkspaceContext(t.Context(), &toolsv1.GetWorkspaceContextRequest{Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	files := ws.GetInstructions()
	if ws.GetOwnsWorkspace() || len(files) != 1 || files[0].GetPath() != "mcp://srv" || files[0].GetContent() != testInstructions || ws.GetVersion() == "" {
		t.Errorf("workspace context = %v", ws)
	}
}

// A streamable-HTTP server that dies mid-call (killed: its connections
// close) or hangs (stopped: they stay open, nothing answers) fails the call
// within seconds — go-sdk's default resume attempts held a dead one ~20 s,
// and a hung one forever — and the server's health drops to NOT_SERVING.
func TestHTTPServerDyingMidCall(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
	}{{"killed", syscall.SIGKILL}, {"hung", syscall.SIGSTOP}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			httpServerDies(t, tc.sig)
		})
	}
}

func httpServerDies(t *testing.T, sig syscall.Signal) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command(exe)
	child.Env = append(os.Environ(), httpEnv+"=1")
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	c, conn := startBridgeWith(t, mcpbridge.Config{Servers: mcpbridge.FileConfig{Servers: map[string]mcpbridge.ServerConfig{
		"web": {URL: "http://" + strings.TrimSpace(addr)},
	}}, KeepAlive: 2 * time.Second}, logWriter{t}) // a ping may take 1 s on a loaded box
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	stream, err := c.Execute(ctx, &toolsv1.ExecuteRequest{Execution: &toolsv1.ToolExecution{CallId: "c", Name: "web__slow", Arguments: `{}`, Context: toolCtx}})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv() // the tool is running: its progress arrived
	if err != nil || first.GetOutput().GetText() != "started\n" {
		t.Fatalf("first message %v, %v; want the progress", first, err)
	}
	if err := child.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	since := time.Now()
	var res *toolsv1.ToolExecutionResult
	for res == nil {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("stream: %v", err)
		}
		res = m.GetResult()
	}
	took := time.Since(since)
	t.Logf("call failed %v after the server got %v: %v", took, sig, res.GetContent())
	if !res.GetIsError() || res.GetError().GetCode() != mcpbridge.CodeProtocol {
		t.Errorf("result %v, want an %s error", res, mcpbridge.CodeProtocol)
	}
	if took > 10*time.Second {
		t.Errorf("the call took %v to fail", took)
	}
	h := healthpb.NewHealthClient(conn)
	poll(t, "NOT_SERVING", func() bool {
		r, err := h.Check(t.Context(), &healthpb.HealthCheckRequest{Service: mcpbridge.HealthService("web")})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING
	})
}

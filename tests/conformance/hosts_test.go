package conformance_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/dsh-dev/dsh/services/mcpbridge"
	"github.com/dsh-dev/dsh/tests/conformance"
	"github.com/dsh-dev/dsh/tests/conformance/conftools"
	"github.com/dsh-dev/dsh/tests/conformance/mcpconf"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

const mcpStdioEnv = "DSH_CONFORMANCE_MCP_STDIO"

// TestMain doubles as the stdio MCP conformance server the bridge starts.
func TestMain(m *testing.M) {
	if os.Getenv(mcpStdioEnv) == "1" {
		if err := mcpconf.NewServer().Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			fmt.Fprintln(os.Stderr, "mcp conformance server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func dialer(addr string) func() (*grpc.ClientConn, error) {
	return func() (*grpc.ClientConn, error) {
		return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
}

var listeningRE = regexp.MustCompile(`^dsh-toolhost listening on (\S+)$`)

// startProcess starts a host process, waits for its "listening on" line and
// stops it with SIGTERM at cleanup, expecting a clean exit (graceful
// shutdown).
func startProcess(t testing.TB, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Stderr = &testWriter{t: t, prefix: filepath.Base(name) + ": "}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("%s did not shut down cleanly on SIGTERM: %v", name, err)
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("%s did not exit within 20s of SIGTERM", name)
		}
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	select {
	case line := <-lines:
		m := listeningRE.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("%s printed %q, want \"dsh-toolhost listening on HOST:PORT\"", name, line)
		}
		return m[1]
	case err := <-exited:
		t.Fatalf("%s exited before listening: %v", name, err)
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not print its address within 60s", name)
	}
	return ""
}

type testWriter struct {
	t      testing.TB
	prefix string
}

func (w *testWriter) Write(p []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w.t.Log(w.prefix + l)
	}
	return len(p), nil
}

func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func TestPythonHost(t *testing.T) {
	t.Parallel()
	const py = "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skipf("Python runtime missing (%s): %v", py, err)
	}
	if out, err := exec.Command(py, "-c", "import grpc, google.protobuf").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import grpc/protobuf (run scripts/setup-polyglot.sh): %v\n%s", py, err, out)
	}
	addr := startProcess(t, py, filepath.Join(repoRoot(t), "sdk", "python", "examples", "csvhost.py"), "--conformance")
	conformance.Run(t, dialer(addr), conformance.Options{})
}

func TestTypeScriptHost(t *testing.T) {
	t.Parallel()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skipf("Node.js runtime missing: %v", err)
	}
	dir := filepath.Join(repoRoot(t), "sdk", "typescript")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@grpc", "grpc-js")); err != nil {
		t.Fatalf("sdk/typescript has no node_modules (run scripts/setup-polyglot.sh): %v", err)
	}
	addr := startProcess(t, node, filepath.Join(dir, "examples", "jsonhost.js"), "--conformance")
	conformance.Run(t, dialer(addr), conformance.Options{})
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

// serveInProcess runs serve on a loopback listener until the test ends.
func serveInProcess(t testing.TB, serve func(ctx context.Context, lis net.Listener) error) string {
	t.Helper()
	lis := listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return lis.Addr().String()
}

func TestGoHost(t *testing.T) {
	t.Parallel()
	host, err := toolsdk.NewHost(toolsdk.HostConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := host.Add(conftools.Tools(host)...); err != nil {
		t.Fatal(err)
	}
	addr := serveInProcess(t, host.Serve)
	conformance.Run(t, dialer(addr), conformance.Options{})
}

func bridge(t testing.TB, servers map[string]mcpbridge.ServerConfig) string {
	t.Helper()
	b, err := mcpbridge.New(mcpbridge.Config{Servers: mcpbridge.FileConfig{Servers: servers}, MinBackoff: 20 * time.Millisecond},
		slog.New(slog.NewTextHandler(&testWriter{t: t, prefix: "mcpbridge: "}, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	addr := serveInProcess(t, b.Serve)
	select {
	case <-b.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("the bridge did not connect to its MCP servers within 30s")
	}
	return addr
}

func TestMCPBridgeStdio(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	addr := bridge(t, map[string]mcpbridge.ServerConfig{
		"conf": {Command: exe, Env: map[string]string{mcpStdioEnv: "1"}},
	})
	conformance.Run(t, dialer(addr), conformance.Options{Prefix: "conf__", Raw: true, OutputStream: "progress"})
}

func TestMCPBridgeHTTP(t *testing.T) {
	t.Parallel()
	srv := mcpconf.NewServer()
	web := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(web.Close)
	addr := bridge(t, map[string]mcpbridge.ServerConfig{"web": {URL: web.URL}})
	conformance.Run(t, dialer(addr), conformance.Options{Prefix: "web__", Raw: true, OutputStream: "progress"})
}

// Package hostproc starts toolhosts for tests: the Python and TypeScript
// example hosts as processes, a Go toolsdk host and the MCP bridge in
// process, each on an OS-chosen loopback port, stopped at test cleanup.
//
// A host process prints "dsh-toolhost listening on HOST:PORT" as its first
// stdout line; StartProcess waits for it, and at cleanup sends SIGTERM and
// fails the test unless the process exits cleanly (graceful shutdown).
//
// Runtimes that are missing skip the test with a message saying which; a
// runtime that is present but not set up (no Debian grpcio, no node_modules)
// fails it, pointing at scripts/setup-polyglot.sh.
package hostproc

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsh-dev/dsh/services/mcpbridge"
)

// Python is the interpreter that sees Debian's grpcio and protobuf.
const Python = "/usr/bin/python3"

var listeningRE = regexp.MustCompile(`^dsh-toolhost listening on (\S+)$`)

// RepoRoot is the repository root (found from this file's location).
func RepoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("hostproc: cannot locate the repository")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

// StartProcess starts a host process and returns the address it listens on.
func StartProcess(t testing.TB, name string, args ...string) string {
	t.Helper()
	return StartProcessEnv(t, nil, name, args...)
}

// StartProcessEnv is StartProcess with extra environment variables
// (KEY=VALUE) on top of the test's.
func StartProcessEnv(t testing.TB, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stderr = LogWriter(t, filepath.Base(name)+": ")
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

// PythonExample starts sdk/python/examples/csvhost.py with args.
func PythonExample(t testing.TB, args ...string) string {
	t.Helper()
	return PythonExampleEnv(t, nil, args...)
}

// PythonExampleEnv is PythonExample with extra environment variables.
func PythonExampleEnv(t testing.TB, env []string, args ...string) string {
	t.Helper()
	if _, err := os.Stat(Python); err != nil {
		t.Skipf("Python runtime missing (%s): %v", Python, err)
	}
	if out, err := exec.Command(Python, "-c", "import grpc, google.protobuf").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import grpc/protobuf (run scripts/setup-polyglot.sh): %v\n%s", Python, err, out)
	}
	script := filepath.Join(RepoRoot(t), "sdk", "python", "examples", "csvhost.py")
	return StartProcessEnv(t, env, Python, append([]string{script}, args...)...)
}

// TypeScriptExample starts sdk/typescript/examples/jsonhost.js with args.
func TypeScriptExample(t testing.TB, args ...string) string {
	t.Helper()
	return TypeScriptExampleEnv(t, nil, args...)
}

// TypeScriptExampleEnv is TypeScriptExample with extra environment variables.
func TypeScriptExampleEnv(t testing.TB, env []string, args ...string) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skipf("Node.js runtime missing: %v", err)
	}
	dir := filepath.Join(RepoRoot(t), "sdk", "typescript")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@grpc", "grpc-js")); err != nil {
		t.Fatalf("sdk/typescript has no node_modules (run scripts/setup-polyglot.sh): %v", err)
	}
	return StartProcessEnv(t, env, node, append([]string{filepath.Join(dir, "examples", "jsonhost.js")}, args...)...)
}

// Serve runs serve on a loopback listener until the test ends.
func Serve(t testing.TB, serve func(ctx context.Context, lis net.Listener) error) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
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

// Bridge runs an MCP bridge over servers and waits until it tried each.
func Bridge(t testing.TB, servers map[string]mcpbridge.ServerConfig) string {
	t.Helper()
	b, err := mcpbridge.New(mcpbridge.Config{Servers: mcpbridge.FileConfig{Servers: servers}, MinBackoff: 20 * time.Millisecond},
		slog.New(slog.NewTextHandler(LogWriter(t, "mcpbridge: "), &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	addr := Serve(t, b.Serve)
	select {
	case <-b.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("the bridge did not connect to its MCP servers within 30s")
	}
	return addr
}

// LogWriter writes each line to the test log.
func LogWriter(t testing.TB, prefix string) *Writer { return &Writer{t: t, prefix: prefix} }

// Writer is an io.Writer into a test log.
type Writer struct {
	t      testing.TB
	prefix string
}

func (w *Writer) Write(p []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w.t.Log(w.prefix + l)
	}
	return len(p), nil
}

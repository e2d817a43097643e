// Package toolhosttest runs the built-in toolhost in process on a loopback
// port for other areas' tests: a real gRPC server (health, reflection) over a
// real workspace in t.TempDir(), torn down by t.Cleanup.
package toolhosttest

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/services/toolhost"
	"google.golang.org/grpc"
)

// Host is a running built-in toolhost.
type Host struct {
	// Addr is the loopback host:port it serves on.
	Addr string
	// Workspace is its workspace root (a fresh t.TempDir() by default).
	Workspace string
	// Conn and Client are a ready client connection.
	Conn   *grpc.ClientConn
	Client toolsv1.ToolHostClient
	// Service is the in-process service (Host().Add to add test tools).
	Service *toolhost.Service
}

// Option adjusts the service config before start.
type Option func(*toolhost.Config)

// WithWorkspace serves dir instead of a fresh temporary directory.
func WithWorkspace(dir string) Option { return func(c *toolhost.Config) { c.WorkspaceRoot = dir } }

// WithConfig edits the config directly.
func WithConfig(f func(*toolhost.Config)) Option { return Option(f) }

// Start runs the built-in toolhost on 127.0.0.1:0 until the test ends.
func Start(t testing.TB, opts ...Option) *Host {
	t.Helper()
	cfg := toolhost.Config{WorkspaceRoot: t.TempDir()}
	for _, o := range opts {
		o(&cfg)
	}
	svc, err := toolhost.New(cfg, nil)
	if err != nil {
		t.Fatalf("toolhosttest: %v", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("toolhosttest: listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx, lis) }()
	conn, err := grpcserver.Dial(lis.Addr().String())
	if err != nil {
		t.Fatalf("toolhosttest: dial: %v", err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("toolhosttest: serve: %v", err)
		}
		if err := svc.Close(); err != nil {
			t.Errorf("toolhosttest: close: %v", err)
		}
	})
	return &Host{Addr: lis.Addr().String(), Workspace: cfg.WorkspaceRoot, Conn: conn, Client: toolsv1.NewToolHostClient(conn), Service: svc}
}

// Context is a ToolContext for session in the workspace root.
func (h *Host) Context(session string) *toolsv1.ToolContext {
	return &toolsv1.ToolContext{SessionId: session, Cwd: h.Workspace}
}

// Execute runs one call for session and returns its live outputs and its
// result.
func (h *Host) Execute(ctx context.Context, session, tool, args string) ([]*toolsv1.ToolOutput, *toolsv1.ToolExecutionResult, error) {
	return h.ExecuteCall(ctx, &toolsv1.ToolExecution{CallId: "call-" + tool, Name: tool, Arguments: args, Context: h.Context(session)})
}

// ExecuteCall runs one execution as sent (its own context) and returns its
// live outputs and its result.
func (h *Host) ExecuteCall(ctx context.Context, ex *toolsv1.ToolExecution) ([]*toolsv1.ToolOutput, *toolsv1.ToolExecutionResult, error) {
	st, err := h.Client.Execute(ctx, &toolsv1.ExecuteRequest{Execution: ex})
	if err != nil {
		return nil, nil, err
	}
	var outs []*toolsv1.ToolOutput
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return outs, nil, errors.New("toolhosttest: stream ended without a result")
		}
		if err != nil {
			return outs, nil, err
		}
		if r := m.GetResult(); r != nil {
			return outs, r, nil
		}
		outs = append(outs, m.GetOutput())
	}
}

package toolhost_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/cputime"
	"github.com/dsh-dev/dsh/services/toolhost/toolhosttest"
)

// BenchmarkReadRoundTrip is one read of a 100-line file over loopback gRPC:
// ctx=bare names no workspace root or policy; ctx=agent carries what an
// agent sends every call (the session's workspace root, a workspace-write
// policy), so the root's resolution per call is measured too.
func BenchmarkReadRoundTrip(b *testing.B) {
	h := toolhosttest.Start(b)
	if err := os.WriteFile(filepath.Join(h.Workspace, "f.txt"), []byte(strings.Repeat("some line of text\n", 100)), 0o644); err != nil {
		b.Fatal(err)
	}
	agent := h.Context("s")
	agent.WorkspaceRoot = h.Workspace
	agent.Sandbox = &toolsv1.SandboxPolicy{Mode: toolsv1.SandboxMode_SANDBOX_MODE_WORKSPACE_WRITE, Network: toolsv1.NetworkAccess_NETWORK_ACCESS_ON}
	for _, bc := range []struct {
		name string
		tc   *toolsv1.ToolContext
	}{{"bare", h.Context("s")}, {"agent", agent}} {
		b.Run("ctx="+bc.name, func(b *testing.B) {
			ex := &toolsv1.ToolExecution{CallId: "call-read", Name: "read", Arguments: `{"file_path":"f.txt"}`, Context: bc.tc}
			b.ReportAllocs()
			start, n := cputime.Process(), 0
			for b.Loop() {
				if _, r, err := h.ExecuteCall(b.Context(), ex); err != nil || r.GetIsError() {
					b.Fatal(err, r)
				}
				n++
			}
			// Client and server are this process: CPU per call holds up on a
			// busy machine where wall time does not.
			b.ReportMetric(float64((cputime.Process()-start).Nanoseconds())/float64(n), "cpu-ns/op")
		})
	}
}

// BenchmarkBashTrueRoundTrip is one `true` through the bash tool: process
// group spawn, pipes, wait, result.
func BenchmarkBashTrueRoundTrip(b *testing.B) {
	h := toolhosttest.Start(b)
	args := `{"command":"true","description":"nothing"}`
	b.ReportAllocs()
	for b.Loop() {
		if _, r, err := h.Execute(b.Context(), "s", "bash", args); err != nil || r.GetIsError() {
			b.Fatal(err, r)
		}
	}
}

//go:build linux

package toolhost_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/services/toolhost/toolhosttest"
)

// TestCwdOutsideTheSessionRoot attacks a session's confinement through
// its cwd: a call whose workspace root is ws/a and whose cwd is ws/b — a
// sibling inside the host's workspace, by name or through a link in ws/a
// — asks for ws/b's skill, its AGENTS.md and its files. The skill tool
// reads the cwd's catalog and the workspace reader is confined only to the
// host's root, so the host refuses the call itself: INVALID_ARGUMENT
// naming the cwd and the root, and no ws/b content in any answer.
func TestCwdOutsideTheSessionRoot(t *testing.T) {
	t.Parallel()
	const canary = "SIBLING-SESSION-CANARY-90d2"
	h := toolhosttest.Start(t)
	ws, err := filepath.EvalSymlinks(h.Workspace)
	if err != nil {
		t.Fatal(err)
	}
	a, b := filepath.Join(ws, "a"), filepath.Join(ws, "b")
	writeFile(t, filepath.Join(a, "AGENTS.md"), "session a\n")
	writeFile(t, filepath.Join(b, "AGENTS.md"), canary+"\n")
	writeFile(t, filepath.Join(b, ".agents", "skills", "leak.md"), "---\ndescription: Leak.\n---\n"+canary+"\n")
	if err := os.Symlink(b, filepath.Join(a, "to-b")); err != nil {
		t.Fatal(err)
	}
	calls := map[string]string{
		"skill": args(map[string]any{"name": "leak"}),
		"read":  args(map[string]any{"file_path": "AGENTS.md"}),
		"grep":  args(map[string]any{"pattern": "CANARY"}),
		"bash":  args(map[string]any{"command": "cat AGENTS.md", "description": "read the cwd's AGENTS.md"}),
	}
	for _, cwd := range []string{b, filepath.Join(a, "to-b"), filepath.Join(a, "..", "b"), ws} {
		for tool, ar := range calls {
			tc := &toolsv1.ToolContext{SessionId: "s", Cwd: cwd, WorkspaceRoot: a,
				Sandbox: &toolsv1.SandboxPolicy{Mode: toolsv1.SandboxMode_SANDBOX_MODE_WORKSPACE_WRITE}}
			_, r, err := h.ExecuteCall(t.Context(), &toolsv1.ToolExecution{CallId: "c", Name: tool, Arguments: ar, Context: tc})
			switch {
			case strings.Contains(text(r), canary):
				t.Errorf("%s with cwd %s crossed out of the session root %s: %s", tool, cwd, a, text(r))
			case status.Code(err) != codes.InvalidArgument:
				t.Errorf("%s with cwd %s: %v %q, want INVALID_ARGUMENT", tool, cwd, err, text(r))
			case !strings.Contains(status.Convert(err).Message(), "outside execution.context.workspace_root"):
				t.Errorf("%s with cwd %s: refusal does not name the root: %v", tool, cwd, err)
			}
		}
	}
	// A cwd inside the session root is served: the skill tool and read see
	// ws/a's files only.
	tc := &toolsv1.ToolContext{SessionId: "s", Cwd: a, WorkspaceRoot: a}
	_, r, err := h.ExecuteCall(t.Context(), &toolsv1.ToolExecution{CallId: "c", Name: "read", Arguments: calls["read"], Context: tc})
	if err != nil || !strings.Contains(text(r), "session a") {
		t.Fatalf("read in the session root: %v %q", err, text(r))
	}
}

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
// sibling inside the host's workspace, by name or through a link in ws/a,
// or ws/ab, which shares ws/a's name as a prefix — asks for ws/b's skill,
// its AGENTS.md and its files. The skill tool
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
	a, b, ab := filepath.Join(ws, "a"), filepath.Join(ws, "b"), filepath.Join(ws, "ab")
	writeFile(t, filepath.Join(a, "AGENTS.md"), "session a\n")
	writeFile(t, filepath.Join(b, "AGENTS.md"), canary+"\n")
	writeFile(t, filepath.Join(b, ".agents", "skills", "leak.md"), "---\ndescription: Leak.\n---\n"+canary+"\n")
	writeFile(t, filepath.Join(ab, "AGENTS.md"), canary+"\n")
	writeFile(t, filepath.Join(ab, ".agents", "skills", "leak.md"), "---\ndescription: Leak.\n---\n"+canary+"\n")
	if err := os.Symlink(b, filepath.Join(a, "to-b")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(b, "AGENTS.md"), filepath.Join(a, "to-file")); err != nil {
		t.Fatal(err)
	}
	calls := map[string]string{
		"skill": args(map[string]any{"name": "leak"}),
		"read":  args(map[string]any{"file_path": "AGENTS.md"}),
		"grep":  args(map[string]any{"pattern": "CANARY"}),
		"bash":  args(map[string]any{"command": "cat AGENTS.md", "description": "read the cwd's AGENTS.md"}),
	}
	// run executes tool in a session rooted at a, its cwd cwd, workspace-write.
	run := func(tool, cwd, ar string) (string, bool, error) {
		tc := &toolsv1.ToolContext{SessionId: "s", Cwd: cwd, WorkspaceRoot: a,
			Sandbox: &toolsv1.SandboxPolicy{Mode: toolsv1.SandboxMode_SANDBOX_MODE_WORKSPACE_WRITE}}
		_, r, err := h.ExecuteCall(t.Context(), &toolsv1.ToolExecution{CallId: "c", Name: tool, Arguments: ar, Context: tc})
		return text(r), r.GetIsError(), err
	}
	// ab shares a's name as a prefix: outside a all the same. A cwd that
	// fails to resolve other than by a missing component (through a link
	// to a file) is refused too, not left to the tools.
	for _, cwd := range []string{b, filepath.Join(a, "to-b"), filepath.Join(a, "..", "b"), ws, ab, filepath.Join(a, "to-file", "x")} {
		want := "outside execution.context.workspace_root"
		if strings.Contains(cwd, "to-file") {
			want = "cannot be resolved inside execution.context.workspace_root"
		}
		for tool, ar := range calls {
			out, _, err := run(tool, cwd, ar)
			switch {
			case strings.Contains(out, canary):
				t.Errorf("%s with cwd %s crossed out of the session root %s: %s", tool, cwd, a, out)
			case status.Code(err) != codes.InvalidArgument:
				t.Errorf("%s with cwd %s: %v %q, want INVALID_ARGUMENT", tool, cwd, err, out)
			case !strings.Contains(status.Convert(err).Message(), want) || !strings.Contains(status.Convert(err).Message(), "create a new session"):
				t.Errorf("%s with cwd %s: refusal does not say %q and what to do: %v", tool, cwd, want, err)
			}
		}
	}
	// A missing cwd below a link out (a/to-b/missing) passes the host's
	// check — nothing is there — and is left to the tools, which confine
	// what they resolve against it to the session root: neither the skill
	// tool (its catalog) nor read (../AGENTS.md, which is b's) reaches b.
	// A guard: this passed before the host's cwd check existed.
	missing := filepath.Join(a, "to-b", "missing")
	for tool, ar := range map[string]string{"skill": calls["skill"], "read": args(map[string]any{"file_path": "../AGENTS.md"})} {
		out, isErr, err := run(tool, missing, ar)
		switch {
		case strings.Contains(out, canary):
			t.Errorf("%s with cwd %s crossed out of the session root %s: %s", tool, missing, a, out)
		case err == nil && !isErr:
			t.Errorf("%s with cwd %s answered %q, want a refusal", tool, missing, out)
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

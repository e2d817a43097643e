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
	"github.com/dsh-dev/dsh/internal/fileopen/swaptest"
	"github.com/dsh-dev/dsh/services/toolhost/toolhosttest"
)

// TestSessionRootSwappedForALink attacks the session's workspace root
// itself, which the host resolves on every call: after a first call has
// resolved the root (so a host that remembered it would now use the
// remembered answer), the root — or one of its ancestors — is swapped for
// a link to a directory outside the host's workspace holding a file of
// the same name. Whoever can do that (a session whose root is the parent,
// a danger-full-access session, any process of the user), no later call
// of the session may read, list or run anything there: the root now
// resolves outside the host's workspace, and every call is refused.
// While the root flips back and forth, reads succeed inside or are
// refused, never cross, and no shell writes outside.
func TestSessionRootSwappedForALink(t *testing.T) {
	t.Parallel()
	const secret = "ROOT-SWAP-CANARY-41b9"
	for _, tc := range []struct {
		name string
		// session is the session root under the host's workspace; swapped
		// is the directory swapped for a link (the root or an ancestor).
		session, swapped string
		flip, shell      bool
		// noRoot sends no workspace root: the call is confined to the
		// host's own workspace, which is what is swapped.
		noRoot bool
	}{
		{name: "root swapped", session: "s", swapped: "s"},
		{name: "host workspace swapped", session: ".", swapped: "."},
		{name: "host workspace swapped, no session root", session: ".", swapped: ".", noRoot: true},
		{name: "ancestor swapped", session: "a/s", swapped: "a"},
		{name: "root flipping", session: "s", swapped: "s", flip: true},
		{name: "root flipping, shell writes", session: "s", swapped: "s", flip: true, shell: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := toolhosttest.Start(t)
			outside, err := filepath.EvalSymlinks(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			root, swapped := filepath.Join(h.Workspace, tc.session), filepath.Join(h.Workspace, tc.swapped)
			// The outside directory mirrors the workspace under the swapped
			// name, so a call that followed the link would find its file.
			rel, err := filepath.Rel(swapped, root)
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(root, "f.txt"), "inside\n")
			writeFile(t, filepath.Join(outside, rel, "f.txt"), secret+"\n")
			tcx := &toolsv1.ToolContext{SessionId: "s", Cwd: root, WorkspaceRoot: root,
				Sandbox: &toolsv1.SandboxPolicy{Mode: toolsv1.SandboxMode_SANDBOX_MODE_WORKSPACE_WRITE}}
			if tc.noRoot {
				tcx.WorkspaceRoot = ""
			}
			// call returns a call's answer, or the refusal: the host's
			// INVALID_ARGUMENT for a root outside its workspace, or an error
			// result (a root that changed between the call's checks).
			call := func(tool, a string) (answer string, refusal string) {
				t.Helper()
				_, r, err := h.ExecuteCall(t.Context(), &toolsv1.ToolExecution{CallId: "c", Name: tool, Arguments: a, Context: tcx})
				switch {
				case status.Code(err) == codes.InvalidArgument:
					return "", status.Convert(err).Message()
				case err != nil:
					t.Fatalf("%s: %v", tool, err)
				case strings.Contains(text(r), secret):
					t.Fatalf("%s crossed into %s through the swapped root: %s", tool, outside, text(r))
				case r.GetIsError():
					return "", text(r)
				}
				return text(r), ""
			}
			read := args(map[string]any{"file_path": "f.txt"})
			if out, refusal := call("read", read); !strings.Contains(out, "inside") {
				t.Fatalf("read before the swap: %q, refused: %s", out, refusal)
			}
			alt := swapped + "-alt"
			if tc.flip {
				stop := swaptest.Flip(t, swapped, alt, outside)
				// A shell's sandbox is built from the same resolution of the
				// root. The rest of the machine is readable to a shell
				// (docs/arch/toolhost.md), so what it must never do is write
				// there.
				write := args(map[string]any{"command": "echo w > w.txt", "description": "write through the root"})
				inside := 0
				for range 200 {
					if tc.shell {
						call("bash", write)
					} else if out, _ := call("read", read); strings.Contains(out, "inside") {
						inside++
					}
				}
				stop()
				if inside == 0 && !tc.shell {
					t.Errorf("no read returned the workspace file while the root flipped")
				}
				if _, err := os.Stat(filepath.Join(outside, rel, "w.txt")); err == nil {
					t.Errorf("bash wrote outside the workspace through the flipping root")
				}
				return
			}
			swaptest.Swap(t, swapped, alt, outside)
			calls := map[string]string{
				"read": read,
				"grep": args(map[string]any{"pattern": "CANARY"}),
				"glob": args(map[string]any{"pattern": "*.txt"}),
				"bash": args(map[string]any{"command": "cat f.txt; echo w > w.txt", "description": "read and write through the root"}),
			}
			for tool, a := range calls {
				out, refusal := call(tool, a)
				if refusal == "" {
					t.Errorf("%s after the root was swapped for a link out: answered %q, want a refusal", tool, out)
				} else if !strings.Contains(refusal, "outside this host's workspace") {
					t.Errorf("%s refusal does not say the root leads outside: %s", tool, refusal)
				}
			}
			if _, err := os.Stat(filepath.Join(outside, rel, "w.txt")); err == nil {
				t.Errorf("bash wrote outside the workspace through the swapped root")
			}
		})
	}
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

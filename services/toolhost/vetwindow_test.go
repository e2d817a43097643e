//go:build linux

package toolhost

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/fileopen/swaptest"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/dsh-dev/dsh/services/toolhost/internal/fstools"
)

// TestRootSwappedAfterVetting attacks the window the host opens by
// resolving a call's session root once (vetContext, when Execute checks
// the call) and using that answer for the whole call (Call.Vetted): the
// session root, or an ancestor, is swapped for a link to a directory
// outside the host's workspace holding a file of the same name right after
// the vetting, deterministically, and read, grep, glob, write and bash (when
// the sandbox works here) then run
// through the tool path Execute takes with the stale vetted root. Every
// call must be refused — the file tools and the sandbox's rules open that
// root with links refused — and nothing outside may be read or written.
// A guard: the double resolution before Call.Vetted refused these swaps
// too; this pins that the single resolution still does.
func TestRootSwappedAfterVetting(t *testing.T) {
	t.Parallel()
	const canary = "VETTED-WINDOW-CANARY-5e07"
	for _, tc := range []struct{ name, session, swapped string }{
		{name: "root swapped", session: "s", swapped: "s"},
		{name: "ancestor swapped", session: "a/s", swapped: "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ws, outside := realDir(t), realDir(t)
			s, err := New(Config{WorkspaceRoot: ws}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			root, swapped := filepath.Join(ws, tc.session), filepath.Join(ws, tc.swapped)
			rel, err := filepath.Rel(swapped, root)
			if err != nil {
				t.Fatal(err)
			}
			put(t, filepath.Join(root, "f.txt"), "inside\n")
			put(t, filepath.Join(outside, rel, "f.txt"), canary+"\n")
			before := tree(t, outside)
			tcx := &toolsv1.ToolContext{SessionId: "s", Cwd: root, WorkspaceRoot: root,
				Sandbox: &toolsv1.SandboxPolicy{Mode: toolsv1.SandboxMode_SANDBOX_MODE_WORKSPACE_WRITE}}
			vetted, err := s.vetContext(tcx)
			if v, ok := vetted.(*vettedRoot); err != nil || !ok || v.real != root {
				t.Fatalf("vetContext: %#v, %v; want the root %s itself", vetted, err, root)
			}
			swaptest.Swap(t, swapped, swapped+"-alt", outside)
			calls := map[string]map[string]any{
				"read":  {"file_path": "f.txt"},
				"grep":  {"pattern": "CANARY"},
				"glob":  {"pattern": "*.txt"},
				"write": {"file_path": "w.txt", "content": "x"},
				"bash":  {"command": "cat f.txt; echo w > w.txt", "description": "read and write through the root"},
			}
			for name, a := range calls {
				t.Run(name, func(t *testing.T) {
					if name == "bash" && s.Sandbox().Unavailable != nil {
						// Without a sandbox bash refuses every confined call:
						// its refusal here would prove nothing about the window.
						t.Skipf("the sandbox is unavailable here: %v", s.Sandbox().Unavailable)
					}
					tool, ok := s.host.Tool(name)
					if !ok {
						t.Fatalf("no %s tool", name)
					}
					b, _ := json.Marshal(a)
					call := toolsdk.NewCall(&toolsv1.ToolExecution{CallId: "c-" + name, Name: name, Arguments: string(b), Context: tcx}, nil)
					call.Vetted = vetted
					r, err := tool.Run(t.Context(), call)
					got := toolsdk.ResultText(r.Content)
					if err != nil {
						got += err.Error()
					}
					if strings.Contains(got, canary) {
						t.Errorf("%s read the outside file through the stale vetted root: %s", name, got)
					}
					if err == nil {
						t.Errorf("%s with the stale vetted root answered %q, want a refusal", name, got)
					}
					// The file tools refuse it as the link it is, not for any
					// other reason (a tool broken to fail always would pass
					// the checks above).
					var te *toolsdk.Error
					if name != "bash" && (!errors.As(err, &te) || te.Code() != fstools.CodeSandboxDenied) {
						t.Errorf("%s refused with %v, want %s", name, err, fstools.CodeSandboxDenied)
					}
				})
			}
			if after := tree(t, outside); after != before {
				t.Errorf("a tool wrote outside the workspace through the swapped root: %s, was %s", after, before)
			}
		})
	}
}

// realDir is a fresh temporary directory, symlinks resolved.
func realDir(t *testing.T) string {
	t.Helper()
	d, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func put(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// tree lists dir's entries with their sizes.
func tree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %v %d\n", p, fi.Mode(), fi.Size())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

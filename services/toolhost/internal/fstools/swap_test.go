//go:build linux

package fstools

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/dsh-dev/dsh/internal/fileopen/swaptest"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

// TestSwappedAfterResolve does what a session's own bash can do between a
// file tool's check and its I/O: replace a checked directory with a link
// to outside the workspace. Resolution ran on the real directory; the
// read, the read-before-write and the write that follow must each be
// refused, and nothing outside may be read or created.
func TestSwappedAfterResolve(t *testing.T) {
	for _, scoped := range []bool{false, true} {
		t.Run(map[bool]string{false: "confiner root", true: "call scope"}[scoped], func(t *testing.T) {
			root, outside := realTemp(t), realTemp(t)
			wantDenied := CodePermissionDenied
			c := &Confiner{Root: root}
			if scoped {
				wantDenied = CodeSandboxDenied
				c = &Confiner{Scope: func(*toolsdk.Call) (Scope, error) { return Scope{Mode: "workspace-write", Root: root}, nil }}
			}
			if err := os.WriteFile(filepath.Join(outside, "f"), []byte("CANARY"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(filepath.Join(root, "d"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "d", "f"), []byte("inside"), 0o644); err != nil {
				t.Fatal(err)
			}
			call := &toolsdk.Call{Cwd: root, WorkspaceRoot: root}
			read, err := c.ResolveCall(call, "d/f", false)
			if err != nil {
				t.Fatal(err)
			}
			write, err := c.ResolveCall(call, "d/new/g", true)
			if err != nil {
				t.Fatal(err)
			}
			// The swap: d and a link to outside exchange names atomically.
			swaptest.Swap(t, filepath.Join(root, "d"), filepath.Join(root, "alt"), outside)

			if f, err := read.open(); err == nil {
				b, _ := io.ReadAll(f)
				f.Close()
				t.Fatalf("read through the swapped link: %q", b)
			} else if code := toolCode(err); code != wantDenied {
				t.Fatalf("read: %v (code %s), want %s", err, code, wantDenied)
			}
			if b, _, err := readCurrent(read); err == nil || toolCode(err) != wantDenied {
				t.Fatalf("read-before-write check: %q, %v; want %s", b, err, wantDenied)
			}
			if err := atomicWrite(write, []byte("x")); err == nil || toolCode(err) != wantDenied {
				t.Fatalf("write through the swapped link: %v, want %s", err, wantDenied)
			}
			entries, err := os.ReadDir(outside)
			if err != nil || len(entries) != 1 {
				t.Fatalf("outside the workspace now holds %d entries (%v): the write landed there", len(entries), err)
			}
		})
	}
}

func toolCode(err error) string {
	var te *toolsdk.Error
	if errors.As(err, &te) {
		return te.Code()
	}
	return ""
}

func realTemp(t *testing.T) string {
	t.Helper()
	d, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

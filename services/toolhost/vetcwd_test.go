//go:build linux

package toolhost

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// TestVetContextCwd checks vetContext's answer (the session root's
// resolution, or a refusal) for cwds that take its one-openat2 shortcut (a
// cwd below the root with no link in it) and for those that take the long
// way (the root itself, a link inside, a link out, a missing cwd, a host
// root reached through a link), and that a host whose root was a link at
// start and is a directory now refuses a link-free session root there, as
// the long way does.
func TestVetContextCwd(t *testing.T) {
	t.Parallel()
	ws := realDir(t)
	h1 := filepath.Join(ws, "h1")
	a := filepath.Join(h1, "a")
	put(t, filepath.Join(a, "sub", "f.txt"), "x")
	put(t, filepath.Join(h1, "b", "f.txt"), "x")
	put(t, filepath.Join(ws, "moved", "a", "sub", "f.txt"), "x")
	for _, l := range [][2]string{{filepath.Join(a, "sub"), filepath.Join(a, "in")}, {filepath.Join(h1, "b"), filepath.Join(a, "to-b")}, {h1, filepath.Join(ws, "host")}} {
		if err := os.Symlink(l[0], l[1]); err != nil {
			t.Fatal(err)
		}
	}
	direct, err := New(Config{WorkspaceRoot: h1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close() })
	linked, err := New(Config{WorkspaceRoot: filepath.Join(ws, "host")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { linked.Close() })
	viaLink := filepath.Join(ws, "host", "a")
	for _, c := range []struct {
		name        string
		s           *Service
		root, cwd   string
		real, error string
	}{
		{"the root itself", direct, a, a, a, ""},
		{"a directory below (shortcut)", direct, a, filepath.Join(a, "sub"), a, ""},
		{"a link inside", direct, a, filepath.Join(a, "in"), a, ""},
		{"a link out", direct, a, filepath.Join(a, "to-b"), "", "resolves to"},
		{"a missing cwd", direct, a, filepath.Join(a, "missing"), a, ""},
		{"a sibling", direct, a, filepath.Join(h1, "b"), "", "is outside execution.context.workspace_root"},
		{"the host root through a link", linked, viaLink, filepath.Join(viaLink, "sub"), a, ""},
	} {
		v, err := c.s.vetContext(&toolsv1.ToolContext{SessionId: "s", Cwd: c.cwd, WorkspaceRoot: c.root})
		vr, _ := v.(*vettedRoot)
		switch {
		case c.error != "" && (err == nil || !strings.Contains(err.Error(), c.error)):
			t.Errorf("%s: %#v, %v; want an error with %q", c.name, v, err, c.error)
		case c.error == "" && (err != nil || vr == nil || vr.real != c.real || vr.root != c.root):
			t.Errorf("%s: %#v, %v; want the root %s resolved to %s", c.name, v, err, c.root, c.real)
		}
	}
	// The linked host's root is now a directory of its own, with no link:
	// a session root there resolves to itself, outside the host's real
	// root as it was at start (h1). The shortcut must refuse it as the
	// long way does.
	if err := os.Remove(filepath.Join(ws, "host")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(ws, "moved"), filepath.Join(ws, "host")); err != nil {
		t.Fatal(err)
	}
	for _, cwd := range []string{viaLink, filepath.Join(viaLink, "sub")} {
		v, err := linked.vetContext(&toolsv1.ToolContext{SessionId: "s", Cwd: cwd, WorkspaceRoot: viaLink})
		if err == nil || !strings.Contains(err.Error(), "outside this host's workspace") {
			t.Errorf("cwd %s of a root now outside the host's real root: %#v, %v; want a refusal", cwd, v, err)
		}
	}
}

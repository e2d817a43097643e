//go:build linux

package fstools

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/dsh-dev/dsh/internal/fileopen"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

// TestOpenReadAgreesWithResolve requires OpenRead — the one-openat2 path
// for a path with no link in it — to give what ResolveCall followed by
// Target.open gives, for every kind of path a read can name: the same
// target, the same bytes or the same error code, and never a file outside
// the scope's roots (links out, "..", absolute paths outside). The paths
// with no link in them (shortcut), from a cwd in the root or outside it,
// must meet the shortcut's conditions — lexically in a root, opened by one
// fileopen.NoLinksFile — and get the shortcut's target, so the table
// tests the one-openat2 path and not only the long way.
func TestOpenReadAgreesWithResolve(t *testing.T) {
	root, spill, outside := realTemp(t), realTemp(t), realTemp(t)
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, p string) {
		t.Helper()
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(root, "f"), "inside")
	write(filepath.Join(root, "d", "g"), "deeper")
	write(filepath.Join(spill, "out"), "spilled")
	write(filepath.Join(outside, "secret"), "CANARY")
	link(filepath.Join(outside, "secret"), filepath.Join(root, "out-file"))
	link(outside, filepath.Join(root, "out-dir"))
	link("d", filepath.Join(root, "in-dir"))
	link("f", filepath.Join(root, "in-file"))
	link(filepath.Join(root, "missing"), filepath.Join(root, "dangling"))

	modes := map[string]Scope{
		"workspace-write": {Mode: "workspace-write", Root: root, Read: []string{spill}},
		"read-only":       {Mode: "read-only", ReadOnly: true, Root: root, Read: []string{spill}},
		"unconfined":      {Mode: "danger-full-access", Unconfined: true},
	}
	type readCase struct {
		p, cwd   string // cwd "" is the root
		shortcut bool   // no link in it: OpenRead's one openat2 answers
	}
	paths := []readCase{
		{p: "f", shortcut: true}, {p: "d/g", shortcut: true}, {p: "./d/../f", shortcut: true},
		{p: filepath.Join(root, "f"), shortcut: true}, {p: filepath.Join(spill, "out"), shortcut: true},
		{p: "../" + filepath.Base(root) + "/f", cwd: outside, shortcut: true},
		{p: "d"}, {p: "missing"}, {p: "d/missing/x"}, {p: "f/x"},
		{p: "out-file"}, {p: "out-dir/secret"}, {p: "../" + filepath.Base(outside) + "/secret"}, {p: filepath.Join(outside, "secret")},
		{p: "secret", cwd: outside}, {p: "in-dir/g"}, {p: "in-file"}, {p: "dangling"}, {p: ""},
	}
	for name, sc := range modes {
		c := &Confiner{Scope: func(*toolsdk.Call) (Scope, error) { return sc, nil }}
		for _, rc := range paths {
			p, cwd := rc.p, rc.cwd
			if cwd == "" {
				cwd = root
			}
			t.Run(name+"/"+p+" from "+filepath.Base(cwd), func(t *testing.T) {
				call := &toolsdk.Call{Cwd: cwd, WorkspaceRoot: root}
				if rc.shortcut && !sc.Unconfined {
					abs := p
					if !filepath.IsAbs(abs) {
						abs = filepath.Join(cwd, p)
					}
					abs = filepath.Clean(abs)
					r, in := lexicalRoot(abs, sc)
					f, ok := fileopen.NoLinksFile(abs)
					if !in || !ok {
						t.Fatalf("%s: lexically in a root %v, opened by NoLinksFile %v: OpenRead's shortcut is not taken", abs, in, ok)
					}
					f.Close()
					gotT, f, err := c.OpenRead(call, p)
					if err != nil {
						t.Fatal(err)
					}
					f.Close()
					if want := (Target{Display: abs, Real: abs, Root: r, denied: CodeSandboxDenied}); gotT != want {
						t.Fatalf("OpenRead: %+v, want the shortcut's %+v", gotT, want)
					}
				}
				wantT, wantErr := c.ResolveCall(call, p, false)
				var want string
				if wantErr == nil {
					f, err := wantT.open()
					if err != nil {
						wantErr = err
					} else {
						want = readAll(t, f)
					}
				}
				gotT, f, err := c.OpenRead(call, p)
				switch {
				case wantErr != nil:
					if err == nil || toolCode(err) != toolCode(wantErr) {
						if f != nil {
							f.Close()
						}
						t.Fatalf("OpenRead: %v (%s), ResolveCall+open: %v (%s)", err, toolCode(err), wantErr, toolCode(wantErr))
					}
				case err != nil:
					t.Fatalf("OpenRead: %v; ResolveCall+open read %q", err, want)
				default:
					if got := readAll(t, f); got != want || gotT != wantT {
						t.Fatalf("OpenRead: %+v %q; ResolveCall+open: %+v %q", gotT, got, wantT, want)
					}
				}
				if !sc.Unconfined && want == "CANARY" {
					t.Fatal("a confined read reached outside the workspace")
				}
			})
		}
	}
}

func readAll(t *testing.T, f *os.File) string {
	t.Helper()
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		fi, serr := f.Stat()
		if serr == nil && fi.IsDir() {
			return "<dir>"
		}
		t.Fatal(err)
	}
	return string(b)
}

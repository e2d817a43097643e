//go:build linux

package fstools

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

// TestOpenReadAgreesWithResolve requires OpenRead — the one-openat2 path
// for a path with no link in it — to give what ResolveCall followed by
// Target.open gives, for every kind of path a read can name: the same
// target, the same bytes or the same error code, and never a file outside
// the scope's roots (links out, "..", absolute paths outside).
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
	paths := []string{
		"f", "d/g", "./d/../f", filepath.Join(root, "f"), "d", "missing", "d/missing/x", "f/x",
		"out-file", "out-dir/secret", "../" + filepath.Base(outside) + "/secret", filepath.Join(outside, "secret"),
		"in-dir/g", "in-file", "dangling", filepath.Join(spill, "out"), "",
	}
	for name, sc := range modes {
		c := &Confiner{Scope: func(*toolsdk.Call) (Scope, error) { return sc, nil }}
		for _, p := range paths {
			t.Run(name+"/"+p, func(t *testing.T) {
				call := &toolsdk.Call{Cwd: root, WorkspaceRoot: root}
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

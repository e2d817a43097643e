package fileopen_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/dsh-dev/dsh/internal/fileopen"
)

// TestNoLinks checks NoLinks against filepath.EvalSymlinks: true only
// where resolving the path's links gives the path itself, false for a
// link in any component (the last, the middle, the root's own) and for a
// missing path, which the caller must resolve the long way.
func TestNoLinks(t *testing.T) {
	t.Parallel()
	root, outside := realDir(t), realDir(t)
	write(t, filepath.Join(root, "d", "f"), "inside")
	must(t, syscall.Mkfifo(filepath.Join(root, "fifo"), 0o600))
	must(t, os.Symlink(outside, filepath.Join(root, "out")))
	must(t, os.Symlink("d", filepath.Join(root, "in")))
	must(t, os.Symlink(filepath.Join(root, "missing"), filepath.Join(root, "dangling")))
	linkedRoot := filepath.Join(outside, "root")
	must(t, os.Symlink(root, linkedRoot)) // a root reached through a link
	for _, tc := range []struct {
		name, path string
		want       bool
	}{
		{"slash", "/", true},
		{"root", root, true},
		{"directory", filepath.Join(root, "d"), true},
		{"file", filepath.Join(root, "d", "f"), true},
		{"fifo, without blocking", filepath.Join(root, "fifo"), true},
		{"last component a link", filepath.Join(root, "out"), false},
		{"middle component a link", filepath.Join(root, "in", "f"), false},
		{"dangling link", filepath.Join(root, "dangling"), false},
		{"root reached through a link", filepath.Join(linkedRoot, "d"), false},
		{"missing", filepath.Join(root, "missing"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := fileopen.NoLinks(tc.path)
			if got != tc.want {
				t.Fatalf("NoLinks(%q) = %v, want %v", tc.path, got, tc.want)
			}
			if got {
				if real, err := filepath.EvalSymlinks(tc.path); err != nil || real != tc.path {
					t.Fatalf("NoLinks(%q) is true but EvalSymlinks gives %q, %v", tc.path, real, err)
				}
			}
		})
	}
}

// TestEvalSymlinks requires fileopen.EvalSymlinks to answer exactly as
// filepath.EvalSymlinks — the same resolution, an error where it errs —
// for paths with and without links in them, missing, relative and unclean.
func TestEvalSymlinks(t *testing.T) {
	t.Parallel()
	root, outside := realDir(t), realDir(t)
	write(t, filepath.Join(root, "d", "f"), "inside")
	write(t, filepath.Join(outside, "g"), "outside")
	must(t, os.Symlink(outside, filepath.Join(root, "out")))
	must(t, os.Symlink("d", filepath.Join(root, "in")))
	must(t, os.Symlink(filepath.Join(root, "missing"), filepath.Join(root, "dangling")))
	linkedRoot := filepath.Join(outside, "root")
	must(t, os.Symlink(root, linkedRoot))
	for _, p := range []string{
		"/", root, filepath.Join(root, "d"), filepath.Join(root, "d", "f"), filepath.Join(root, "out"),
		filepath.Join(root, "out", "g"), filepath.Join(root, "in", "f"), filepath.Join(root, "dangling"),
		filepath.Join(linkedRoot, "d", "f"), filepath.Join(root, "missing"), filepath.Join(root, "d", "f", "x"),
		root + "/d/../d/f", root + "//d/", "relative/path", "",
	} {
		got, gotErr := fileopen.EvalSymlinks(p)
		want, wantErr := filepath.EvalSymlinks(p)
		if got != want || (gotErr == nil) != (wantErr == nil) {
			t.Errorf("EvalSymlinks(%q) = %q, %v; filepath.EvalSymlinks gives %q, %v", p, got, gotErr, want, wantErr)
		}
	}
}

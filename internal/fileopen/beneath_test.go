//go:build unix

package fileopen_test

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/dsh-dev/dsh/internal/fileopen"
)

// TestBeneath tries to leave the root the ways a confined process could
// arrange between a path's check and its open: a directory or the file
// itself replaced by a link to outside, "..", a FIFO with no writer.
func TestBeneath(t *testing.T) {
	t.Parallel()
	root, outside := realDir(t), realDir(t)
	write(t, filepath.Join(outside, "secret"), "CANARY")
	write(t, filepath.Join(outside, "sub", "secret"), "CANARY")
	write(t, filepath.Join(root, "d", "f"), "inside")
	write(t, filepath.Join(root, "inner"), "linked")
	must(t, os.Symlink(outside, filepath.Join(root, "out")))                           // a directory link leaving the root
	must(t, os.Symlink(filepath.Join(outside, "secret"), filepath.Join(root, "leak"))) // a file link leaving it
	must(t, os.Symlink("inner", filepath.Join(root, "in")))                            // a link that stays inside
	must(t, syscall.Mkfifo(filepath.Join(root, "fifo"), 0o600))
	for _, tc := range []struct {
		name, root, path string
		want             string // content, or "" when err
		err              error
	}{
		{"file", root, filepath.Join(root, "d", "f"), "inside", nil},
		{"link inside the root", root, filepath.Join(root, "in"), "linked", nil},
		{"directory link out", root, filepath.Join(root, "out", "secret"), "", fileopen.ErrEscapes},
		{"file link out", root, filepath.Join(root, "leak"), "", fileopen.ErrEscapes},
		{"path outside the root", root, filepath.Join(outside, "secret"), "", fileopen.ErrEscapes},
		{"dot-dot", root, root + "/d/../../" + filepath.Base(outside) + "/secret", "", fileopen.ErrEscapes},
		{"missing", root, filepath.Join(root, "missing"), "", fs.ErrNotExist},
		{"no root is /", "", filepath.Join(outside, "secret"), "CANARY", nil},
		// The root itself (or an ancestor) swapped for a link after it was
		// resolved: the root must not be opened at the link's target.
		{"root now a link out", filepath.Join(root, "out"), filepath.Join(root, "out", "secret"), "", fileopen.ErrEscapes},
		{"root's parent now a link out", filepath.Join(root, "out", "sub"), filepath.Join(root, "out", "sub", "secret"), "", fileopen.ErrEscapes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := fileopen.Beneath(tc.root, tc.path)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("Beneath(%q) = %v, want %v", tc.path, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			b, err := io.ReadAll(f)
			if err != nil || string(b) != tc.want {
				t.Fatalf("read %q, %v; want %q", b, err, tc.want)
			}
		})
	}
	t.Run("fifo without a writer", func(t *testing.T) {
		done := make(chan error, 1)
		go func() {
			f, err := fileopen.Beneath(root, filepath.Join(root, "fifo"))
			if err == nil {
				var fi fs.FileInfo
				if fi, err = f.Stat(); err == nil && fi.Mode()&fs.ModeNamedPipe == 0 {
					err = errors.New("not reported as a FIFO")
				}
				f.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("opening a FIFO with no writer blocked")
		}
	})
}

func realDir(t *testing.T) string {
	t.Helper()
	d, err := filepath.EvalSymlinks(t.TempDir())
	must(t, err)
	return d
}

func write(t *testing.T, p, s string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, os.WriteFile(p, []byte(s), 0o644))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

//go:build unix

package fileopen_test

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/dsh-dev/dsh/internal/fileopen"
)

func TestReadLikeOsOpen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "f.txt")
	body := strings.Repeat("a line\n", 1000)
	if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("x"), 0o000); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		want       error // nil: opens
	}{
		{"regular file", file, nil},
		{"directory", dir, nil},
		{"missing", filepath.Join(dir, "missing"), fs.ErrNotExist},
		{"through a file", filepath.Join(file, "x"), syscall.ENOTDIR},
		{"empty name", "", fs.ErrNotExist},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := fileopen.Read(tc.path)
			g, gerr := os.Open(tc.path)
			if g != nil {
				defer g.Close()
			}
			if tc.want != nil {
				var pe *os.PathError
				if !errors.Is(err, tc.want) || !errors.As(err, &pe) || pe.Op != "open" || pe.Path != tc.path || err.Error() != gerr.Error() {
					t.Fatalf("Read(%q) = %v, want %v as os.Open says: %v", tc.path, err, tc.want, gerr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.Name() != tc.path {
				t.Errorf("name %q", f.Name())
			}
			fi, err := f.Stat()
			gi, _ := g.Stat()
			if err != nil || fi.IsDir() != gi.IsDir() || fi.Size() != gi.Size() {
				t.Errorf("stat %v, %v; os.Open's %v", fi, err, gi)
			}
			if fi.IsDir() {
				return
			}
			b, err := io.ReadAll(f)
			if err != nil || string(b) != body {
				t.Errorf("read %d bytes, %v", len(b), err)
			}
			if _, err := f.Write([]byte("x")); err == nil {
				t.Error("a file opened for reading took a write")
			}
			flags, err := fcntlGetfd(f)
			if err != nil || flags&syscall.FD_CLOEXEC == 0 {
				t.Errorf("descriptor flags %#x, %v: not close-on-exec", flags, err)
			}
		})
	}
	if os.Geteuid() != 0 { // root reads anything
		if _, err := fileopen.Read(secret); !errors.Is(err, fs.ErrPermission) {
			t.Errorf("unreadable file: %v", err)
		}
	}
}

func fcntlGetfd(f *os.File) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var flags int
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		r, _, e := syscall.Syscall(syscall.SYS_FCNTL, fd, syscall.F_GETFD, 0)
		flags = int(r)
		if e != 0 {
			ferr = e
		}
	}); err != nil {
		return 0, err
	}
	return flags, ferr
}

// BenchmarkOpenRead is the open, read and close of a 1.5 KB file (the
// load ladder's notes.txt) with os.Open and with Read.
func BenchmarkOpenRead(b *testing.B) {
	p := filepath.Join(b.TempDir(), "notes.txt")
	if err := os.WriteFile(p, make([]byte, 1560), 0o644); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 4096)
	for _, bc := range []struct {
		name string
		open func(string) (*os.File, error)
	}{{"os.Open", os.Open}, {"fileopen.Read", fileopen.Read}} {
		b.Run("open="+bc.name, func(b *testing.B) {
			for b.Loop() {
				f, err := bc.open(p)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(f, buf[:1560]); err != nil {
					b.Fatal(err)
				}
				f.Close()
			}
		})
	}
}

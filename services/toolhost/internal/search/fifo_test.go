//go:build linux

package search

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/dsh-dev/dsh/internal/fileopen/swaptest"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
	"github.com/dsh-dev/dsh/services/toolhost/internal/fstools"
)

// TestWalkNeverWaitsOnAFIFO: a session's shell can leave FIFOs where the
// walk reads (a .gitignore with a writer that never writes) or swap one in
// for a directory after it was listed; the walk must skip them, not hang.
func TestWalkNeverWaitsOnAFIFO(t *testing.T) {
	t.Parallel()
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(root, "a.txt"), []byte("needle\n"), 0o644))
	must(syscall.Mkfifo(filepath.Join(root, ".gitignore"), 0o600))
	// A writer that never writes: a blocking read would wait forever.
	w, err := os.OpenFile(filepath.Join(root, ".gitignore"), os.O_RDWR, 0)
	must(err)
	defer w.Close()
	must(syscall.Mkfifo(filepath.Join(root, "notadir"), 0o600))

	conf := &fstools.Confiner{Root: root}
	target, err := conf.Resolve(root, root, ".", false)
	must(err)
	tr, err := openTree(target)
	must(err)
	defer tr.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := tr.ReadDir("notadir"); err == nil {
			t.Error("a FIFO listed as a directory")
		}
		if f, _, err := tr.open(filepath.Join(root, "notadir")); err == nil {
			f.Close()
			t.Error("a FIFO opened as a file to scan")
		}
		files, err := walk(context.Background(), tr, target, func(string) bool { return true }, newIgnoreSet(tr.openFile), root)
		if err != nil || len(files) != 1 {
			t.Errorf("walk: %v, %v", files, err)
		}
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the walk waited on a FIFO")
	}
}

// TestWalkRootSwappedOut: a grep or glob root checked as a workspace
// directory and swapped for a link out before the walk opens it is refused
// with the fence's code, as read and write are.
func TestWalkRootSwappedOut(t *testing.T) {
	t.Parallel()
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	conf := &fstools.Confiner{Scope: func(*toolsdk.Call) (fstools.Scope, error) {
		return fstools.Scope{Mode: "workspace-write", Root: root}, nil
	}}
	target, err := conf.ResolveCall(&toolsdk.Call{Cwd: root, WorkspaceRoot: root}, "d", false)
	if err != nil {
		t.Fatal(err)
	}
	swaptest.Swap(t, filepath.Join(root, "d"), filepath.Join(root, "alt"), outside)
	tr, err := openTree(target)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	files, err := walk(context.Background(), tr, target, func(string) bool { return true }, nil, "")
	te, ok := err.(*toolsdk.Error)
	if !ok || te.Code() != fstools.CodeSandboxDenied {
		t.Fatalf("walk of a root swapped out: %v, %v; want %s", files, err, fstools.CodeSandboxDenied)
	}
}

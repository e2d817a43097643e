package spill_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsh-dev/dsh/services/toolhost/internal/spill"
)

func TestWriteTextIsPrivateAndSessionScoped(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "spill")
	d, err := spill.New(root)
	if err != nil {
		t.Fatal(err)
	}
	p1, err := d.WriteText("../../etc/session", "../weird name?.txt", "full output")
	if err != nil {
		t.Fatal(err)
	}
	p2, err := d.WriteText("other", "out.txt", "x")
	if err != nil {
		t.Fatal(err)
	}
	if rel, err := filepath.Rel(root, p1); err != nil || strings.HasPrefix(rel, "..") || strings.Count(rel, string(filepath.Separator)) != 1 || strings.Contains(rel, "..") {
		t.Errorf("spill path %s escapes %s", p1, root)
	}
	if filepath.Dir(p1) == filepath.Dir(p2) {
		t.Errorf("two sessions share %s", filepath.Dir(p1))
	}
	b, err := os.ReadFile(p1)
	if err != nil || string(b) != "full output" {
		t.Errorf("content %q, %v", b, err)
	}
	for p, want := range map[string]os.FileMode{root: 0o700, filepath.Dir(p1): 0o700, p1: 0o600} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s mode %v, want %v", p, fi.Mode().Perm(), want)
		}
	}
	if _, err := spill.New("relative"); err == nil {
		t.Error("New accepted a relative root")
	}
}

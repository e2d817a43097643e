//go:build linux

package workspace

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/dsh-dev/dsh/internal/fileopen/swaptest"
)

// TestSkillRootSwappedOut: a project skill root checked inside the
// workspace and swapped for a link out before it is listed lists nothing
// of the outside directory (an attacker's repository races the check).
func TestSkillRootSwappedOut(t *testing.T) {
	t.Parallel()
	outer, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ws, outside := filepath.Join(outer, "ws"), filepath.Join(outer, "elsewhere")
	for _, d := range []string{filepath.Join(ws, ".git"), filepath.Join(ws, ".agents", "skills", "inner"), filepath.Join(outside, "leak")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r, err := New(Config{Root: ws})
	if err != nil {
		t.Fatal(err)
	}
	root := skillRoot{dir: filepath.Join(ws, ".agents", "skills"), rank: 200, source: SourceProjectAgents, project: true}
	real, ok := r.checkSkillRoot(root)
	if !ok {
		t.Fatalf("the skill root %s was not found inside the workspace", root.dir)
	}
	// Before the swap the listing is the workspace's own.
	ents, err := r.listSkillRoot(root, real)
	if err != nil || len(ents) != 1 || ents[0].Name() != "inner" {
		t.Fatalf("listing before the swap: %v, %v; want [inner]", ents, err)
	}
	swaptest.Swap(t, root.dir, filepath.Join(ws, ".agents", "alt"), outside)
	ents, err = r.listSkillRoot(root, real)
	for _, e := range ents {
		if e.Name() == "leak" {
			t.Fatalf("a skill root swapped for a link out listed the outside directory: %v", ents)
		}
	}
	if err == nil {
		t.Errorf("listing a skill root swapped out: %v, no error", ents)
	}
}

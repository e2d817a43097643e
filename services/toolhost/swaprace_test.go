//go:build linux

package toolhost_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsh-dev/dsh/internal/fileopen/swaptest"
	"github.com/dsh-dev/dsh/services/toolhost/toolhosttest"
)

// TestFileToolsUnderADirectorySwapRace is what a session's own shell can
// do to the file tools: flip a workspace directory with a link to outside
// the workspace as fast as the kernel allows (an atomic exchange of the
// two names), while read, grep, glob and write run on paths through it.
// A check of the path can see the directory and the open the link; no
// tool may ever return the outside file's content or name, or create a
// file outside. Resolution and I/O can each see either state, so calls
// succeed, miss or are refused; only crossing is a failure.
func TestFileToolsUnderADirectorySwapRace(t *testing.T) {
	t.Parallel()
	h := toolhosttest.Start(t)
	ctx := t.Context()
	outside, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const secret = "OUTSIDE-CANARY-7d1c"
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(outside, "f.txt"), []byte(secret+"\n"), 0o644))
	must(os.WriteFile(filepath.Join(outside, "outside-name-canary.txt"), []byte("x\n"), 0o644))
	d, alt := filepath.Join(h.Workspace, "d"), filepath.Join(h.Workspace, "alt")
	must(os.Mkdir(d, 0o755))
	must(os.WriteFile(filepath.Join(d, "f.txt"), []byte("inside\n"), 0o644))

	stopFlips := swaptest.Flip(t, d, alt, outside)
	calls := map[string]string{
		"read": args(map[string]any{"file_path": "d/f.txt"}),
		"grep": args(map[string]any{"pattern": "CANARY|inside"}),
		"glob": args(map[string]any{"pattern": "**/*.txt"}),
	}
	ok, refused, readInside := 0, 0, 0
	for i := range 150 {
		for tool, a := range calls {
			_, r, err := h.Execute(ctx, "s", tool, a)
			if err != nil {
				t.Fatalf("%s: %v", tool, err)
			}
			if out := text(r); strings.Contains(out, secret) || strings.Contains(out, "outside-name-canary") {
				t.Fatalf("%s crossed into %s: %s", tool, outside, out)
			}
			if r.GetIsError() {
				refused++
			} else {
				ok++
				if tool == "read" && strings.Contains(text(r), "inside") {
					readInside++
				}
			}
		}
		// A new file through d: it must land in the workspace or nowhere.
		_, r, err := h.Execute(ctx, "s", "write", args(map[string]any{"file_path": "d/new" + string(rune('a'+i%26)) + ".txt", "content": "w"}))
		if err != nil {
			t.Fatalf("write: %v", err)
		}
		if r.GetIsError() {
			refused++
		}
	}
	stopFlips()
	entries, err := os.ReadDir(outside)
	must(err)
	for _, e := range entries {
		if e.Name() != "f.txt" && e.Name() != "outside-name-canary.txt" {
			t.Fatalf("a write landed outside the workspace: %s", filepath.Join(outside, e.Name()))
		}
	}
	// A fence that refused every call would pass the checks above: the
	// workspace's own file must still be read while the directory flips.
	if readInside == 0 {
		t.Errorf("no read returned the workspace file's content (%d calls answered, %d refused or missed)", ok, refused)
	}
	t.Logf("%d calls answered (%d reads of the inside file), %d refused or missed while the directory flipped", ok, readInside, refused)
}

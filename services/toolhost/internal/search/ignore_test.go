package search

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

func TestGitignore(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.file(".gitignore", "# deps\nnode_modules/\n*.log\n!keep.log\n/build\ndocs/**/gen\n", 0)
	e.file("sub/.gitignore", "secret.txt\n", 0)
	for _, f := range []string{
		"a.txt", "node_modules/x/a.txt", "debug.log", "keep.log", "build/a.txt", "sub/build/a.txt",
		"sub/secret.txt", "secret.txt", "docs/x/gen/a.txt", "docs/x/a.txt",
	} {
		e.file(f, "needle\n", time.Hour)
	}
	res := e.run("grep", GrepArgs{Pattern: "needle"})
	got := toolsdk.ResultText(res.GetContent())
	want := []string{"a.txt", "keep.log", "sub/build/a.txt", "secret.txt", "docs/x/a.txt"}
	if !strings.HasPrefix(got, "Found 5 matches") {
		t.Errorf("grep:\n%s", got)
	}
	for _, w := range want {
		if !strings.Contains(got, filepath.Join(e.root, w)+":") {
			t.Errorf("grep misses %s:\n%s", w, got)
		}
	}
	// A search below the root still honours the root's .gitignore.
	res = e.run("grep", GrepArgs{Pattern: "needle", Path: "sub"})
	if got := toolsdk.ResultText(res.GetContent()); got != "Found 1 matches\n"+filepath.Join(e.root, "sub/build/a.txt")+":\n  Line 1: needle" {
		t.Errorf("grep in sub:\n%s", got)
	}
	// glob lists ignored files, as the original's did.
	res = e.run("glob", GlobArgs{Pattern: "**/*.txt"})
	if n := strings.Count(toolsdk.ResultText(res.GetContent()), "\n") + 1; n != 8 {
		t.Errorf("glob found %d files:\n%s", n, toolsdk.ResultText(res.GetContent()))
	}
	// An explicitly named ignored file is still searched.
	res = e.run("grep", GrepArgs{Pattern: "needle", Path: "debug.log"})
	if !strings.HasPrefix(toolsdk.ResultText(res.GetContent()), "Found 1 matches") {
		t.Errorf("explicit file: %s", toolsdk.ResultText(res.GetContent()))
	}
}

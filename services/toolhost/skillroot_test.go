//go:build linux

package toolhost

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/fileopen/swaptest"
	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

// TestSkillConfinedToTheSessionRoot attacks the skill tool of a session
// whose workspace root is ws/a on a host whose root is ws, past
// vetContext's cwd check (which sees the cwd before the tool uses it):
//
//   - its cwd ws/a/sub is a directory when the call is vetted and a link to
//     ws/b (a sibling session's tree with a .git and a skill) when the
//     skill tool reads it — the deterministic form of a background bash
//     loop swapping sub between a directory and a link;
//   - its cwd is ws/a itself, and the host's root ws holds a .git and an
//     .agents/skills folder (which the sandbox hides from the session's
//     bash): the project root's search must stop at ws/a.
//
// Neither ws/b's skill nor the host root's may be loaded; ws/a's own skill
// is.
func TestSkillConfinedToTheSessionRoot(t *testing.T) {
	t.Parallel()
	const sibling, host = "SIBLING-SKILL-CANARY-3b1f", "HOST-ROOT-SKILL-CANARY-c84e"
	ws := realDir(t)
	a, b := filepath.Join(ws, "a"), filepath.Join(ws, "b")
	put(t, filepath.Join(ws, ".git", "HEAD"), "ref: refs/heads/main\n")
	put(t, filepath.Join(ws, ".agents", "skills", "hostleak.md"), "---\ndescription: Host.\n---\n"+host+"\n")
	put(t, filepath.Join(b, ".git", "HEAD"), "ref: refs/heads/main\n")
	put(t, filepath.Join(b, ".agents", "skills", "leak.md"), "---\ndescription: Leak.\n---\n"+sibling+"\n")
	put(t, filepath.Join(a, ".agents", "skills", "own.md"), "---\ndescription: Own.\n---\nsession a's skill\n")
	put(t, filepath.Join(a, "sub", "keep.txt"), "a directory at vetting time\n")
	s, err := New(Config{WorkspaceRoot: ws}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	skill, ok := s.host.Tool("skill")
	if !ok {
		t.Fatal("no skill tool")
	}
	run := func(t *testing.T, cwd, name string, swap func()) (string, error) {
		t.Helper()
		tcx := &toolsv1.ToolContext{SessionId: "s", Cwd: cwd, WorkspaceRoot: a,
			Sandbox: &toolsv1.SandboxPolicy{Mode: toolsv1.SandboxMode_SANDBOX_MODE_WORKSPACE_WRITE}}
		vetted, err := s.vetContext(tcx)
		if err != nil {
			t.Fatalf("vetContext refused cwd %s: %v", cwd, err)
		}
		if swap != nil {
			swap()
		}
		arg, _ := json.Marshal(map[string]string{"name": name})
		call := toolsdk.NewCall(&toolsv1.ToolExecution{CallId: "c", Name: "skill", Arguments: string(arg), Context: tcx}, nil)
		call.Vetted = vetted
		r, err := skill.Run(t.Context(), call)
		got := toolsdk.ResultText(r.Content)
		if err != nil {
			got += err.Error()
		}
		return got, err
	}
	for _, tc := range []struct {
		name, cwd, skill, canary string
		swap                     func()
	}{
		{name: "host root's .git and skills above the session root", cwd: a, skill: "hostleak", canary: host},
		{name: "cwd swapped for a link to the sibling after vetting", cwd: filepath.Join(a, "sub"), skill: "leak", canary: sibling,
			swap: func() { swaptest.Swap(t, filepath.Join(a, "sub"), filepath.Join(a, "sub-alt"), "../b") }},
	} {
		got, err := run(t, tc.cwd, tc.skill, tc.swap)
		switch {
		case strings.Contains(got, tc.canary):
			t.Errorf("%s: the skill tool loaded a skill outside the session root %s: %s", tc.name, a, got)
		case err == nil:
			t.Errorf("%s: skill %q answered %q, want a refusal", tc.name, tc.skill, got)
		}
	}
	// The session's own skill, in its root, is served (the project root is
	// ws/a, not the host's ws).
	if got, err := run(t, a, "own", nil); err != nil || !strings.Contains(got, "session a's skill") {
		t.Errorf("skill own in the session root: %v %q", err, got)
	}
}

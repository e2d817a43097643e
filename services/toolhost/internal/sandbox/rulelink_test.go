package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsh-dev/dsh/internal/fileopen"
)

// TestRuleDirSwappedForALink attacks the directories a call's rules name
// by the path the host checked: the session root (a write rule in
// workspace-write, a read rule in read-only), an ancestor of it, and the
// session's spill directory. After a first call pooled its ruleset, the
// directory is swapped for a symbolic link — out of the host's workspace,
// into another session's workspace, or to the very directory the pooled
// ruleset was made for (moved aside). The next call must fail closed
// (ErrUnavailable, fileopen.ErrEscapes): neither a new rule added through
// the link nor the pooled ruleset reused for a root that now resolves
// through one.
func TestRuleDirSwappedForALink(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		mode Mode
		// session is the session root under the host root; swapped is the
		// directory (under base) swapped for a link; spill says the call's
		// spill directory is base/spill.
		session, swapped string
		spill            bool
		// target is where the link leads (under base): "out" (outside the
		// host's workspace), "host/b" (another session), or "" for the
		// swapped directory itself, moved aside.
		target string
	}{
		{name: "root to outside, write rule", mode: WorkspaceWrite, session: "a", swapped: "host/a", target: "out"},
		{name: "root to another session, write rule", mode: WorkspaceWrite, session: "a", swapped: "host/a", target: "host/b"},
		{name: "root to itself moved aside, pooled ruleset", mode: WorkspaceWrite, session: "a", swapped: "host/a"},
		{name: "ancestor to outside, write rule", mode: WorkspaceWrite, session: "p/a", swapped: "host/p", target: "out"},
		{name: "root to another session, read rule", mode: ReadOnly, session: "a", swapped: "host/a", target: "host/b"},
		{name: "root to itself moved aside, read-only pooled ruleset", mode: ReadOnly, session: "a", swapped: "host/a"},
		{name: "spill directory to another session", mode: WorkspaceWrite, session: "a", spill: true, swapped: "spill", target: "host/b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, base, _, _ := confinedSandbox(t)
			root := filepath.Join(base, "host", tc.session)
			call := Call{Policy: Policy{Mode: tc.mode}, Root: root, Dir: base}
			if tc.spill {
				call.SpillDir = filepath.Join(base, "spill")
			}
			for _, d := range []string{root, filepath.Join(base, "out", "a")} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			// The first call pools its ruleset; the second reuses it (in
			// one epoch: a file deleted in the shared /tmp drops the pool).
			twiceReusing(t, s, "ok\n", func() (string, string, error) { return runCall(t, s, call, "echo ok") })
			swapped := filepath.Join(base, tc.swapped)
			target := filepath.Join(base, tc.target)
			if tc.target == "" {
				target = swapped + "-aside"
				if err := os.Rename(swapped, target); err != nil {
					t.Fatal(err)
				}
			} else if err := os.RemoveAll(swapped); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, swapped); err != nil {
				t.Fatal(err)
			}
			n := reused(s)
			// What a call that crossed would do: write where the root leads,
			// read the other session's secret through the link.
			out, errb, err := runCall(t, s, call, "echo crossed > "+filepath.Join(root, "w")+"; cat "+filepath.Join(swapped, "secret")+" "+filepath.Join(swapped, "a", "secret")+" 2>/dev/null; echo end")
			if err == nil {
				t.Fatalf("the call ran with its %s swapped for a link to %s: out %q err %q", tc.swapped, target, out, errb)
			}
			if !errors.Is(err, ErrUnavailable) || !errors.Is(err, fileopen.ErrEscapes) {
				t.Errorf("refusal %v: want ErrUnavailable for a link in the path (fileopen.ErrEscapes)", err)
			}
			if !strings.Contains(err.Error(), swapped) {
				t.Errorf("refusal %q does not name the directory %s", err, swapped)
			}
			if reused(s) != n {
				t.Error("a pooled ruleset was reused for a directory that is now a link")
			}
			for _, w := range []string{filepath.Join(target, "w"), filepath.Join(target, "a", "w")} {
				if _, err := os.Lstat(w); err == nil {
					t.Errorf("the call wrote %s through the link", w)
				}
			}
		})
	}
}

// runCall prepares call with command and runs it; err is Command's
// refusal (nothing ran then).
func runCall(t *testing.T, s *Sandbox, call Call, command string) (out, errb string, err error) {
	t.Helper()
	call.Command = command
	r, err := s.Command(call)
	if err != nil {
		return "", "", err
	}
	out, errb, _ = runPrepared(t, r)
	return out, errb, nil
}

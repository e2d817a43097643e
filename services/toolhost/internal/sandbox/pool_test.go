package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// reused is how many calls a pooled ruleset served so far.
func reused(s *Sandbox) int {
	s.pool.mu.Lock()
	defer s.pool.mu.Unlock()
	return s.pool.reused
}

// listingEpoch is the epoch of the host's listing.
func listingEpoch(s *Sandbox) uint64 {
	s.outside.mu.Lock()
	defer s.outside.mu.Unlock()
	return s.outside.epoch
}

// inOneEpoch runs attempt, calls that rely on a ruleset being reused, until
// the listing's epoch did not change after attempt marked it (after the
// call that pooled the ruleset): anyone deleting a file in the shared /tmp
// bumps the epoch, which drops the pool and is not what these tests attack.
// attempt's error is reported for the attempt that counts.
func inOneEpoch(t *testing.T, s *Sandbox, attempt func(mark func()) error) {
	t.Helper()
	for range 5 {
		var from uint64
		err := attempt(func() { from = listingEpoch(s) })
		if err == nil {
			return
		}
		// An error before the mark, or in an unchanged epoch, is the
		// test's own: fail, never retry it into a skip.
		if from == 0 || listingEpoch(s) == from {
			t.Fatal(err)
		}
	}
	t.Skip("the listing's epoch changed during every attempt (files deleted in /tmp meanwhile)")
}

// twiceReusing runs call twice, the second reusing the first's pooled
// ruleset, within one epoch; each run must print want.
func twiceReusing(t *testing.T, s *Sandbox, want string, call func() (out, errb string, err error)) {
	t.Helper()
	inOneEpoch(t, s, func(mark func()) error {
		n := reused(s)
		for i := range 2 {
			if out, errb, err := call(); err != nil || out != want {
				return fmt.Errorf("call %d: %q %q %v, want %q", i, out, errb, err, want)
			}
			if i == 0 {
				mark()
			}
		}
		if reused(s) == n {
			return errors.New("the second call did not reuse the first call's ruleset: this test attacks nothing")
		}
		return nil
	})
}

// readTwiceReusing reads file ("was-outside", outside the hidden roots) in
// two calls of root's session, the second reusing the first's ruleset.
func readTwiceReusing(t *testing.T, s *Sandbox, p Policy, root, file string) {
	t.Helper()
	twiceReusing(t, s, "was-outside", func() (string, string, error) {
		out, errb, _ := runIn(t, s, p, root, "cat "+file)
		return out, errb, nil
	})
}

// TestPooledRulesetHidesWhatMovedAway attacks the ruleset pool: a call's
// ruleset granted a sibling of the host root by its inode; the sibling is
// then moved (or hard-linked and unlinked) into another session's
// workspace. A later call of the same session, which would otherwise reuse
// that ruleset, must not read it there — through either first stage.
func TestPooledRulesetHidesWhatMovedAway(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// make creates the sibling at x and returns the file to read.
		make func(t *testing.T, x string) string
		// move puts it into session b and returns the path to read there.
		move func(t *testing.T, x, b string) string
	}{
		{"renamed directory", func(t *testing.T, x string) string {
			mustWrite(t, filepath.Join(x, "note"))
			return filepath.Join(x, "note")
		}, func(t *testing.T, x, b string) string {
			if err := os.Rename(x, filepath.Join(b, "x")); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(b, "x", "note")
		}},
		{"hard-linked file", func(t *testing.T, x string) string {
			mustWrite(t, x)
			return x
		}, func(t *testing.T, x, b string) string {
			if err := os.Link(x, filepath.Join(b, "x")); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(x); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(b, "x")
		}},
	}
	for stage, exe := range firstStages(t) {
		for _, c := range cases {
			t.Run(stage+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				s, base, a, b := confinedSandboxWith(t, exe)
				x := filepath.Join(base, "x")
				note := c.make(t, x)
				p := Policy{Mode: WorkspaceWrite}
				readTwiceReusing(t, s, p, a, note)
				moved := c.move(t, x, b)
				out, _, _ := runIn(t, s, p, a, "cat "+moved+"; echo end")
				if strings.Contains(out, "was-outside") || out != "end\n" {
					t.Errorf("after the move into another session's workspace: %q", out)
				}
			})
		}
	}
}

func mustWrite(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("was-outside"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPooledRulesetFollowsTheFilesystem: a reused ruleset grants what a
// fresh one would — a directory made beside the host root after it was
// made — and one whose session root was removed and made again is not
// reused (its rule would be on the old root).
func TestPooledRulesetFollowsTheFilesystem(t *testing.T) {
	t.Parallel()
	s, base, a, _ := confinedSandbox(t)
	p := Policy{Mode: WorkspaceWrite}
	attempt := 0
	inOneEpoch(t, s, func(mark func()) error {
		attempt++
		if out, _, _ := runIn(t, s, p, a, "echo one > f; cat f"); out != "one\n" {
			return fmt.Errorf("first call: %q", out)
		}
		mark()
		// A new name per attempt: deleting an earlier attempt's file would
		// itself change the epoch.
		late := filepath.Join(base, fmt.Sprint("late-", attempt), "news")
		mustWrite(t, late)
		n := reused(s)
		if out, errb, _ := runIn(t, s, p, a, "cat "+late); out != "was-outside" {
			return fmt.Errorf("a directory made after the ruleset: out %q err %q", out, errb)
		}
		if reused(s) != n+1 {
			return fmt.Errorf("the call did not reuse the pooled ruleset (%d → %d reuses)", n, reused(s))
		}
		return nil
	})
	if err := os.RemoveAll(a); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(a, 0o755); err != nil {
		t.Fatal(err)
	}
	n := reused(s)
	if out, errb, _ := runIn(t, s, p, a, "echo two > f; cat f"); out != "two\n" {
		t.Errorf("a root made again: out %q err %q", out, errb)
	}
	if reused(s) != n {
		t.Error("a ruleset made for the old root was reused")
	}
}

// TestPooledTemporaryDirectoryIsEmptied: the next call that reuses a
// ruleset gets its temporary directory empty and writable; a call of
// another session cannot see it.
func TestPooledTemporaryDirectoryIsEmptied(t *testing.T) {
	t.Parallel()
	s, _, a, b := confinedSandbox(t)
	p := Policy{Mode: WorkspaceWrite}
	inOneEpoch(t, s, func(mark func()) error {
		out, _, _ := runIn(t, s, p, a, `mkdir -p "$TMPDIR/d/e" && echo left > "$TMPDIR/d/e/f" && chmod 000 "$TMPDIR/d" && echo "$TMPDIR"`)
		mark()
		tmp := strings.TrimSpace(out)
		if !strings.HasPrefix(tmp, s.tmpRoot+"/") {
			return fmt.Errorf("TMPDIR %q is not in the host's temporary area", tmp)
		}
		if out, _, _ := runIn(t, s, p, b, "ls -A "+tmp+"; echo end"); out != "end\n" {
			return fmt.Errorf("another session sees the temporary directory: %q", out)
		}
		n := reused(s)
		out, errb, _ := runIn(t, s, p, a, `echo "$TMPDIR"; ls -A "$TMPDIR"; echo new > "$TMPDIR/g" && cat "$TMPDIR/g"`)
		if reused(s) != n+1 {
			return errors.New("the third call did not reuse the first call's ruleset")
		}
		if out != tmp+"\nnew\n" {
			return fmt.Errorf("the reused temporary directory: out %q err %q", out, errb)
		}
		return nil
	})
}

// TestListingTellsDeletedFromMoved: a directory gone from a listing and
// deleted keeps pooled rulesets (its rule grants nothing); a deleted file
// (its rule keeps its blocks) and one renamed away do not.
func TestListingTellsDeletedFromMoved(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	hidden := filepath.Join(base, "host")
	for _, d := range []string{hidden, filepath.Join(base, "gone"), filepath.Join(base, "moved")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mustWrite(t, filepath.Join(base, "file"))
	// A descriptor for every entry: with keepBudget() a crowded /tmp (a
	// build machine's, during a parallel test run) can use the budget up
	// before the walk reaches this test's entries, and a deleted directory
	// without a kept descriptor counts as moved by design (it cannot be
	// told from one renamed away). That is not what this test checks.
	const everyEntry = 1 << 20
	prev, _, err := newListing([]string{hidden}, nil, everyEntry, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer prev.close()
	for _, p := range []string{"gone", "file"} {
		if err := os.Remove(filepath.Join(base, p)); err != nil {
			t.Fatal(err)
		}
	}
	next, moved, err := newListing([]string{hidden}, prev, everyEntry, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer next.close()
	if slices.Contains(moved, filepath.Join(base, "gone")) {
		t.Error("a deleted directory counted as moved away")
	}
	if !slices.Contains(moved, filepath.Join(base, "file")) {
		t.Error("a deleted file did not count (a rule on it keeps its blocks allocated)")
	}
	if err := os.Rename(filepath.Join(base, "moved"), filepath.Join(hidden, "moved")); err != nil {
		t.Fatal(err)
	}
	last, moved, err := newListing([]string{hidden}, next, everyEntry, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer last.close()
	if !slices.Contains(moved, filepath.Join(base, "moved")) {
		t.Error("a directory renamed into a hidden root did not count as moved away")
	}
}

// TestPoolBounds: a ruleset serves at most maxRulesetUses calls, and at
// most maxPooled rulesets are kept (the least recently used is dropped).
func TestPoolBounds(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	pool := newRulesetPool(t.TempDir())
	defer pool.close()
	l := &listing{gen: 1, epoch: 1} // no outside entries: the bounds are the point
	take := func(write string) *pooledRuleset {
		t.Helper()
		rs, err := pool.take(l, WorkspaceWrite, true, nil, []string{write})
		if err != nil {
			t.Skipf("no Landlock ruleset here: %v", err)
		}
		return rs
	}
	first := take(root)
	dir := first.dir
	pool.put(first)
	for i := 1; i < maxRulesetUses; i++ {
		rs := take(root)
		if rs.dir != dir {
			t.Fatalf("use %d: a new ruleset although the pooled one served %d calls", i+1, i)
		}
		pool.put(rs)
	}
	if rs := take(root); rs.dir == dir {
		t.Fatalf("a ruleset served more than %d calls", maxRulesetUses)
	} else {
		pool.put(rs)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the retired ruleset's directory is still there: %v", err)
	}
	var oldest string
	for i := range maxPooled + 1 {
		w := filepath.Join(root, "s"+strconv.Itoa(i))
		if err := os.Mkdir(w, 0o755); err != nil {
			t.Fatal(err)
		}
		rs := take(w)
		if i == 0 {
			oldest = rs.dir
		}
		pool.put(rs)
	}
	pool.mu.Lock()
	n := len(pool.free)
	pool.mu.Unlock()
	if n != maxPooled {
		t.Errorf("%d rulesets pooled, want at most %d", n, maxPooled)
	}
	if _, err := os.Stat(oldest); !os.IsNotExist(err) {
		t.Errorf("the least recently used ruleset was not dropped: %v", err)
	}
}

// pooledEpochs returns the epochs of the pooled rulesets.
func pooledEpochs(s *Sandbox) []uint64 {
	s.pool.mu.Lock()
	defer s.pool.mu.Unlock()
	var out []uint64
	for _, rs := range s.pool.free {
		out = append(out, rs.epoch)
	}
	return out
}

// TestPoolLetsDeletedFilesGo: a pooled ruleset's rule on a file beside the
// host root keeps the file's inode (and on tmpfs its memory) allocated
// after it is deleted. Once the file is deleted, no ruleset holding a rule
// on it is reused, and none stays pooled — of an idle session neither.
func TestPoolLetsDeletedFilesGo(t *testing.T) {
	t.Parallel()
	s, base, a, b := confinedSandbox(t)
	big := filepath.Join(base, "big")
	mustWrite(t, big)
	p := Policy{Mode: WorkspaceWrite}
	readTwiceReusing(t, s, p, a, big)
	runIn(t, s, p, b, "true") // b's ruleset stays idle from here on
	if err := os.Remove(big); err != nil {
		t.Fatal(err)
	}
	n := reused(s)
	if out, _, _ := runIn(t, s, p, a, "echo ok"); out != "ok\n" {
		t.Fatalf("after the delete: %q", out)
	}
	if reused(s) != n {
		t.Error("a ruleset holding a rule on the deleted file was reused")
	}
	epoch := listingEpoch(s)
	epochs := pooledEpochs(s)
	if len(epochs) == 0 {
		t.Fatal("nothing pooled after the call")
	}
	for _, e := range epochs {
		if e != epoch {
			t.Errorf("pooled rulesets of epochs %v, the listing's is %d: one from before the delete is kept", epochs, epoch)
			break
		}
	}
}

// TestPooledTemporaryDirectoryIsReset: a call that changes its TMPDIR's
// own mode (or sets an extended attribute on it) leaves nothing for the
// next call that reuses the ruleset: that one finds it 0700 and writable,
// or gets a new one.
func TestPooledTemporaryDirectoryIsReset(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, change string
		reuse        bool
	}{
		{"read-only", `chmod 500 "$TMPDIR"`, true},
		{"open to all, sticky", `chmod 1777 "$TMPDIR"`, true},
		{"setgid", `chmod 2700 "$TMPDIR"`, true},
		{"extended attribute", `setfattr -n user.left -v x "$TMPDIR" || python3 -c 'import os; os.setxattr(os.environ["TMPDIR"], "user.left", b"x")'`, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s, _, a, _ := confinedSandbox(t)
			p := Policy{Mode: WorkspaceWrite}
			inOneEpoch(t, s, func(mark func()) error {
				out, errb, code := runIn(t, s, p, a, c.change+` && echo "$TMPDIR"`)
				mark()
				if code != 0 {
					t.Skipf("the call could not change its TMPDIR here: %q %q", out, errb)
				}
				tmp := strings.TrimSpace(out)
				n := reused(s)
				out, errb, _ = runIn(t, s, p, a, `echo "$TMPDIR"; stat -c %a "$TMPDIR"; echo new > "$TMPDIR/g" && cat "$TMPDIR/g"`)
				if got := reused(s) == n+1; got != c.reuse {
					return fmt.Errorf("reused %v, want %v", got, c.reuse)
				}
				next, _, _ := strings.Cut(out, "\n")
				if c.reuse != (next == tmp) {
					return fmt.Errorf("reused %v, yet TMPDIR %q then %q", c.reuse, tmp, next)
				}
				if want := next + "\n700\nnew\n"; out != want {
					return fmt.Errorf("the next call's TMPDIR: out %q (want %q) err %q", out, want, errb)
				}
				return nil
			})
		})
	}
}

// TestRulesetPutBackOnlyWhenTheCallIsGone: Finish pools a call's ruleset
// only once the call's cgroup is removed (every process gone); a cgroup
// that cannot be removed drops it.
func TestRulesetPutBackOnlyWhenTheCallIsGone(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		busy   bool
		pooled int
	}{{"cgroup removed", false, 1}, {"cgroup still busy", true, 0}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pool := newRulesetPool(t.TempDir())
			defer pool.close()
			rs, err := pool.take(&listing{gen: 1, epoch: 1}, WorkspaceWrite, true, nil, []string{t.TempDir()})
			if err != nil {
				t.Skipf("no Landlock ruleset here: %v", err)
			}
			// A directory stands in for the cgroup: one with an entry
			// cannot be removed, as a cgroup with a process cannot.
			cg := filepath.Join(t.TempDir(), "call-1")
			if err := os.Mkdir(cg, 0o755); err != nil {
				t.Fatal(err)
			}
			if c.busy {
				mustWrite(t, filepath.Join(cg, "cgroup.procs"))
			}
			r := &Run{ok: true, result: "exit 0", pooled: rs, pool: pool, cgroup: cg}
			r.Finish()
			pool.mu.Lock()
			n := len(pool.free)
			pool.mu.Unlock()
			if n != c.pooled {
				t.Errorf("%d rulesets pooled, want %d", n, c.pooled)
			}
			if _, err := os.Stat(rs.dir); c.pooled == 0 && !os.IsNotExist(err) {
				t.Errorf("the dropped ruleset's directory is left: %v", err)
			}
		})
	}
}

// TestPoolAfterCloseAndNewerRulesets: a ruleset put back after the pool
// was closed is dropped (not leaked), and a take with an older listing
// than a pooled ruleset's leaves that ruleset for the calls after it.
func TestPoolAfterCloseAndNewerRulesets(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	pool := newRulesetPool(t.TempDir())
	take := func(l *listing) *pooledRuleset {
		t.Helper()
		rs, err := pool.take(l, WorkspaceWrite, true, nil, []string{root})
		if err != nil {
			t.Skipf("no Landlock ruleset here: %v", err)
		}
		return rs
	}
	older, newer := &listing{gen: 1, epoch: 1}, &listing{gen: 2, epoch: 1}
	first := take(newer)
	pool.put(first)
	second := take(older)
	if second == first {
		t.Fatal("a ruleset newer than the caller's listing was taken")
	}
	pool.mu.Lock()
	left := slices.Contains(pool.free, first)
	pool.mu.Unlock()
	if !left || first.fd < 0 {
		t.Error("the newer ruleset was not left in the pool")
	}
	pool.put(second)
	late := take(newer)
	pool.close()
	pool.put(late)
	pool.mu.Lock()
	n := len(pool.free)
	pool.mu.Unlock()
	if n != 0 || late.fd != -1 {
		t.Errorf("a ruleset put back after close was pooled (%d pooled, fd %d)", n, late.fd)
	}
	for _, rs := range []*pooledRuleset{first, second, late} {
		if _, err := os.Stat(rs.dir); !os.IsNotExist(err) {
			t.Errorf("%s left after close: %v", rs.dir, err)
		}
	}
}

// emptyDirAsNobody is the child of
// TestPooledTemporaryDirectoryIsEmptiedAsNonRoot: it empties dir as uid
// 65534 and exits 0 when emptyDir says it is empty.
func emptyDirAsNobody(dir string) {
	if syscall.Setgid(65534) != nil || syscall.Setuid(65534) != nil {
		os.Exit(2)
	}
	if !emptyDir(dir) {
		os.Exit(1)
	}
	os.Exit(0)
}

// TestPooledTemporaryDirectoryIsEmptiedAsNonRoot: a non-root host (the k8s
// fallback) empties a ruleset's directory in which a call made a directory
// unreadable and unwritable (chmod 000) — root removes it whatever its
// mode, a non-root owner only after giving itself the rights back —
// instead of dropping the ruleset and leaving the directory behind.
func TestPooledTemporaryDirectoryIsEmptiedAsNonRoot(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root to become nobody")
	}
	area, err := os.MkdirTemp("", "dsh-emptydir-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(area) })
	if err := os.Chmod(area, 0o755); err != nil { // nobody may reach tmp
		t.Fatal(err)
	}
	tmp := filepath.Join(area, "call-1")
	f := filepath.Join(tmp, "d", "e", "f")
	mustWrite(t, f)
	for _, p := range []string{tmp, filepath.Dir(filepath.Dir(f)), filepath.Dir(f), f} {
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	for p, mode := range map[string]os.FileMode{tmp: 0o700, filepath.Join(tmp, "d"): 0} {
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("/proc/self/exe", "-test.run", "^$")
	cmd.Env = append(os.Environ(), "DSH_TEST_EMPTYDIR_AS_NOBODY="+tmp)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("emptyDir as nobody: %v %s", err, out)
	}
	if ents, err := os.ReadDir(tmp); err != nil || len(ents) != 0 {
		t.Errorf("left in the directory: %v %v", ents, err)
	}
}

package sandbox

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/dsh-dev/dsh/internal/proctest"
	"github.com/dsh-dev/dsh/services/toolhost/internal/sandbox/launcher"
	"golang.org/x/sys/unix"
)

// runIn runs command confined and returns its stdout, stderr and exit code.
func runIn(t *testing.T, s *Sandbox, p Policy, root, command string) (string, string, int) {
	t.Helper()
	r, err := s.Command(Call{Policy: p, Root: root, Dir: root, Command: command})
	if err != nil {
		t.Fatal(err)
	}
	return runPrepared(t, r)
}

// runPrepared starts a prepared call, waits for it and finishes it, and
// returns its stdout, stderr and exit code.
func runPrepared(t *testing.T, r *Run) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	r.Cmd.Stdout, r.Cmd.Stderr = &out, &errb
	if err := r.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := r.Started(); err != nil {
		t.Fatal(err)
	}
	_ = r.Cmd.Wait()
	r.Finish()
	return out.String(), errb.String(), r.Cmd.ProcessState.ExitCode()
}

// useRuleset makes the prepared call r enforce the ruleset fd instead of
// its own (closed).
func useRuleset(r *Run, fd int) {
	r.ruleset.Close()
	r.ruleset = os.NewFile(uintptr(fd), "landlock-ruleset")
	r.Cmd.ExtraFiles[len(r.Cmd.ExtraFiles)-1] = r.ruleset
}

// confinedSandbox is a Sandbox whose host root is base/host (so base is a
// directory the read layer lists) with sessions a and b, b holding a secret.
// Its launcher is this test binary re-executed (the Go launcher).
func confinedSandbox(t *testing.T) (s *Sandbox, base, a, b string) {
	t.Helper()
	return confinedSandboxWith(t, "")
}

// firstStages are the launchers a confinement test runs through: the Go
// launcher (this binary re-executed) and the small launcher binary with its
// C first stage, as deployed (when this machine has a C compiler).
func firstStages(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{"go": "/proc/self/exe"}
	if proctest.CgoUsable() {
		cLauncher.once.Do(func() { cLauncher.path, cLauncher.err = buildLauncherIn(cLauncher.dir, true) })
		if cLauncher.err != nil {
			t.Fatal(cLauncher.err)
		}
		out["c"] = cLauncher.path
	}
	return out
}

// cLauncher is the C first stage, built once per test binary (TestMain
// removes it).
var cLauncher struct {
	once      sync.Once
	dir, path string
	err       error
}

func TestMain(m *testing.M) {
	if dir := os.Getenv("DSH_TEST_EMPTYDIR_AS_NOBODY"); dir != "" {
		emptyDirAsNobody(dir) // TestPooledTemporaryDirectoryIsEmptiedAsNonRoot
	}
	dir, err := os.MkdirTemp("", "dsh-sandbox-test-")
	if err != nil {
		panic(err)
	}
	// Executable by nobody too (TestShellCannotForgeTheReport).
	if err := os.Chmod(dir, 0o755); err != nil {
		panic(err)
	}
	cLauncher.dir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// confinedSandboxWith is confinedSandbox with launcher exe ("" for the
// default).
func confinedSandboxWith(t *testing.T, exe string) (s *Sandbox, base, a, b string) {
	t.Helper()
	base = t.TempDir()
	host := filepath.Join(base, "host")
	a, b = filepath.Join(host, "a"), filepath.Join(host, "b")
	for _, d := range []string{a, b} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(b, "secret"), []byte("b-secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{HostRoot: host, Exe: exe})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Support().Unavailable; err != nil {
		t.Skipf("no sandbox here: %v", err)
	}
	return s, base, a, b
}

// TestKeptListingStillHides: from the second call on the host's listing of
// the filesystem is reused, and the rules made from it hide another
// session's workspace and the host's other calls' directories exactly as a
// fresh listing did.
func TestKeptListingStillHides(t *testing.T) {
	t.Parallel()
	for stage, exe := range firstStages(t) {
		t.Run(stage, func(t *testing.T) {
			t.Parallel()
			s, _, a, b := confinedSandboxWith(t, exe)
			for _, mode := range []Mode{WorkspaceWrite, ReadOnly} {
				for i := range 3 {
					out, _, _ := runIn(t, s, Policy{Mode: mode}, a, "cat "+filepath.Join(b, "secret")+"; ls ../b; ls "+s.tmpRoot+"; echo end")
					if strings.Contains(out, "b-secret") || strings.Contains(out, "secret\n") || strings.Contains(out, "call-") || !strings.HasSuffix(out, "end\n") {
						t.Errorf("%s call %d read what it must not: %q", mode, i, out)
					}
				}
			}
		})
	}
}

// TestListingFollowsTheFilesystem: a directory created beside the host
// root after the listing was kept is readable by the next call (the listed
// directory changed, so it is listed again), and a session root that was
// removed and made again is still the session's.
func TestListingFollowsTheFilesystem(t *testing.T) {
	t.Parallel()
	s, base, a, _ := confinedSandbox(t)
	p := Policy{Mode: WorkspaceWrite}
	if out, _, _ := runIn(t, s, p, a, "echo one > f; cat f"); out != "one\n" {
		t.Fatalf("first call: %q", out)
	}
	late := filepath.Join(base, "late")
	if err := os.MkdirAll(late, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(late, "news"), []byte("fresh"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, errb, _ := runIn(t, s, p, a, "cat "+filepath.Join(late, "news")); out != "fresh" {
		t.Errorf("a directory made after the layer was cached: out %q err %q", out, errb)
	}
	if err := os.RemoveAll(a); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(a, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, errb, _ := runIn(t, s, p, a, "echo two > f; cat f"); out != "two\n" {
		t.Errorf("a root made again: out %q err %q", out, errb)
	}
}

// TestNoRulesetReachesTheShell: the ruleset is handed to the launcher as a
// descriptor; none may be open in the shell or the launcher (the call's
// own /proc is readable, which this also checks).
func TestNoRulesetReachesTheShell(t *testing.T) {
	t.Parallel()
	for stage, exe := range firstStages(t) {
		t.Run(stage, func(t *testing.T) {
			t.Parallel()
			s, _, a, _ := confinedSandboxWith(t, exe)
			for _, mode := range []Mode{WorkspaceWrite, ReadOnly} {
				out, errb, _ := runIn(t, s, Policy{Mode: mode}, a, "ls /proc/self/fd >/dev/null && echo proc-ok; for f in /proc/self/fd/* /proc/$PPID/fd/*; do readlink $f; done; echo end")
				if strings.Contains(out, "landlock") || !strings.HasPrefix(out, "proc-ok\n") || !strings.Contains(out, "pipe:") || !strings.HasSuffix(out, "end\n") {
					t.Errorf("%s: descriptors of the call: %q (stderr %q)", mode, out, errb)
				}
			}
		})
	}
}

// TestEveryLauncherThreadIsConfined: the shell may ptrace a thread of its
// parent that shares its Landlock domain, and the launcher's threads share
// one memory, so a launcher thread without the domain (or without
// no_new_privs) would run whatever the shell wrote into that memory with
// the host's access. Every thread of the shell's parent must carry both.
func TestEveryLauncherThreadIsConfined(t *testing.T) {
	t.Parallel()
	for stage, exe := range firstStages(t) {
		t.Run(stage, func(t *testing.T) {
			t.Parallel()
			s, _, a, _ := confinedSandboxWith(t, exe)
			for _, mode := range []Mode{WorkspaceWrite, ReadOnly} {
				out, errb, _ := runIn(t, s, Policy{Mode: mode}, a, `n=0; for f in /proc/$PPID/task/*/status; do grep -h '^NoNewPrivs:' $f; n=$((n+1)); done; echo "threads $n"`)
				lines := strings.Split(strings.TrimSpace(out), "\n")
				if len(lines) < 2 || !strings.HasPrefix(lines[len(lines)-1], "threads ") || lines[len(lines)-1] == "threads 0" {
					t.Fatalf("%s: no launcher threads listed: %q (stderr %q)", mode, out, errb)
				}
				for _, l := range lines[:len(lines)-1] {
					if strings.Join(strings.Fields(l), " ") != "NoNewPrivs: 1" {
						t.Errorf("%s: a launcher thread without no_new_privs (so without the Landlock domain): %q", mode, out)
						break
					}
				}
			}
		})
	}
}

// TestListingKeepsABoundedNumberOfDescriptors: anyone can fill /tmp (where
// the hidden roots live) with entries; a listing keeps at most its budget
// of descriptors open, and the listing itself still names every entry (the
// rest are opened per call), including when a re-listing takes kept
// descriptors over from the previous one.
func TestListingKeepsABoundedNumberOfDescriptors(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	hidden := filepath.Join(base, "hidden")
	if err := os.Mkdir(hidden, 0o700); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		if err := os.WriteFile(filepath.Join(base, "flood-"+strconv.Itoa(i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	count := func(l *listing) (kept, flood int) {
		for _, e := range l.entries {
			if e.fd >= 0 {
				kept++
			}
			if strings.HasPrefix(filepath.Base(e.path), "flood-") {
				flood++
			}
		}
		return kept, flood
	}
	const budget = 5
	prev, _, err := newListing([]string{hidden}, nil, budget, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer prev.close()
	if kept, flood := count(prev); kept > budget || kept == 0 || flood != 40 {
		t.Fatalf("first listing: %d descriptors kept (budget %d), %d of 40 entries listed", kept, budget, flood)
	}
	prev.retired = true
	next, _, err := newListing([]string{hidden}, prev, budget, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer next.close()
	if kept, flood := count(next); kept > budget || flood != 40 {
		t.Fatalf("re-listing: %d descriptors kept (budget %d), %d of 40 entries listed", kept, budget, flood)
	}
	if b := keepBudget(); b < 1 || b > maxKept {
		t.Errorf("keepBudget() = %d, want 1..%d", b, maxKept)
	}
}

// TestMovedSiblingStaysHidden: a directory beside the host root is granted
// (read) by the kept listing; moved into another session's workspace (and
// its name taken by a new directory), it must be as hidden there as
// anything else of that session: the listing is made again, and the
// descriptor kept for the old entry is not reused for the new one.
func TestMovedSiblingStaysHidden(t *testing.T) {
	t.Parallel()
	s, base, a, b := confinedSandbox(t)
	x := filepath.Join(base, "x")
	if err := os.MkdirAll(x, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(x, "note"), []byte("was-outside"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := Policy{Mode: WorkspaceWrite}
	if out, _, _ := runIn(t, s, p, a, "cat "+filepath.Join(x, "note")); out != "was-outside" {
		t.Fatalf("a directory outside the hidden roots is not readable: %q", out)
	}
	moved := filepath.Join(b, "x")
	if err := os.Rename(x, moved); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(x, 0o755); err != nil {
		t.Fatal(err)
	}
	out, _, _ := runIn(t, s, p, a, "cat "+filepath.Join(moved, "note")+"; ls "+x+" && echo new-x-ok")
	if strings.Contains(out, "was-outside") || !strings.Contains(out, "new-x-ok") {
		t.Errorf("after the move: %q", out)
	}
}

// TestShellCannotForgeTheReport: the launcher's report pipe (descriptor 3)
// is its own; a shell that reaches for it through /proc to claim an end of
// its choosing, or reads the launcher's memory, must fail, and the call's
// result is the shell's real end. Run as root, the test also makes the
// calls a non-root host makes (the launcher as nobody, no namespaces): the
// shell then has the launcher's uid and Landlock domain, and only the
// launcher being non-dumpable stands in its way; its subreaper still finds
// and kills what the shell left behind.
func TestShellCannotForgeTheReport(t *testing.T) {
	t.Parallel()
	for stage, exe := range firstStages(t) {
		for _, nobody := range []bool{false, true} {
			if nobody && os.Geteuid() != 0 {
				continue // already not root
			}
			t.Run(stage+map[bool]string{true: "-nobody"}[nobody], func(t *testing.T) {
				t.Parallel()
				s, _, a, _ := confinedSandboxWith(t, exe)
				marker := "dsh-forge-leftover-" + strconv.Itoa(os.Getpid()) + "-" + stage + strconv.FormatBool(nobody)
				for _, mode := range []Mode{WorkspaceWrite, ReadOnly} {
					r, err := s.Command(Call{Policy: Policy{Mode: mode}, Root: a, Dir: a,
						Command: `for p in /proc/$PPID/fd/3 /proc/1/fd/3; do echo "exit 0" > $p && echo forged; done; ` +
							`head -c1 /proc/$PPID/environ >/dev/null && echo peeked; ` +
							`(setsid bash -c 'exec -a ` + marker + ` sleep 300' </dev/null >/dev/null 2>&1 &); exit 7`})
					if err != nil {
						t.Fatal(err)
					}
					if nobody {
						asNobody(t, r)
					}
					stdout, stderr, _ := runPrepared(t, r)
					out := stdout + stderr
					if code, _, ok := r.Result(); !ok || code != 7 || strings.Contains(out, "forged") || strings.Contains(out, "peeked") {
						t.Errorf("%s: result %d (ok %v), output %q", mode, code, ok, out)
					}
					if pids := proctest.Living(marker); len(pids) > 0 {
						t.Errorf("%s: the launcher left %v running", mode, pids)
					}
				}
			})
		}
	}
}

// asNobody turns a prepared call into the one a non-root host makes: the
// launcher as uid and gid 65534, without namespaces, cgroup or capabilities
// to drop, started in / (the test's directories are root's own).
func asNobody(t *testing.T, r *Run) {
	t.Helper()
	c, err := launcher.ParseArgs(r.Cmd.Args[2:])
	if err != nil {
		t.Fatal(err)
	}
	c.PIDNS, c.DropCaps, c.Cgroup, c.Dir = false, false, "", "/"
	r.Cmd.Args, r.Cmd.Dir = c.Args(), "/"
	r.Cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
}

// TestRuleOpenedPerCallIsTheListedFile attacks an entry without a kept
// descriptor (a mount root, or one past the descriptor budget), opened by
// path when the rule is added: between the listing and the rule, the
// listed file beside the host root is replaced by a hard link to another
// session's secret. The rule must not go to the secret (it would grant it
// inside the hidden root too, by its inode).
func TestRuleOpenedPerCallIsTheListedFile(t *testing.T) {
	t.Parallel()
	s, base, a, b := confinedSandbox(t)
	x, y := filepath.Join(base, "x"), filepath.Join(base, "y")
	mustWrite(t, x)
	mustWrite(t, y)                              // left as listed: still granted
	l, _, err := newListing(s.hidden, nil, 0, 1) // no descriptor kept
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	if err := os.Remove(x); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(b, "secret")
	if err := os.Link(secret, x); err != nil {
		t.Fatal(err)
	}
	dir, _, err := openRuleDir(a)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	fd, err := callRuleset(l, nil, []*os.File{dir}, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(x); err != nil { // the link was there only while the rule was added
		t.Fatal(err)
	}
	r, err := s.Command(Call{Policy: Policy{Mode: WorkspaceWrite}, Root: a, Dir: a, Command: "cat " + secret + " " + y + "; echo end"})
	if err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	// The call enforces the ruleset made from the stale listing.
	useRuleset(r, fd)
	if out, _, _ := runPrepared(t, r); out != "was-outsideend\n" {
		t.Errorf("want only the unchanged entry read (and no secret through a rule on a replaced one): %q", out)
	}
}

// TestRuleOpenedPerCallThroughASwappedAncestor: a listed entry opened per
// call (no descriptor kept) must be the entry at its path with no link in
// it. Here an ancestor is swapped for a link into the hidden host root after
// the listing, where the entry's name is a mount root (another device, so
// the listed-file check alone takes it for a mount still in place): a rule
// opened through the link would grant that whole mount.
func TestRuleOpenedPerCallThroughASwappedAncestor(t *testing.T) {
	t.Parallel()
	s, base, a, _ := confinedSandbox(t)
	host := filepath.Dir(a)
	if err := os.Mkdir(filepath.Join(base, "m"), 0o755); err != nil { // listed, plain
		t.Fatal(err)
	}
	mnt := filepath.Join(host, "m") // hidden, a file system of its own
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=64k"); err != nil {
		t.Skipf("mounting a tmpfs needs root: %v", err)
	}
	aside := base + "-aside"
	// The swap below moves the mount point; everything is put back and
	// unmounted where it is then.
	t.Cleanup(func() {
		if _, err := os.Lstat(aside); err == nil {
			_ = os.Remove(base)
			_ = os.Rename(aside, base)
		}
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	if err := os.WriteFile(filepath.Join(mnt, "secret"), []byte("mounted-secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, _, err := newListing(s.hidden, nil, 0, 1) // no descriptor kept
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	dir, _, err := openRuleDir(a)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	secret := filepath.Join(aside, "host", "m", "secret")
	r, err := s.Command(Call{Policy: Policy{Mode: WorkspaceWrite}, Root: a, Dir: "/", Command: "cat " + secret + "; echo end"})
	if err != nil {
		t.Fatal(err)
	}
	// base/m now leads to host/m, the mount.
	if err := os.Rename(base, aside); err != nil {
		r.ruleset.Close()
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(aside, "host"), base); err != nil {
		r.ruleset.Close()
		t.Fatal(err)
	}
	fd, err := callRuleset(l, nil, []*os.File{dir}, true)
	if err != nil {
		r.ruleset.Close()
		t.Fatal(err)
	}
	useRuleset(r, fd)
	if out, _, _ := runPrepared(t, r); out != "end\n" {
		t.Errorf("a rule opened through the swapped ancestor granted the hidden root's mount: %q", out)
	}
}

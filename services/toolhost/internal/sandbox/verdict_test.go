package sandbox

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// newSandbox starts a sandbox and closes it with the test.
func newSandbox(t *testing.T, cfg Config) *Sandbox {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// probedWorks probes with cfg (no verdict there yet) and skips the test on
// a machine where the best backend does not work (nothing is cached there).
func probedWorks(t *testing.T, cfg Config) *Sandbox {
	t.Helper()
	s := newSandbox(t, cfg)
	sp := s.Support()
	if sp.Cached {
		t.Fatal("the first start took a cached verdict")
	}
	if sp.Unavailable != nil || !sp.Namespaces || !sp.NetNamespace {
		t.Skipf("the best sandbox backend does not work here (%+v): no verdict is cached", sp)
	}
	return s
}

func readVerdict(t *testing.T, dir string) verdict {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, VerdictFile))
	if err != nil {
		t.Fatal(err)
	}
	var v verdict
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func writeVerdict(t *testing.T, dir string, v verdict) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, VerdictFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestVerdictIsCachedPerBoot: a probe that found the best backend leaves a
// private verdict file, and the next start with the same kernel, binaries
// and settings takes it without probing, and its calls run confined.
func TestVerdictIsCachedPerBoot(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(t.TempDir(), "run")
	cfg := Config{HostRoot: root, Exe: "/proc/self/exe", VerdictDir: dir}
	probedWorks(t, cfg)
	fi, err := os.Stat(filepath.Join(dir, VerdictFile))
	if err != nil {
		t.Fatalf("no verdict cached: %v", err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("verdict file mode %v, want 0600", fi.Mode().Perm())
	}
	if di, _ := os.Stat(dir); di.Mode().Perm() != 0o700 {
		t.Errorf("verdict dir mode %v, want 0700", di.Mode().Perm())
	}
	s := newSandbox(t, cfg)
	sp := s.Support()
	if !sp.Cached || sp.Unavailable != nil || !sp.Namespaces || !sp.NetNamespace {
		t.Fatalf("second start: support %+v, want the cached best verdict", sp)
	}
	runTrue(t, s, Policy{Mode: WorkspaceWrite}, root)
	if _, err := os.Stat(filepath.Join(dir, VerdictFile)); err != nil {
		t.Errorf("a successful call dropped the verdict: %v", err)
	}
}

// TestVerdictFromElsewhereIsIgnored: a verdict from another boot, kernel,
// launcher or binary build, uid, Landlock ABI or limits, one that is not
// the best verdict, and a file anyone else could have written (wrong mode,
// owner, a symlink, a shared directory) are ignored: the start probes, and
// the fresh verdict replaces the file where the directory is private.
func TestVerdictFromElsewhereIsIgnored(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// tamper changes the cached verdict (v) or its file in dir.
		tamper func(t *testing.T, dir string, v verdict)
		// restored: the probe's verdict replaces the file.
		restored bool
	}{
		{"another boot", func(t *testing.T, dir string, v verdict) {
			v.Key.BootID = "00000000-0000-0000-0000-000000000000"
			writeVerdict(t, dir, v)
		}, true},
		{"another kernel", func(t *testing.T, dir string, v verdict) { v.Key.Kernel += "-old"; writeVerdict(t, dir, v) }, true},
		{"another launcher", func(t *testing.T, dir string, v verdict) { v.Key.Launcher.Ino++; writeVerdict(t, dir, v) }, true},
		{"another dsh build", func(t *testing.T, dir string, v verdict) { v.Key.Self.Mtime--; writeVerdict(t, dir, v) }, true},
		{"another uid", func(t *testing.T, dir string, v verdict) { v.Key.EUID++; writeVerdict(t, dir, v) }, true},
		{"another landlock abi", func(t *testing.T, dir string, v verdict) { v.Key.LandlockABI++; writeVerdict(t, dir, v) }, true},
		{"other limits", func(t *testing.T, dir string, v verdict) { v.Key.Limits.Processes++; writeVerdict(t, dir, v) }, true},
		{"another probe version", func(t *testing.T, dir string, v verdict) { v.Key.Version++; writeVerdict(t, dir, v) }, true},
		{"not the best verdict", func(t *testing.T, dir string, v verdict) { v.NetNamespace = false; writeVerdict(t, dir, v) }, true},
		{"unknown fields", func(t *testing.T, dir string, v verdict) {
			b, _ := json.Marshal(v)
			b = append(b[:len(b)-1], []byte(`,"Unconfined":true}`)...)
			if err := os.WriteFile(filepath.Join(dir, VerdictFile), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"garbage", func(t *testing.T, dir string, v verdict) {
			if err := os.WriteFile(filepath.Join(dir, VerdictFile), []byte("ok\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"readable by others", func(t *testing.T, dir string, v verdict) {
			if err := os.Chmod(filepath.Join(dir, VerdictFile), 0o644); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"owned by someone else", func(t *testing.T, dir string, v verdict) {
			if os.Geteuid() != 0 {
				t.Skip("chown needs root")
			}
			if err := os.Chown(filepath.Join(dir, VerdictFile), 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"a symlink", func(t *testing.T, dir string, v verdict) {
			p := filepath.Join(dir, VerdictFile)
			elsewhere := filepath.Join(t.TempDir(), "verdict")
			if err := os.Rename(p, elsewhere); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(elsewhere, p); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"a directory that is a symlink (to a private one)", func(t *testing.T, dir string, v verdict) {
			if err := os.Rename(dir, dir+".real"); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(dir+".real", dir); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"a directory others may write", func(t *testing.T, dir string, v verdict) {
			if err := os.Chmod(dir, 0o777); err != nil {
				t.Fatal(err)
			}
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			dir := filepath.Join(t.TempDir(), "run")
			cfg := Config{HostRoot: root, Exe: "/proc/self/exe", VerdictDir: dir}
			probedWorks(t, cfg)
			good := readVerdict(t, dir)
			tc.tamper(t, dir, good)
			s := newSandbox(t, cfg)
			if sp := s.Support(); sp.Cached {
				t.Fatalf("took a verdict from %s: %+v", tc.name, sp)
			}
			fi, err := os.Lstat(filepath.Join(dir, VerdictFile))
			if !tc.restored {
				return
			}
			if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
				t.Fatalf("the fresh verdict did not replace the file: %v %v", fi, err)
			}
			if got := readVerdict(t, dir); got != good {
				t.Errorf("stored verdict %+v, want %+v", got, good)
			}
		})
	}
}

// TestNewLauncherBuildProbes: replacing (here: touching) the launcher
// binary makes the next start probe.
func TestNewLauncherBuildProbes(t *testing.T) {
	t.Parallel()
	cfg := probedCopy(t)
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(cfg.Exe, later, later); err != nil {
		t.Fatal(err)
	}
	if sp := newSandbox(t, cfg).Support(); sp.Cached {
		t.Fatalf("a new launcher build took the old verdict: %+v", sp)
	}
}

// probedCopy probes with a copy of this test binary as the launcher (a
// file the test may touch or remove) and a fresh verdict directory.
func probedCopy(t *testing.T) Config {
	t.Helper()
	exe := filepath.Join(t.TempDir(), "launcher")
	copyFile(t, "/proc/self/exe", exe, 0o755)
	cfg := Config{HostRoot: t.TempDir(), Exe: exe, VerdictDir: filepath.Join(t.TempDir(), "run")}
	probedWorks(t, cfg)
	return cfg
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_EXCL, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCachedVerdictStillFailsClosed: a cached "works" (here forged for a
// launcher whose set-up always fails) is believed at start, but a confined
// call is still refused with ErrUnavailable (every call's launcher reports
// its own set-up), never run unconfined; the failure drops the verdict, so
// the next start probes and reports the sandbox unavailable.
func TestCachedVerdictStillFailsClosed(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	bad := filepath.Join(t.TempDir(), "launcher")
	if err := os.WriteFile(bad, []byte("#!/bin/sh\necho 'error: landlock: forged failure' >&3\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "run")
	cfg := Config{HostRoot: root, Exe: bad, VerdictDir: dir}
	probe := newSandbox(t, cfg)
	if probe.Support().Unavailable == nil {
		t.Fatal("a failing launcher probed as working")
	}
	if _, err := os.Stat(filepath.Join(dir, VerdictFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a failed probe was cached: %v", err)
	}
	key, err := probe.currentKey()
	if err != nil {
		t.Fatal(err)
	}
	probe.Close() // its failed runs are reaped (and drop any verdict) by then
	if key.LandlockABI < 1 {
		t.Skip("no Landlock: a cached verdict is never taken")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	writeVerdict(t, dir, verdict{Key: key, Namespaces: true, NetNamespace: true})

	s := newSandbox(t, cfg)
	if sp := s.Support(); !sp.Cached || sp.Unavailable != nil {
		t.Fatalf("the forged verdict was not taken (the test proves nothing): %+v", sp)
	}
	for _, m := range []Mode{ReadOnly, WorkspaceWrite} {
		r, err := s.Command(Call{Policy: Policy{Mode: m}, Root: root, Dir: root, Command: "echo ran > " + filepath.Join(root, "ran")})
		if err != nil {
			t.Fatalf("%s: Command: %v", m, err) // the set-up report is what refuses
		}
		if err := r.Cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if err := r.Started(); !errors.Is(err, ErrUnavailable) {
			t.Errorf("%s: Started = %v, want ErrUnavailable", m, err)
		}
		_ = r.Cmd.Wait()
		r.Finish()
	}
	if _, err := os.Stat(filepath.Join(root, "ran")); err == nil {
		t.Error("the command ran")
	}
	if _, err := os.Stat(filepath.Join(dir, VerdictFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed set-up kept the cached verdict: %v", err)
	}
	if sp := newSandbox(t, cfg).Support(); sp.Cached || sp.Unavailable == nil {
		t.Errorf("after the failure the next start: %+v, want a probe that finds the sandbox unavailable", sp)
	}
}

// TestCachedVerdictDroppedWhenStartFails: a cached verdict whose call
// cannot even start (here the launcher binary vanished after the start) is
// dropped as well.
func TestCachedVerdictDroppedWhenStartFails(t *testing.T) {
	t.Parallel()
	cfg := probedCopy(t)
	s := newSandbox(t, cfg)
	if !s.Support().Cached {
		t.Fatal("no cached verdict")
	}
	if err := os.Remove(cfg.Exe); err != nil {
		t.Fatal(err)
	}
	r, err := s.Command(Call{Policy: Policy{Mode: WorkspaceWrite}, Root: cfg.HostRoot, Dir: cfg.HostRoot, Command: "true"})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Cmd.Start(); err == nil {
		t.Fatal("a vanished launcher started")
	}
	r.Finish()
	if _, err := os.Stat(filepath.Join(cfg.VerdictDir, VerdictFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed start kept the cached verdict: %v", err)
	}
}

func TestVerdictDir(t *testing.T) {
	t.Parallel()
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	tests := []struct {
		env      map[string]string
		fallback string
		want     string
	}{
		{map[string]string{"XDG_RUNTIME_DIR": "/run/user/1000"}, "/data", "/run/user/1000/dsh"},
		{map[string]string{"XDG_RUNTIME_DIR": "relative"}, "/data", "/data"},
		{nil, "/data", "/data"},
		{nil, "", ""},
	}
	for _, tc := range tests {
		if got := VerdictDir(env(tc.env), tc.fallback); got != tc.want {
			t.Errorf("VerdictDir(%v, %q) = %q, want %q", tc.env, tc.fallback, got, tc.want)
		}
	}
}

package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/dsh-dev/dsh/internal/proctest"
	"github.com/dsh-dev/dsh/services/toolhost/internal/sandbox/launcher"
)

// runTrue runs `bash -c true` confined and waits for it.
func runTrue(tb testing.TB, s *Sandbox, p Policy, root string) {
	r, err := s.Command(Call{Policy: p, Root: root, Dir: root, Command: "true"})
	if err != nil {
		tb.Fatal(err)
	}
	if err := r.Cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	if err := r.Started(); err != nil {
		tb.Fatal(err)
	}
	if err := r.Cmd.Wait(); err != nil {
		tb.Fatal(err)
	}
	r.Finish()
}

// BenchmarkSpawn measures the added cost of confinement per bash call: the
// same `bash -c true` spawned directly (its own process group, as the
// unconfined executor does) and through the launcher in each mode, in the
// same run. ms-median is the median wall time of one call; cpu-ms/op the
// CPU time the call's processes used (user+system, from the reaped
// children's rusage), which a loaded machine distorts less than wall time;
// host-cpu-ms/op the CPU the benchmark process itself spent per call
// (preparing the call: cgroup, temporary directory, Landlock rulesets;
// starting and reaping it), so moving work out of the launcher into the
// host shows up.
//
// The confined cases run the launcher the way a deployed toolhost does:
// the small, static dsh-sandbox-launcher binary built with cgo (as make
// build and the Dockerfile build it), whose C first stage serves the call
// before a Go runtime starts; "workspace-write-go" runs the same binary
// built without cgo (the Go launcher after a Go runtime start), and
// "workspace-write-self-exec" re-executes this (large, cgo) test binary,
// the fallback when no launcher lies next to the host's binary, so one run
// shows all three.
func BenchmarkSpawn(b *testing.B) {
	root := b.TempDir()
	s, err := New(Config{HostRoot: root, Exe: buildLauncher(b, true)})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	goL, err := New(Config{HostRoot: root, Exe: buildLauncher(b, false)})
	if err != nil {
		b.Fatal(err)
	}
	defer goL.Close()
	self, err := New(Config{HostRoot: root, Exe: "/proc/self/exe"})
	if err != nil {
		b.Fatal(err)
	}
	defer self.Close()
	cases := []struct {
		name string
		run  func()
	}{
		{"unconfined", func() {
			cmd := exec.Command("bash", "-c", "true")
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := cmd.Run(); err != nil {
				b.Fatal(err)
			}
		}},
		{"workspace-write", func() { runTrue(b, s, Policy{Mode: WorkspaceWrite, Network: true}, root) }},
		{"workspace-write-go", func() { runTrue(b, goL, Policy{Mode: WorkspaceWrite, Network: true}, root) }},
		{"workspace-write-self-exec", func() { runTrue(b, self, Policy{Mode: WorkspaceWrite, Network: true}, root) }},
		{"read-only", func() { runTrue(b, s, Policy{Mode: ReadOnly, Network: true}, root) }},
		{"network-off", func() { runTrue(b, s, Policy{Mode: WorkspaceWrite}, root) }},
		{"danger-full-access", func() { runTrue(b, s, Policy{Mode: DangerFullAccess, Network: true}, root) }},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var d []time.Duration
			cpu0, host0 := cpuTime(syscall.RUSAGE_CHILDREN), cpuTime(syscall.RUSAGE_SELF)
			for b.Loop() {
				t0 := time.Now()
				c.run()
				d = append(d, time.Since(t0))
			}
			slices.Sort(d)
			n := float64(len(d))
			b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, "ms-median")
			b.ReportMetric(float64((cpuTime(syscall.RUSAGE_CHILDREN)-cpu0).Microseconds())/1000/n, "cpu-ms/op")
			b.ReportMetric(float64((cpuTime(syscall.RUSAGE_SELF)-host0).Microseconds())/1000/n, "host-cpu-ms/op")
		})
	}
}

// cpuTime is the CPU time (user+system) of this process (RUSAGE_SELF:
// preparing, starting and reaping calls, whatever thread did it) or of
// every child reaped so far (RUSAGE_CHILDREN: the calls' own processes).
func cpuTime(who int) time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(who, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// buildLauncher builds the small launcher binary, static either way: with
// cgo (its C first stage, as deployed) or without (the Go launcher).
func buildLauncher(tb testing.TB, cgo bool) string {
	tb.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		tb.Skip("go toolchain not on PATH")
	}
	bin, err := buildLauncherIn(tb.TempDir(), cgo)
	if err != nil {
		tb.Fatal(err)
	}
	return bin
}

// buildLauncherIn builds the launcher into dir.
func buildLauncherIn(dir string, cgo bool) (string, error) {
	bin := filepath.Join(dir, launcher.Arg0)
	return bin, proctest.BuildLauncher(bin, cgo)
}

// BenchmarkCallRuleset measures the host's share of a confined call's
// Landlock work: "rules" builds one call's ruleset from a kept listing (a
// landlock_add_rule per sibling of the way down to the hidden roots),
// "pooled" takes a pooled ruleset for a call and puts it back (what a call
// costs when the previous call with the same additions left one, pool.go),
// "listing" lists and opens those siblings from scratch (a host's first
// call), "relisting" lists them again taking the previous listing's
// descriptors over (what a change in a listed directory costs once).
// entries is the number of siblings here.
func BenchmarkCallRuleset(b *testing.B) {
	root := b.TempDir()
	hidden := []string{root}
	l, _, err := newListing(hidden, nil, keepBudget(), 1)
	if err != nil {
		b.Fatal(err)
	}
	defer l.close()
	b.Run("rules", func(b *testing.B) {
		dir, _, err := openRuleDir(root)
		if err != nil {
			b.Fatal(err)
		}
		defer dir.Close()
		for b.Loop() {
			fd, err := callRuleset(l, nil, []*os.File{dir}, true)
			if err != nil {
				b.Fatal(err)
			}
			syscall.Close(fd)
		}
		b.ReportMetric(float64(len(l.entries)), "entries")
	})
	b.Run("pooled", func(b *testing.B) {
		pool := newRulesetPool(b.TempDir())
		defer pool.close()
		for b.Loop() {
			rs, err := pool.take(l, WorkspaceWrite, true, nil, []string{root})
			if err != nil {
				b.Fatal(err)
			}
			pool.put(rs)
		}
	})
	b.Run("listing", func(b *testing.B) {
		for b.Loop() {
			l, _, err := newListing(hidden, nil, keepBudget(), 1)
			if err != nil {
				b.Fatal(err)
			}
			l.close()
		}
	})
	b.Run("relisting", func(b *testing.B) {
		prev, _, err := newListing(hidden, nil, keepBudget(), 1)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			prev.retired = true
			l, _, err := newListing(hidden, prev, keepBudget(), prev.gen+1)
			if err != nil {
				b.Fatal(err)
			}
			prev.close()
			prev = l
		}
		prev.close()
	})
}

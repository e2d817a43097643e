package sandbox

import (
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"
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
// children's rusage), which a loaded machine distorts less than wall time.
func BenchmarkSpawn(b *testing.B) {
	root := b.TempDir()
	s, err := New(Config{HostRoot: root})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
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
		{"read-only", func() { runTrue(b, s, Policy{Mode: ReadOnly, Network: true}, root) }},
		{"network-off", func() { runTrue(b, s, Policy{Mode: WorkspaceWrite}, root) }},
		{"danger-full-access", func() { runTrue(b, s, Policy{Mode: DangerFullAccess, Network: true}, root) }},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var d []time.Duration
			cpu0 := childCPU()
			for b.Loop() {
				t0 := time.Now()
				c.run()
				d = append(d, time.Since(t0))
			}
			slices.Sort(d)
			b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, "ms-median")
			b.ReportMetric(float64((childCPU()-cpu0).Microseconds())/1000/float64(len(d)), "cpu-ms/op")
		})
	}
}

// childCPU is the CPU time of every reaped child so far.
func childCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

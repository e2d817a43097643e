//go:build unix

package llmstream

import (
	"syscall"
	"time"
)

// cpuTime returns the CPU time (user + system, all threads, GC included)
// the process has used. Benchmarks report it next to wall time because on a
// shared machine wall time mostly measures the other tenants.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Package cputime reads the CPU time the process has used, for benchmarks:
// they report it next to wall time because on a shared machine wall time
// also measures the wait for a core, while CPU time measures the work.
package cputime

import "time"

// Process returns the user + system CPU time of the whole process (all
// threads, GC included), or 0 where the platform cannot tell.
func Process() time.Duration { return process() }

package cputime

import (
	"runtime"
	"testing"
	"time"
)

func TestProcessAdvancesWithWork(t *testing.T) {
	if runtime.GOOS == "windows" || runtime.GOOS == "plan9" {
		t.Skip("no rusage on this platform")
	}
	start := Process()
	deadline := time.Now().Add(200 * time.Millisecond)
	x := 0
	for Process()-start < 10*time.Millisecond && time.Now().Before(deadline.Add(2*time.Second)) {
		for i := range 1_000_000 {
			x += i
		}
	}
	if got := Process() - start; got < 10*time.Millisecond {
		t.Fatalf("CPU time advanced %v after busy work (x=%d), want ≥ 10ms", got, x)
	}
}

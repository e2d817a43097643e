package stackgrow

import (
	"runtime"
	"sync"
	"testing"
)

// TestTo16KiB: goroutines that call To16KiB and wait hold 16 KiB of stack
// each (runtime.MemStats.StackInuse, which other goroutines' stacks freed
// meanwhile can lower a little: hence 12 KiB), where goroutines that do not
// hold what the runtime starts them with (2 KiB, or the collector's average).
func TestTo16KiB(t *testing.T) {
	const n = 256
	for _, tt := range []struct {
		name    string
		grow    bool
		atLeast uint64 // per goroutine
		below   uint64
	}{
		{"grown", true, 12 << 10, 1 << 30},
		{"not grown", false, 0, 8 << 10},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var before, during runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			var ready, release sync.WaitGroup
			release.Add(1)
			ready.Add(n)
			for range n {
				go func() {
					if tt.grow {
						To16KiB()
					}
					ready.Done()
					release.Wait()
				}()
			}
			ready.Wait()
			runtime.ReadMemStats(&during)
			release.Done()
			per := (during.StackInuse - min(before.StackInuse, during.StackInuse)) / n
			t.Logf("%d bytes of stack per goroutine", per)
			if per < tt.atLeast || per >= tt.below {
				t.Fatalf("%d bytes of stack per goroutine, want [%d, %d)", per, tt.atLeast, tt.below)
			}
		})
	}
}

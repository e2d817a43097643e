package main

import (
	"runtime/debug"
	"runtime/metrics"
	"testing"
)

// gcPercent reads the collector's setting without changing it.
func gcPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// TestStartHeapGoal: `dsh dev` runs its start with the collector at
// startGCPercent and puts the previous setting back once (a second call
// changes nothing); a GOGC the user set is left alone.
func TestStartHeapGoal(t *testing.T) {
	// Not parallel: the collector's setting is the process's.
	const before = 150
	prev := debug.SetGCPercent(before)
	t.Cleanup(func() { debug.SetGCPercent(prev) })
	for _, tc := range []struct {
		name   string
		gogc   string
		during int
	}{
		{"unset", "", startGCPercent},
		{"GOGC set", "50", before},
	} {
		t.Run(tc.name, func(t *testing.T) {
			restore := startHeapGoal(func(k string) string {
				if k == "GOGC" {
					return tc.gogc
				}
				return ""
			})
			if got := debug.SetGCPercent(tc.during); got != tc.during {
				t.Errorf("during the start: GC percent %d, want %d", got, tc.during)
			}
			restore()
			if got := debug.SetGCPercent(before); got != before {
				t.Errorf("after restore: GC percent %d, want %d", got, before)
			}
			if tc.gogc != "" {
				return // nothing was changed: restore is a no-op
			}
			debug.SetGCPercent(12345)
			restore() // once only: a later setting stays
			if got := debug.SetGCPercent(before); got != 12345 {
				t.Errorf("a second restore changed the setting to %d", got)
			}
		})
	}
}

package toolhost_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsh-dev/dsh/internal/cputime"
	"github.com/dsh-dev/dsh/services/toolhost/toolhosttest"
)

// BenchmarkReadRoundTrip is one read of a 100-line file over loopback gRPC.
func BenchmarkReadRoundTrip(b *testing.B) {
	h := toolhosttest.Start(b)
	os.WriteFile(filepath.Join(h.Workspace, "f.txt"), []byte(strings.Repeat("some line of text\n", 100)), 0o644)
	args := `{"file_path":"f.txt"}`
	b.ReportAllocs()
	start, n := cputime.Process(), 0
	for b.Loop() {
		if _, r, err := h.Execute(b.Context(), "s", "read", args); err != nil || r.GetIsError() {
			b.Fatal(err, r)
		}
		n++
	}
	// Client and server are this process: CPU per call holds up on a busy
	// machine where wall time does not.
	b.ReportMetric(float64((cputime.Process()-start).Nanoseconds())/float64(n), "cpu-ns/op")
}

// BenchmarkBashTrueRoundTrip is one `true` through the bash tool: process
// group spawn, pipes, wait, result.
func BenchmarkBashTrueRoundTrip(b *testing.B) {
	h := toolhosttest.Start(b)
	args := `{"command":"true","description":"nothing"}`
	b.ReportAllocs()
	for b.Loop() {
		if _, r, err := h.Execute(b.Context(), "s", "bash", args); err != nil || r.GetIsError() {
			b.Fatal(err, r)
		}
	}
}

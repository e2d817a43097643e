package toolpipe_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/cputime"
	"github.com/dsh-dev/dsh/services/agent/internal/prompt"
	"github.com/dsh-dev/dsh/services/agent/internal/toolpipe"
	"github.com/dsh-dev/dsh/services/toolhost/toolhosttest"
)

// BenchmarkReadCall is the agent↔toolhost part of one `read` step against
// the real built-in toolhost over loopback gRPC (client and server in this
// process, so cpu-ns/op is the CPU of both sides): the batch's
// PrepareCalls (a batch of one call: a PrepareExecute stream opened,
// prepared and, here, released unsent), the call's pipeline alone (Begin,
// Dispatch's Execute stream, Finish), both on one execution (the step: one
// PrepareExecute stream), and a turn's workspace context read.
func BenchmarkReadCall(b *testing.B) {
	h := toolhosttest.Start(b)
	if err := os.WriteFile(filepath.Join(h.Workspace, "notes.txt"), []byte(strings.Repeat("a line of notes for the load benchmark\n", 40)), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.Workspace, "AGENTS.md"), []byte("# Project\nUse tabs.\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	p := toolpipe.New(toolpipe.Config{Hosts: []toolpipe.Host{{Name: "builtin", Client: h.Client}}})
	if err := p.Start(b.Context()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Close)
	ws := &prompt.Workspaces{Hosts: []prompt.Host{{Name: "builtin", Client: h.Client}}}
	ex := func() []*toolsv1.ToolExecution {
		return []*toolsv1.ToolExecution{{CallId: "call_1", Name: "read", Arguments: `{"file_path":"notes.txt"}`,
			Context: &toolsv1.ToolContext{SessionId: "s", Cwd: h.Workspace, Turn: 1, Step: 1}}}
	}
	prepare := func(b *testing.B, execs []*toolsv1.ToolExecution) {
		pcs := p.PrepareCalls(b.Context(), nil, execs)
		if len(pcs) != 1 || pcs[0].GetView() == nil {
			b.Fatalf("prepared %v", pcs)
		}
	}
	execute := func(b *testing.B, ex *toolsv1.ToolExecution) {
		c := p.Begin(b.Context(), nil, ex)
		c.Dispatch(b.Context(), nil)
		if r := c.Finish(b.Context()); r.GetIsError() {
			b.Fatal(r)
		}
	}
	for _, bc := range []struct {
		name string
		op   func(b *testing.B)
	}{
		{"prepare", func(b *testing.B) { execs := ex(); prepare(b, execs); p.Release(execs) }},
		{"execute", func(b *testing.B) { execute(b, ex()[0]) }},
		{"step", func(b *testing.B) { execs := ex(); prepare(b, execs); execute(b, execs[0]); p.Release(execs) }},
		{"workspace", func(b *testing.B) {
			wc, err := ws.Context(b.Context(), h.Workspace, "", nil)
			if err != nil || len(wc.GetInstructions()) == 0 {
				b.Fatal(err, wc)
			}
		}},
	} {
		b.Run("op="+bc.name, func(b *testing.B) {
			b.ReportAllocs()
			start, n := cputime.Process(), 0
			for b.Loop() {
				bc.op(b)
				n++
			}
			b.ReportMetric(float64((cputime.Process()-start).Nanoseconds())/float64(n), "cpu-ns/op")
		})
	}
	// Many sessions starting turns in one cwd at once (the load ladder's
	// first seconds): 64 callers at a time; ns and cpu-ns per turn start.
	b.Run("op=workspace-burst", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(32) // 64 goroutines on this 2-core machine
		start := cputime.Process()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := ws.Context(b.Context(), h.Workspace, "", nil); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64((cputime.Process()-start).Nanoseconds())/float64(b.N), "cpu-ns/op")
	})
}

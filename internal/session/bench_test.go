package session

import (
	"fmt"
	"github.com/dsh-dev/dsh/internal/cputime"
	"runtime"
	"testing"
	"time"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// benchSeed returns a valid log of about n events shaped like real
// sessions: turns of a user message and steps of a header, text chunks, an
// assistant message with one tool call, the call and its result.
func benchSeed(n int) []*sessionv1.SessionEvent {
	b := &logBuilder{}
	for len(b.evs) < n {
		b.turnStart()
		b.user("please do the thing")
		for range 3 {
			b.stepStart()
			b.header("system prompt")
			for range 8 {
				b.chunk("some text ")
			}
			b.assistant(Text("doing it"), ToolCallBlock(fmt.Sprintf("c%d", len(b.evs)), "read", `{"path":"a.go"}`))
			id := fmt.Sprintf("c%d", len(b.evs)-1)
			c := b.call(id)
			b.result(id, c, "package main")
			b.stepEnd()
		}
		b.turnEnd()
	}
	return b.evs
}

// benchCycle is the repeating tail appended by the benchmark: the events of
// a step after its start (chunks, assistant message, call, result) plus an
// injected context; 4 of 8 are surface events.
func benchCycle() []*sessionv1.SessionEvent {
	chunk := &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_AssistantChunk{AssistantChunk: &sessionv1.AssistantChunk{
		Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Text: "delta "}}}}}}
	return []*sessionv1.SessionEvent{
		chunk, chunk, chunk,
		assistantEvent(1, 1, Text("answer"), ToolCallBlock("cx", "read", `{"path":"b.go"}`)),
		{Payload: &sessionv1.SessionEvent_ToolCall{ToolCall: &sessionv1.ToolCall{CallId: "cx", Name: "read", Arguments: `{"path":"b.go"}`}}},
		ToolResultEvent(1, 1, "cx", []*llmv1.ContentBlock{Text("package b")}, false, nil, -1),
		ContextMessageEvent([]*llmv1.ContentBlock{Text("<system-reminder>b.go changed</system-reminder>")}, PluginSource("fs")),
		UserMessageEvent([]*llmv1.ContentBlock{Text("next")}, UserSource()),
	}
}

// BenchmarkAppendDerive measures one Append plus one Messages() on a log of
// n to 2n events: the log is rebuilt from its n-event seed (timer stopped,
// garbage collected) whenever it doubled, so slice growth amortises as in a
// real session. O(1) amortised derivation means the
// ns/op at 100k events stays within 2x of the ns/op at 1k.
func BenchmarkAppendDerive(b *testing.B) {
	cycle := benchCycle()
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			seed := benchSeed(n)
			grow := n
			fresh := func() *Log {
				l, err := NewLog(nil, seed)
				if err != nil {
					b.Fatal(err)
				}
				return l
			}
			l := fresh()
			appended := 0
			sink := 0
			work, base := 0, l.surf.work
			runtime.GC() // the setup's garbage is not the benchmark's
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cputime.Process()
			for i := 0; i < b.N; i++ {
				if appended == grow {
					b.StopTimer()
					pause := cputime.Process()
					work += l.surf.work - base
					l, appended = nil, 0
					runtime.GC() // collect the old log now, not during timed appends
					l = fresh()
					base = l.surf.work
					runtime.GC()
					cpu += cputime.Process() - pause
					b.StartTimer()
				}
				if _, err := l.Append(cycle[i%len(cycle)]); err != nil {
					b.Fatal(err)
				}
				appended++
				sink += len(l.Messages())
			}
			if sink == 0 {
				b.Fatal("no messages")
			}
			cpu = cputime.Process() - cpu
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
			work += l.surf.work - base
			// Nodes projected per append: constant (the surface share of the
			// appended events), whatever the log size.
			b.ReportMetric(float64(work)/float64(b.N), "projections/op")
		})
	}
}

// BenchmarkDeriveMessages derives the history from scratch, for contrast:
// this is the O(n) cost the Log's cache avoids.
func BenchmarkDeriveMessages(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			seed := benchSeed(n)
			b.ReportAllocs()
			for b.Loop() {
				if len(DeriveMessages(seed)) == 0 {
					b.Fatal("no messages")
				}
			}
		})
	}
}

// benchLog is a log of n to 2n events for the interleaved benchmark.
type benchLog struct {
	b        *testing.B
	seed     []*sessionv1.SessionEvent
	l        *Log
	appended int
	elapsed  time.Duration
}

func newBenchLog(b *testing.B, n int) *benchLog {
	bl := &benchLog{b: b, seed: benchSeed(n)}
	bl.reset()
	return bl
}

func (bl *benchLog) reset() {
	bl.l = nil
	runtime.GC()
	l, err := NewLog(nil, bl.seed)
	if err != nil {
		bl.b.Fatal(err)
	}
	bl.l, bl.appended = l, 0
	runtime.GC()
}

// step appends ev and derives, timing only that.
func (bl *benchLog) step(ev *sessionv1.SessionEvent) {
	if bl.appended == len(bl.seed) {
		bl.b.StopTimer()
		bl.reset()
		bl.b.StartTimer()
	}
	start := time.Now()
	if _, err := bl.l.Append(ev); err != nil {
		bl.b.Fatal(err)
	}
	if len(bl.l.Messages()) == 0 {
		bl.b.Fatal("no messages")
	}
	bl.elapsed += time.Since(start)
	bl.appended++
}

// BenchmarkAppendDeriveInterleaved alternates single append+derive
// operations on a 1k-event and a 100k-event log, so that both sizes are
// measured under the same machine load (on a shared, busy machine separate
// sub-benchmarks drift by more than the effect being measured). It reports
// the mean cost at each size and their ratio; ns/op counts both operations.
func BenchmarkAppendDeriveInterleaved(b *testing.B) {
	cycle := benchCycle()
	small, large := newBenchLog(b, 1_000), newBenchLog(b, 100_000)
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ev := cycle[i%len(cycle)]
		if i%2 == 0 {
			small.step(ev)
			large.step(ev)
		} else {
			large.step(ev)
			small.step(ev)
		}
	}
	b.ReportMetric(float64(small.elapsed.Nanoseconds())/float64(b.N), "ns/op@1k")
	b.ReportMetric(float64(large.elapsed.Nanoseconds())/float64(b.N), "ns/op@100k")
	b.ReportMetric(float64(large.elapsed)/float64(small.elapsed), "ratio")
}

// BenchmarkAppendChunk measures the hot path alone: appending one text-delta
// assistant/chunk (most events of a real log) plus Messages().
func BenchmarkAppendChunk(b *testing.B) {
	seed := benchSeed(1_000)
	chunk := benchCycle()[0]
	var l *Log
	fresh := func() {
		l = nil
		runtime.GC()
		var err error
		if l, err = NewLog(nil, seed); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
	}
	fresh()
	appended := 0
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cputime.Process()
	for i := 0; i < b.N; i++ {
		if appended == len(seed) {
			b.StopTimer()
			pause := cputime.Process()
			fresh()
			appended = 0
			cpu += cputime.Process() - pause
			b.StartTimer()
		}
		if _, err := l.Append(chunk); err != nil {
			b.Fatal(err)
		}
		appended++
		if len(l.Messages()) == 0 {
			b.Fatal("no messages")
		}
	}
	b.ReportMetric(float64((cputime.Process()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// BenchmarkNewLogSeed10k measures seeding a Log with a 10,000-event log (the
// resume of a large session), checked (clone + full Checker + derivation)
// and trusted (WithTrustedSeed: derivation only, for a seed a Store has
// already checked), plus CheckLog alone for scale.
func BenchmarkNewLogSeed10k(b *testing.B) {
	seed := benchSeed(10_000)
	b.Run("checked", func(b *testing.B) {
		b.ReportAllocs()
		cpu := cputime.Process()
		for b.Loop() {
			if _, err := NewLog(nil, seed); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64((cputime.Process()-cpu).Microseconds())/1000/float64(b.N), "cpu-ms/op")
	})
	b.Run("trusted", func(b *testing.B) {
		b.ReportAllocs()
		cpu := cputime.Process()
		for b.Loop() {
			if _, err := NewLog(nil, seed, WithTrustedSeed()); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64((cputime.Process()-cpu).Microseconds())/1000/float64(b.N), "cpu-ms/op")
	})
	b.Run("CheckLog", func(b *testing.B) {
		b.ReportAllocs()
		cpu := cputime.Process()
		for b.Loop() {
			if err := CheckLog(seed); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64((cputime.Process()-cpu).Microseconds())/1000/float64(b.N), "cpu-ms/op")
	})
}

package session

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/cputime"
)

// fromScratch is the meter's reading recomputed from the whole log: the
// header estimate plus every derived message's estimate.
func fromScratch(events []*sessionv1.SessionEvent) int64 {
	n := EstimateHeader(FoldRequestHeader(events))
	for _, m := range DeriveMessages(events) {
		n += EstimateMessage(m)
	}
	return n
}

func withUsage(ev *sessionv1.SessionEvent, in, out int64) *sessionv1.SessionEvent {
	ev.GetAssistantMessage().Usage = &llmv1.TokenUsage{InputTokens: in, OutputTokens: out}
	return ev
}

func TestMeterIncrementalEqualsFromScratch(t *testing.T) {
	b := &logBuilder{}
	b.turnStart()
	u := b.user(strings.Repeat("u", 401))
	b.stepStart()
	b.header("you are a test")
	a := b.assistant(Text("let me look"), ToolCallBlock("c1", "read", `{"path":"a.go"}`))
	c := b.call("c1")
	r := b.result("c1", c, strings.Repeat("x", 10_000))
	b.context("<system-reminder>a.go changed</system-reminder>")
	b.stepEnd()
	// pruning replaces the big result; compaction replaces a range
	b.add(&sessionv1.SessionEvent{SurfaceOp: ReplaceOp(r, r), SourceEventSeqs: Seqs(r),
		Payload: &sessionv1.SessionEvent_ToolResult{ToolResult: &sessionv1.ToolResult{Turn: 1, Step: 1, CallId: "c1",
			Content: []*llmv1.ContentBlock{Text("head … tail")}}}})
	b.replace(UserMessageEvent([]*llmv1.ContentBlock{Text("<compacted-summary>s</compacted-summary>")}, PluginSource("compact")), u, a, u, a)
	b.turnEnd()
	l, err := NewLog(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range b.evs {
		if _, err := l.Append(ev); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		m := l.Measure()
		if want := fromScratch(b.evs[:i+1]); m.TotalTokens != want || m.Baseline != BaselineEstimated {
			t.Fatalf("after event %d (%s): total %d (%s), from scratch %d", i, TypeName(ev), m.TotalTokens, m.Baseline, want)
		}
		if m.LogRevision != int64(i+1) {
			t.Fatalf("log revision %d after %d events", m.LogRevision, i+1)
		}
	}
	m := l.MeasureNodes()
	nodes, gen := l.Surface()
	if len(m.Nodes) != len(nodes) || m.SurfaceNodes != len(nodes) || m.ReplaceGeneration != gen || gen != 2 {
		t.Fatalf("nodes %v vs surface %v (gen %d)", m.Nodes, nodes, gen)
	}
	var sum int64
	for i, n := range m.Nodes {
		if n.Seq != nodes[i] || n.Tokens != estimateEvent(b.evs[n.Seq]) {
			t.Fatalf("node %d: %+v", i, n)
		}
		sum += n.Tokens
	}
	if sum != m.SurfaceTokens {
		t.Fatalf("nodes sum %d, surface tokens %d", sum, m.SurfaceTokens)
	}
}

func TestMeterUsageBaseline(t *testing.T) {
	big := strings.Repeat("w", 4000) // ~1000 tokens
	tests := []struct {
		name      string
		usageIn   int64
		after     func(b *logBuilder)
		baseline  string
		wantDelta bool
	}{
		{name: "usage at least the estimate is the baseline", usageIn: 5000, baseline: BaselineUsage},
		{name: "usage below the heuristic anchor is not trusted", usageIn: 10, baseline: BaselineEstimated},
		{name: "appends after the call add their estimate", usageIn: 5000, baseline: BaselineUsage, wantDelta: true,
			after: func(b *logBuilder) { b.context(big) }},
		{name: "a replace since the call drops the baseline", usageIn: 5000, baseline: BaselineEstimated,
			after: func(b *logBuilder) {
				b.replace(ContextMessageEvent([]*llmv1.ContentBlock{Text("s")}, PluginSource("compact")), 1, 1, 1)
			}},
		{name: "a new header since the call drops the baseline", usageIn: 5000, baseline: BaselineEstimated,
			after: func(b *logBuilder) {
				b.add(headerEvent("another system prompt", sessionv1.HeaderReason_HEADER_REASON_CHANGE))
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := &logBuilder{}
			b.turnStart()
			b.user(big)
			b.stepStart()
			b.header("sys")
			b.add(withUsage(assistantEvent(b.turn, b.step, Text("done")), tc.usageIn, 7))
			if tc.after != nil {
				tc.after(b)
			}
			l, err := NewLog(nil, b.evs)
			if err != nil {
				t.Fatal(err)
			}
			m := l.Measure()
			if m.Baseline != tc.baseline {
				t.Fatalf("baseline %s, want %s (%+v)", m.Baseline, tc.baseline, m)
			}
			switch {
			case tc.baseline == BaselineEstimated && m.TotalTokens != fromScratch(b.evs):
				t.Fatalf("estimated total %d, from scratch %d", m.TotalTokens, fromScratch(b.evs))
			case tc.baseline == BaselineUsage:
				want := tc.usageIn + 7
				if tc.wantDelta {
					want += estimateEvent(b.evs[len(b.evs)-1])
				}
				if m.TotalTokens != want || m.BaselineTokens != tc.usageIn+7 {
					t.Fatalf("total %d (baseline %d), want %d", m.TotalTokens, m.BaselineTokens, want)
				}
			}
		})
	}
}

func TestEstimateMessageShapes(t *testing.T) {
	txt := EstimateMessage(&llmv1.Message{Content: []*llmv1.ContentBlock{Text(strings.Repeat("a", 400))}})
	if txt != messageOverhead+blockOverhead+100 {
		t.Fatalf("400 bytes of text: %d tokens", txt)
	}
	img := EstimateMessage(&llmv1.Message{Content: []*llmv1.ContentBlock{{Block: &llmv1.ContentBlock_Image{Image: &llmv1.ImageBlock{MimeType: "image/png"}}}}})
	if img != messageOverhead+blockOverhead+binaryTokens {
		t.Fatalf("an image: %d tokens", img)
	}
	if EstimateMessage(nil) != 0 {
		t.Fatal("nil message has tokens")
	}
}

// BenchmarkMeter measures the token meter per appended event on logs of 1k
// to 100k events: the incremental fold's own work (the node estimate and
// the usage anchor) plus one Measure, which must stay flat with the log's
// size (target ≤ 2 µs). The fold runs inside Append, so the figure is
// taken as the event's estimate (what commit adds) plus Measure on a log of
// the given size.
func BenchmarkMeter(b *testing.B) {
	cycle := benchCycle()
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			l, err := NewLog(nil, benchSeed(n))
			if err != nil {
				b.Fatal(err)
			}
			runtime.GC()
			var sink int64
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cputime.Process()
			for i := 0; i < b.N; i++ {
				ev := cycle[i%len(cycle)]
				if IsSurfaceEvent(ev) {
					sink += estimateEvent(ev)
				}
				sink += l.Measure().TotalTokens
			}
			b.ReportMetric(float64((cputime.Process()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
			if sink == 0 {
				b.Fatal("nothing measured")
			}
		})
	}
}

// estimateEvent is the meter's estimate of one surface event (0 for an event
// that projects to no message).
func estimateEvent(ev *sessionv1.SessionEvent) int64 {
	return EstimateMessage(deriveEventMessage(ev))
}

package loop_test

import (
	"context"
	"errors"
	"iter"
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent/internal/compact"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
	"github.com/dsh-dev/dsh/services/agent/internal/loop"
)

// headerRelative reports a window whose pressure threshold sits `over`
// tokens above the session's request envelope, so the scenarios do not
// depend on the size of the default system prompt.
type headerRelative struct {
	h    **harness
	over int64
}

func (m headerRelative) ModelContext(context.Context, string, string) (*llmv1.ModelContext, error) {
	hdr := session.EstimateHeader((*m.h).log.RequestHeader())
	return &llmv1.ModelContext{ContextWindow: int64(math.Ceil(float64(hdr+m.over) / compact.DefaultThresholdRatio))}, nil
}

// withCompactor wires a compactor on the harness's own LLM (so the
// summarization calls are checked for durability too). over ≤ 0: the
// window is unknown.
func withCompactor(hp **harness, over int64, c **compact.Compactor) option {
	return func(h *harness, cfg *loop.Config) {
		var models compact.Models
		if over > 0 {
			models = headerRelative{h: hp, over: over}
		}
		*c = compact.New(cfg.LLM, models, compact.Policy{RetainTokens: 300}, nil)
		cfg.Context = *c
	}
}

// bigTool returns n bytes of output.
func bigTool(name string, n int) fakes.Tool {
	return fakes.Tool{Name: name, Run: func(_ context.Context, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
		return okResult(ex.GetCallId() + ": " + strings.Repeat("output line\n", n/12))
	}}
}

func call(id string) fakes.Response {
	return fakes.Response{Chunks: fakes.ToolCalls("", fakes.Call{ID: id, Name: "big", Args: `{}`})}
}

func summaryOf(s string) fakes.Response { return fakes.Response{Chunks: fakes.Text(s)} }

// manual runs a manual compaction the way the Compact RPC does.
func manual(h *harness, c *compact.Compactor, span *compact.Span) (*compact.Result, error) {
	var res *compact.Result
	err := h.agent.Exclusive(h.t.Context(), &sessionv1.TurnTrigger{Kind: &sessionv1.TurnTrigger_Extension{Extension: &llmv1.Extension{Type: "compact", Json: "{}"}}},
		func(ctx context.Context, s compact.Session) error {
			var err error
			res, err = c.Compact(ctx, s, span)
			return err
		})
	return res, err
}

// twoCalls runs a turn of two big calls and a final answer.
func twoCalls(h *harness) {
	h.gw.Script(call("c1"), call("c2"), fakes.Response{Chunks: fakes.Text("Done.")})
	h.send("start")
	h.waitIdle()
}

func purposes(reqs []*llmv1.GenerateRequest) []llmv1.Purpose {
	var out []llmv1.Purpose
	for _, r := range reqs {
		out = append(out, r.GetPurpose())
	}
	return out
}

// checkSummarizationRequest: the summarization call replays the very
// envelope and leading messages of the conversation's requests (the
// provider's prompt cache survives), then the instruction.
func checkSummarizationRequest(t *testing.T, conv, sum *llmv1.GenerateRequest, shadowed int) {
	t.Helper()
	if sum.GetPurpose() != llmv1.Purpose_PURPOSE_COMPACTION || sum.GetMaxTokens() != compact.DefaultMaxTokens {
		t.Errorf("summarization call purpose %v max %d", sum.GetPurpose(), sum.GetMaxTokens())
	}
	if sum.GetSystem() != conv.GetSystem() || len(sum.GetTools()) != len(conv.GetTools()) {
		t.Errorf("summarization call does not replay the system prompt and tools")
	}
	if len(sum.GetMessages()) != shadowed+1 {
		t.Fatalf("summarization call has %d messages, want %d shadowed + the instruction", len(sum.GetMessages()), shadowed)
	}
	for i := range shadowed {
		a, _ := proto.MarshalOptions{Deterministic: true}.Marshal(conv.GetMessages()[i])
		b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(sum.GetMessages()[i])
		if string(a) != string(b) {
			t.Errorf("message %d of the summarization call differs from the conversation's", i)
		}
	}
	if last := sum.GetMessages()[shadowed]; last.GetContent()[0].GetText().GetText() != compact.Instruction {
		t.Errorf("last message is not the instruction: %v", last)
	}
}

func TestCompactionScenarios(t *testing.T) {
	t.Parallel()
	type scenario struct {
		name string
		over int64 // threshold above the envelope; ≤ 0: unknown window
		big  int   // bytes per big tool result
		run  func(t *testing.T, h *harness, c *compact.Compactor)
	}
	scenarios := []scenario{
		{
			name: "compact_pressure", over: 1000, big: 2000,
			run: func(t *testing.T, h *harness, _ *compact.Compactor) {
				h.gw.Script(call("c1"), call("c2"), summaryOf("The user started; c1 ran."), fakes.Response{Chunks: fakes.Text("Done.")})
				h.send("start")
				h.waitIdle()
				reqs := h.gw.Requests()
				if len(reqs) != 4 {
					t.Fatalf("requests %v", purposes(reqs))
				}
				checkSummarizationRequest(t, reqs[1], reqs[2], 3)
				first := reqs[3].GetMessages()[0].GetContent()[0].GetText().GetText()
				if !strings.HasPrefix(first, compact.CheckpointPreamble) || !strings.Contains(first, "<compacted-summary>\nThe user started; c1 ran.\n</compacted-summary>") {
					t.Errorf("the request after the compaction does not start with the checkpoint: %q", first)
				}
			},
		},
		{
			name: "compact_overflow_recovery", big: 2000,
			run: func(t *testing.T, h *harness, _ *compact.Compactor) {
				h.gw.Script(call("c1"), call("c2"),
					fakes.Response{Chunks: fakes.Failure("CONTEXT_WINDOW_EXCEEDED", "prompt is too long", 0)},
					summaryOf("The user started; c1 ran."), fakes.Response{Chunks: fakes.Text("Done.")})
				h.send("start")
				h.waitIdle()
				reqs := h.gw.Requests()
				if len(reqs) != 5 || reqs[3].GetPurpose() != llmv1.Purpose_PURPOSE_COMPACTION {
					t.Fatalf("requests %v", purposes(reqs))
				}
				if len(reqs[4].GetMessages()) >= len(reqs[2].GetMessages()) {
					t.Errorf("the retried step is not shorter: %d vs %d messages", len(reqs[4].GetMessages()), len(reqs[2].GetMessages()))
				}
			},
		},
		{
			name: "compact_overflow_twice_fails", big: 2000,
			run: func(t *testing.T, h *harness, _ *compact.Compactor) {
				overflow := fakes.Response{Chunks: fakes.Failure("CONTEXT_WINDOW_EXCEEDED", "prompt is too long", 0)}
				h.gw.Script(call("c1"), call("c2"), overflow, summaryOf("The user started; c1 ran."), overflow)
				h.send("start")
				h.waitIdle()
				if n := len(h.gw.Requests()); n != 5 {
					t.Fatalf("%d requests: the step is retried once, not more", n)
				}
			},
		},
		{
			name: "compact_pruning_only", over: 2000, big: 10_000,
			run: func(t *testing.T, h *harness, _ *compact.Compactor) {
				h.gw.Script(call("c1"), fakes.Response{Chunks: fakes.Text("Done.")})
				h.send("start")
				h.waitIdle()
				reqs := h.gw.Requests()
				if len(reqs) != 2 {
					t.Fatalf("requests %v: pruning alone should have sufficed", purposes(reqs))
				}
				res := reqs[1].GetMessages()[2].GetContent()[0].GetToolResult().GetContent()[0].GetText().GetText()
				if !strings.Contains(res, compact.OmissionMarker) || len([]rune(res)) != 4096+1024+len([]rune(compact.OmissionMarker)) {
					t.Errorf("pruned result is %d code points", len([]rune(res)))
				}
				// Idempotent: a second pass finds nothing.
				if p, err := compact.Prune(compact.Session{Log: h.log}, compact.Policy{}); err != nil || len(p) != 0 {
					t.Errorf("second prune: %v, %v", p, err)
				}
			},
		},
		{
			name: "compact_manual", big: 2000,
			run: func(t *testing.T, h *harness, c *compact.Compactor) {
				twoCalls(h)
				nodes, _ := h.log.Surface() // user, a1, r1, a2, r2, a3
				bad := []struct {
					span compact.Span
					want string
				}{
					{compact.Span{Start: 999, End: nodes[1]}, "start 999 is not a node of the current surface"},
					{compact.Span{Start: nodes[0], End: 998}, "end 998 is not a node"},
					{compact.Span{Start: nodes[2], End: nodes[1]}, "comes after end"},
					{compact.Span{Start: nodes[2], End: nodes[2]}, "separates tool results from the assistant message"},
					{compact.Span{Start: nodes[0], End: nodes[3]}, "separates an assistant tool call from its results"},
				}
				for _, b := range bad {
					_, err := c.Compact(t.Context(), compact.Session{Log: h.log}, &b.span)
					var se *compact.SpanError
					if !errors.As(err, &se) || !strings.Contains(err.Error(), b.want) {
						t.Errorf("span %+v: %v, want a SpanError saying %q", b.span, err, b.want)
					}
				}
				h.gw.Script(summaryOf("Summary of the first exchange."))
				res, err := manual(h, c, nil)
				if err != nil {
					t.Fatal(err)
				}
				if res.Start != nodes[0] || res.End != nodes[2] || len(res.ShadowedSeqs) != 3 {
					t.Errorf("compacted %d..%d %v, want the oldest unit %d..%d", res.Start, res.End, res.ShadowedSeqs, nodes[0], nodes[2])
				}
				h.gw.Script(fakes.Response{Chunks: fakes.Text("ok")})
				h.send("next")
				h.waitIdle()
			},
		},
		{
			name: "compact_cancelled", big: 2000,
			run: func(t *testing.T, h *harness, c *compact.Compactor) {
				twoCalls(h)
				h.gw.Script(fakes.Response{Block: true})
				done := make(chan error, 1)
				go func() { _, err := manual(h, c, nil); done <- err }()
				h.waitFor("the summarization call", func([]*sessionv1.SessionEvent) bool { return len(h.gw.Requests()) == 4 })
				if !h.agent.Cancel(nil) {
					t.Fatal("cancel found nothing to cancel")
				}
				if err := <-done; !errors.Is(err, loop.ErrCancelUser) {
					t.Fatalf("manual compaction: %v, want cancelled by the user", err)
				}
			},
		},
		{
			name: "compact_not_shrinking", big: 2000,
			run: func(t *testing.T, h *harness, c *compact.Compactor) {
				twoCalls(h)
				huge := summaryOf(strings.Repeat("verbose ", 2000))
				h.gw.Script(huge, huge)
				_, err := manual(h, c, nil)
				var ns *compact.NotShrinkingError
				if !errors.As(err, &ns) {
					t.Fatalf("manual compaction: %v, want NotShrinkingError", err)
				}
				if _, gen := h.log.Surface(); gen != 0 {
					t.Errorf("a rejected summary replaced something (generation %d)", gen)
				}
			},
		},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			var h *harness
			var c *compact.Compactor
			h = newHarness(t, []fakes.Tool{bigTool("big", sc.big)}, withCompactor(&h, sc.over, &c))
			sc.run(t, h, c)
			h.finish(sc.name)
		})
	}
}

// TestCompactionCrashThenResume: a crash while the summarization call runs
// leaves compact/start without compact/end; repair releases the lock, the
// resumed session works and compacts again.
func TestCompactionCrashThenResume(t *testing.T) {
	t.Parallel()
	var h *harness
	var c *compact.Compactor
	h = newHarness(t, []fakes.Tool{bigTool("big", 2000)}, withCompactor(&h, 0, &c))
	twoCalls(h)
	h.gw.Script(fakes.Response{Block: true})
	go func() { _, _ = manual(h, c, nil) }()
	h.waitFor("the summarization call", func([]*sessionv1.SessionEvent) bool { return len(h.gw.Requests()) == 4 })
	// The crash: only what is durable survives.
	durable := h.log.Events()[:h.durable.Load()]
	if durable[len(durable)-1].GetCompactStart() == nil {
		t.Fatalf("compact/start is not durable (and last) before the summarization call: %s", render(durable))
	}
	seed := append(append([]*sessionv1.SessionEvent(nil), durable...), session.InterruptedTurnClosers(durable)...)

	var h2 *harness
	var c2 *compact.Compactor
	h2 = newHarnessFrom(t, seed, []fakes.Tool{bigTool("big", 2000)}, withCompactor(&h2, 0, &c2))
	if _, held := h2.log.Compacting(); held {
		t.Fatal("repair left the compaction lock held")
	}
	h2.gw.Script(fakes.Response{Chunks: fakes.Text("resumed")})
	h2.send("continue")
	h2.waitIdle()
	h2.gw.Script(summaryOf("Summary after the crash."))
	if _, err := manual(h2, c2, nil); err != nil {
		t.Fatalf("compaction after resume: %v", err)
	}
	h2.finish("compact_crash_resume")
}

// encodeTap records, per model request, the history bytes the gateway
// client encoded afresh (the rest it reused from its per-session cache).
type encodeTap struct {
	h     **harness
	inner loop.LLM
	fresh []int64
}

func (e *encodeTap) Generate(ctx context.Context, req *llmv1.GenerateRequest) iter.Seq2[*llmv1.StreamChunk, error] {
	return func(yield func(*llmv1.StreamChunk, error) bool) {
		before, _ := (*e.h).client.EncodeStats()
		first := true
		for c, err := range e.inner.Generate(ctx, req) {
			if first {
				after, _ := (*e.h).client.EncodeStats()
				e.fresh = append(e.fresh, after-before)
				first = false
			}
			if !yield(c, err) {
				return
			}
		}
	}
}

// TestCompactionReencodedBytes measures what a compaction costs the
// request encoding: the summarization call reuses the conversation's
// encoded leading messages (only the instruction is new: the prefix the
// provider caches is byte-identical), and the request after the checkpoint
// re-encodes from the checkpoint on, once.
func TestCompactionReencodedBytes(t *testing.T) {
	t.Parallel()
	var h *harness
	var c *compact.Compactor
	tap := &encodeTap{h: &h}
	_ = c
	hp := &h
	h = newHarness(t, []fakes.Tool{bigTool("big", 2000)}, func(_ *harness, cfg *loop.Config) {
		tap.inner = cfg.LLM
		cfg.LLM = tap
		c = compact.New(tap, headerRelative{h: hp, over: 1000}, compact.Policy{RetainTokens: 300}, nil)
		cfg.Context = c
	})
	h.gw.Script(call("c1"), call("c2"), summaryOf("The user started; c1 ran."), fakes.Response{Chunks: fakes.Text("Done.")})
	h.send("start")
	h.waitIdle()
	reqs := h.gw.Requests()
	if len(tap.fresh) != len(reqs) || len(reqs) != 4 || reqs[2].GetPurpose() != llmv1.Purpose_PURPOSE_COMPACTION {
		t.Fatalf("requests %v, fresh bytes %v", purposes(reqs), tap.fresh)
	}
	size := func(m *llmv1.Message) int64 { return int64(proto.Size(m)) + 3 } // + field tag and length
	instr := size(reqs[2].GetMessages()[len(reqs[2].GetMessages())-1])
	if tap.fresh[2] != instr {
		t.Errorf("the summarization call encoded %d history bytes afresh, want only its instruction (%d)", tap.fresh[2], instr)
	}
	var after int64
	for _, m := range reqs[3].GetMessages() {
		after += size(m)
	}
	if tap.fresh[3] > after {
		t.Errorf("after the checkpoint: %d bytes encoded afresh, more than the history (%d)", tap.fresh[3], after)
	}
	t.Logf("history bytes encoded afresh per request: %v (summarization call: %d of %d)", tap.fresh, tap.fresh[2], proto.Size(reqs[2]))
}

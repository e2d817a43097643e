package agent

import (
	"context"
	"fmt"
	"iter"
	"path/filepath"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence/sqlitestore"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent/internal/subagent"
)

// instantLLM answers every request at once with one text block (no model
// time).
type instantLLM struct{}

func (instantLLM) Generate(context.Context, *llmv1.GenerateRequest) iter.Seq2[*llmv1.StreamChunk, error] {
	text := &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: "ok"}}}
	chunks := []*llmv1.StreamChunk{
		{Chunk: &llmv1.StreamChunk_BlockStart{BlockStart: &llmv1.BlockStart{Index: 0, BlockType: llmv1.BlockType_BLOCK_TYPE_TEXT}}},
		{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Index: 0, Text: "ok"}}},
		{Chunk: &llmv1.StreamChunk_BlockEnd{BlockEnd: &llmv1.BlockEnd{Index: 0, Block: text}}},
		{Chunk: &llmv1.StreamChunk_Finish{Finish: &llmv1.FinishChunk{Reason: &llmv1.FinishReason{Kind: &llmv1.FinishReason_Stop{Stop: &llmv1.FinishStop{}}}}}},
	}
	return func(yield func(*llmv1.StreamChunk, error) bool) {
		for _, c := range chunks {
			if !yield(c, nil) {
				return
			}
		}
	}
}

// BenchmarkSubagentChild measures the cost of one delegation's session
// work: create the child (header in SQLite, subagent/start appended to the
// parent's open turn, prompt queued), run its one-step turn against an
// instant model (its checkpoints flush to SQLite), append subagent/end and
// dispose it. It reports the median; the target is ≤ 1 ms.
func BenchmarkSubagentChild(b *testing.B) {
	for _, sync := range []string{"NORMAL", "FULL"} {
		b.Run("sync="+sync, func(b *testing.B) {
			ctx := context.Background()
			st, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: filepath.Join(b.TempDir(), "s.db"), Synchronous: sync})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			var n atomic.Int64
			s, err := New(Config{DefaultCwd: "/work", NewID: func() string { return fmt.Sprintf("s%d", n.Add(1)) }},
				Deps{Store: st, LLM: instantLLM{}}, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(ctx)
			parent, err := s.createSession(ctx, &agentv1.CreateSessionRequest{SessionId: "parent",
				Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}})
			if err != nil {
				b.Fatal(err)
			}
			// The delegating call runs inside the parent's open turn.
			pl, err := s.liveByID("parent")
			if err != nil {
				b.Fatal(err)
			}
			if _, err := pl.log.Append(session.TurnStartEvent(1, session.MessageTrigger(session.UserSource()))); err != nil {
				b.Fatal(err)
			}
			d := delegation{s}
			req := subagent.Request{ParentID: parent.GetHeader().GetId(), ToolCallID: "c1", Turn: 1,
				Mode: sessionv1.SubagentMode_SUBAGENT_MODE_SPAWN, Description: "bench", Prompt: "go", Depth: 1}
			times := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				c, err := d.Start(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				out := c.Wait(ctx)
				if out.StopReason != "completed" {
					b.Fatalf("child ended %s: %s", out.StopReason, out.Error)
				}
				d.End(ctx, req, c, out)
				times = append(times, time.Since(t0))
			}
			b.StopTimer()
			sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
			b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "median-ms")
		})
	}
}

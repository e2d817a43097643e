package llmstream

import (
	"errors"
	"github.com/dsh-dev/dsh/internal/cputime"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

func TestAssemblerBlocks(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		chunks  []*llmv1.StreamChunk
		want    []*llmv1.ContentBlock
		wantErr bool
	}{
		{
			name:   "empty stream",
			chunks: nil,
			want:   []*llmv1.ContentBlock{},
		},
		{
			name:   "delta-only text creates the block implicitly",
			chunks: []*llmv1.StreamChunk{text(0, "Hel"), text(0, "lo")},
			want:   []*llmv1.ContentBlock{textBlock("Hello")},
		},
		{
			name:   "delta-only reasoning and text in first-seen order",
			chunks: []*llmv1.StreamChunk{reasoning(1, "think"), text(0, "say"), reasoning(1, "ing")},
			want:   []*llmv1.ContentBlock{reasoningBlock("thinking"), textBlock("say")},
		},
		{
			name:   "block-end is authoritative",
			chunks: []*llmv1.StreamChunk{start(0, tText), text(0, "draft"), end(0, textBlock("final"))},
			want:   []*llmv1.ContentBlock{textBlock("final")},
		},
		{
			name:   "straggler delta after close is ignored",
			chunks: []*llmv1.StreamChunk{start(0, tText), text(0, "a"), end(0, textBlock("a")), text(0, "late")},
			want:   []*llmv1.ContentBlock{textBlock("a")},
		},
		{
			name:   "first close wins",
			chunks: []*llmv1.StreamChunk{text(0, "a"), end(0, textBlock("first")), end(0, textBlock("second"))},
			want:   []*llmv1.ContentBlock{textBlock("first")},
		},
		{
			name:   "repeated block-start is ignored",
			chunks: []*llmv1.StreamChunk{start(0, tText), text(0, "a"), start(0, tReasoning), text(0, "b")},
			want:   []*llmv1.ContentBlock{textBlock("ab")},
		},
		{
			name:   "block-end creates an unseen block with its type",
			chunks: []*llmv1.StreamChunk{end(3, callBlock("c", "read", "{}"))},
			want:   []*llmv1.ContentBlock{callBlock("c", "read", "{}")},
		},
		{
			name: "tool-call deltas: id last wins, name when present, raw arguments appended",
			chunks: []*llmv1.StreamChunk{
				call(0, "c-a", ptr("read"), `{"pa`),
				call(0, "c-b", nil, `th":"x`),
				call(0, "c-b", ptr("grep"), `"`),
			},
			want: []*llmv1.ContentBlock{callBlock("c-b", "grep", `{"path":"x"`)},
		},
		{
			name:   "tool call with no delta gets the default id and empty name",
			chunks: []*llmv1.StreamChunk{start(7, tCall)},
			want:   []*llmv1.ContentBlock{callBlock("call-7", "", "")},
		},
		{
			name:   "an empty id from a delta is kept as given",
			chunks: []*llmv1.StreamChunk{call(2, "", nil, "{}")},
			want:   []*llmv1.ContentBlock{callBlock("", "", "{}")},
		},
		{
			name: "interleaved blocks",
			chunks: []*llmv1.StreamChunk{
				start(0, tText), start(1, tCall), text(0, "a"), call(1, "c1", ptr("f"), "{"), text(0, "b"),
				call(1, "c1", nil, "}"), end(1, callBlock("c1", "f", "{}")), end(0, textBlock("ab")),
			},
			want: []*llmv1.ContentBlock{textBlock("ab"), callBlock("c1", "f", "{}")},
		},
		{
			name:   "closed extension block passes through",
			chunks: []*llmv1.StreamChunk{startExt(0, "audio"), end(0, extBlock("audio", `{"x":1}`))},
			want:   []*llmv1.ContentBlock{extBlock("audio", `{"x":1}`)},
		},
		{
			name:    "unclosed extension block is an error",
			chunks:  []*llmv1.StreamChunk{text(0, "a"), startExt(1, "audio")},
			wantErr: true,
		},
		{
			name:    "unclosed image block is an error",
			chunks:  []*llmv1.StreamChunk{start(0, tImage)},
			wantErr: true,
		},
		{
			name:   "block-end without a block closes with the deltas",
			chunks: []*llmv1.StreamChunk{text(0, "a"), end(0, nil), text(0, "b")},
			want:   []*llmv1.ContentBlock{textBlock("a")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var a Assembler
			for _, c := range tt.chunks {
				a.Push(c)
			}
			got, err := a.Blocks()
			if tt.wantErr {
				var ue *UnclosedBlockError
				if !errors.As(err, &ue) || ue.Code() != "UNCLOSED_BLOCK" {
					t.Fatalf("Blocks() error = %v, want *UnclosedBlockError", err)
				}
				if _, err := a.Message(); err == nil {
					t.Fatal("Message() succeeded, want error")
				}
				return
			}
			if err != nil {
				t.Fatalf("Blocks(): %v", err)
			}
			if diff := cmp.Diff(tt.want, got, protocmp.Transform()); diff != "" {
				t.Fatalf("Blocks() (-want +got):\n%s", diff)
			}
			msg, err := a.Message()
			if err != nil {
				t.Fatal(err)
			}
			wantMsg := &llmv1.Message{Role: llmv1.Role_ROLE_ASSISTANT, Content: tt.want}
			if diff := cmp.Diff(wantMsg, msg, protocmp.Transform()); diff != "" {
				t.Fatalf("Message() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAssemblerFinishUsageReplay(t *testing.T) {
	t.Parallel()
	var a Assembler
	if diff := cmp.Diff(stop(), a.Finish(), protocmp.Transform()); diff != "" {
		t.Fatalf("default finish (-want +got):\n%s", diff)
	}
	if a.Usage() != nil || a.ReplayState() != nil || a.Finished() {
		t.Fatal("usage, replay state and finished must be unset before they are seen")
	}
	a.Push(usage(1, 2))
	a.Push(usage(3, 4))
	a.Push(finish(toolCalls(), ptr(`{"sig":"x"}`)))
	if diff := cmp.Diff(toolCalls(), a.Finish(), protocmp.Transform()); diff != "" {
		t.Fatalf("finish (-want +got):\n%s", diff)
	}
	if got := a.Usage(); got.GetInputTokens() != 3 || got.GetOutputTokens() != 4 {
		t.Fatalf("usage = %v, want the last one", got)
	}
	if got := a.ReplayState(); got == nil || *got != `{"sig":"x"}` {
		t.Fatalf("replay state = %v", got)
	}
	a.Reset()
	if a.Finished() || a.Usage() != nil {
		t.Fatal("Reset did not empty the assembler")
	}
}

func TestAssemblerDoesNotAliasChunks(t *testing.T) {
	t.Parallel()
	var a Assembler
	b := textBlock("x")
	a.Push(end(0, b))
	b.GetText().Text = "mutated"
	got, err := a.Blocks()
	if err != nil {
		t.Fatal(err)
	}
	if got[0].GetText().GetText() != "x" {
		t.Fatalf("assembler aliases the pushed block: %v", got[0])
	}
	got[0].GetText().Text = "mutated again"
	again, _ := a.Blocks()
	if again[0].GetText().GetText() != "x" {
		t.Fatal("Blocks returns shared blocks")
	}
}

// TestAssemblerShared: a Shared assembler keeps and returns the pushed
// block, usage and finish reason themselves (the loop's chunks are logged
// and immutable: the assembled message shares them instead of copying),
// and still builds a block that only deltas made afresh.
func TestAssemblerShared(t *testing.T) {
	t.Parallel()
	a := Assembler{Shared: true}
	b := textBlock("x")
	u := &llmv1.TokenUsage{InputTokens: 3, OutputTokens: 4}
	f := &llmv1.FinishReason{Kind: &llmv1.FinishReason_Stop{Stop: &llmv1.FinishStop{}}}
	a.Push(end(0, b))
	a.Push(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Index: 1, Text: "y"}}})
	a.Push(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Usage{Usage: &llmv1.UsageChunk{Usage: u}}})
	a.Push(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Finish{Finish: &llmv1.FinishChunk{Reason: f}}})
	got, err := a.Blocks()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != b || got[1].GetText().GetText() != "y" {
		t.Fatalf("blocks %v: want the pushed block itself, then the deltas' block", got)
	}
	if a.Usage() != u || a.Finish() != f {
		t.Fatalf("usage %p finish %p: want the pushed %p and %p", a.Usage(), a.Finish(), u, f)
	}
	a.Reset()
	if !a.Shared || a.Usage() != nil || a.Finished() {
		t.Fatal("Reset dropped Shared or kept state")
	}
}

func FuzzAssembler(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{2, 0, 3, 'a', 'b', 'c', 2, 0, 1, 'd', 6, 0, 1, 'x'})
	f.Add([]byte{0, 1, 4, 1, 2, 'i', 'd', 2, '{', '}', 7, 1, 1, 'c', 1, 'n', 0, 10, 3, 11, 0, 0})
	f.Add([]byte{1, 2, 5, 'a', 'u', 'd', 'i', 'o', 8, 2, 0, 9, 3, 12, 0})
	f.Add([]byte{3, 255, 2, 'h', 'i', 5, 255, 1, 'x', 1, 'y', 1, 'z'})
	f.Fuzz(func(t *testing.T, data []byte) {
		chunks := chunksFromBytes(data)
		var a Assembler
		indices := map[uint32]bool{}
		for _, c := range chunks {
			a.Push(c)
			switch v := c.GetChunk().(type) {
			case *llmv1.StreamChunk_BlockStart:
				indices[v.BlockStart.GetIndex()] = true
			case *llmv1.StreamChunk_TextDelta:
				indices[v.TextDelta.GetIndex()] = true
			case *llmv1.StreamChunk_ReasoningDelta:
				indices[v.ReasoningDelta.GetIndex()] = true
			case *llmv1.StreamChunk_ToolCallDelta:
				indices[v.ToolCallDelta.GetIndex()] = true
			case *llmv1.StreamChunk_BlockEnd:
				indices[v.BlockEnd.GetIndex()] = true
			}
		}
		blocks, err := a.Blocks()
		if err == nil && len(blocks) > len(indices) {
			t.Fatalf("%d blocks from %d distinct indices", len(blocks), len(indices))
		}
		for _, b := range blocks {
			if b == nil {
				t.Fatal("nil block")
			}
		}
		_ = a.Finish()
		_ = a.Usage()
		_ = a.ReplayState()
	})
}

func BenchmarkAssemblerTextDelta(b *testing.B) {
	chunk := text(0, "hello, world ")
	var a Assembler
	a.Push(start(0, tText))
	b.ReportAllocs()
	n := 0
	cpu := cputime.Process()
	for b.Loop() {
		a.Push(chunk)
		n++
		if n == 4096 { // keep the block a realistic size; reset cost is amortised
			n = 0
			a.Reset()
			a.Push(start(0, tText))
		}
	}
	b.ReportMetric(float64((cputime.Process()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

func BenchmarkAssemblerToolCallDelta(b *testing.B) {
	chunk := call(1, "call_abc", nil, `{"pa`)
	var a Assembler
	a.Push(start(1, tCall))
	b.ReportAllocs()
	n := 0
	cpu := cputime.Process()
	for b.Loop() {
		a.Push(chunk)
		n++
		if n == 4096 {
			n = 0
			a.Reset()
			a.Push(start(1, tCall))
		}
	}
	b.ReportMetric(float64((cputime.Process()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

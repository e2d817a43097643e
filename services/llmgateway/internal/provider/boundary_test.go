package provider

import (
	"context"
	"iter"
	"log/slog"
	"strings"
	"testing"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// render writes a chunk sequence as "start0 delta0:ab | end0 finish":
// one word per chunk, "|" for a boundary marker.
func render(chunks []*llmv1.StreamChunk) string {
	var w []string
	for _, c := range chunks {
		switch v := c.GetChunk().(type) {
		case nil:
			w = append(w, "|")
		case *llmv1.StreamChunk_BlockStart:
			w = append(w, "start")
		case *llmv1.StreamChunk_TextDelta:
			w = append(w, "text:"+v.TextDelta.GetText())
		case *llmv1.StreamChunk_ToolCallDelta:
			w = append(w, "args:"+v.ToolCallDelta.GetArgumentsDelta())
		case *llmv1.StreamChunk_BlockEnd:
			w = append(w, "end")
		case *llmv1.StreamChunk_Finish:
			w = append(w, "finish")
		default:
			w = append(w, "other")
		}
	}
	return strings.Join(w, " ")
}

// TestFlushMarksBoundary: a coalescing emitter yields a boundary marker at
// every Flush, after the chunks the flush sends (so a consumer holding
// chunks until the marker holds none past the adapter's next wait); held
// bytes (the growth bound) are not chunks yet, and the marker still comes.
func TestFlushMarksBoundary(t *testing.T) {
	t.Parallel()
	text, tool := llmv1.BlockType_BLOCK_TYPE_TEXT, llmv1.BlockType_BLOCK_TYPE_TOOL_CALL
	d := func(s string) op { return op{kind: 'd', text: s} }
	f, e := op{kind: 'f'}, op{kind: 'e'}
	big := strings.Repeat("x", MinGrowthStart)
	for _, tt := range []struct {
		name     string
		typ      llmv1.BlockType
		ops      []op
		coalesce bool
		want     string
	}{
		{"one read", text, []op{d("a"), d("b"), f}, true, "start text:ab | end finish"},
		{"a flush with only the start waiting sends it", text, []op{f, d("a"), f, d("b"), e, f}, true, "start | text:a | text:b end | finish"},
		{"held tail still marked", tool, []op{d(big), f, d("y"), f, e}, true, "start args:" + big + " | | args:y end finish"},
		{"no coalescing, no markers", text, []op{d("a"), f, d("b")}, false, "start text:a | text:b end finish"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := render(driveMarked(t, []llmv1.BlockType{tt.typ}, tt.ops, tt.coalesce))
			if got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

// TestNormalizeMarked: markers pass NormalizeMarked in place (after the
// finish too) and never reach Normalize's consumers.
func TestNormalizeMarked(t *testing.T) {
	t.Parallel()
	in := func(yield func(*llmv1.StreamChunk, error) bool) {
		_ = yield(nil, nil) &&
			yield(start(0, llmv1.BlockType_BLOCK_TYPE_TEXT), nil) && yield(textDelta(0, "a"), nil) && yield(nil, nil) &&
			yield(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Finish{Finish: &llmv1.FinishChunk{Reason: Stop()}}}, nil) && yield(nil, nil)
	}
	collect := func(s iter.Seq[*llmv1.StreamChunk]) string {
		var out []*llmv1.StreamChunk
		for c := range s {
			out = append(out, c)
		}
		return render(out)
	}
	log := slog.New(slog.DiscardHandler)
	// Normalize closes the open block before the finish.
	if got, want := collect(NormalizeMarked(context.Background(), log, "r", in)), "| start text:a | end finish |"; got != want {
		t.Errorf("NormalizeMarked: %s, want %s", got, want)
	}
	if got, want := collect(Normalize(context.Background(), log, "r", in)), "start text:a end finish"; got != want {
		t.Errorf("Normalize: %s, want %s", got, want)
	}
}

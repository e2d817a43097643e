package session

import (
	"slices"
	"strings"
	"testing"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

func textChunk(s string) *llmv1.StreamChunk {
	return &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Text: s}}}
}

// TestChunkEventAndChunks: ChunkEvent puts a lone chunk in `chunk` (the
// shape of every event written before batches) and several in `chunks`;
// Chunks reads any event back in stream order, `chunk` first, skipping nil
// entries, and stops when its consumer does.
func TestChunkEventAndChunks(t *testing.T) {
	t.Parallel()
	a, b, c := textChunk("a"), textChunk("b"), textChunk("c")
	for _, tt := range []struct {
		name       string
		ac         *sessionv1.AssistantChunk
		want       []*llmv1.StreamChunk
		loneInside bool // ChunkEvent's rows: a lone chunk goes in `chunk`
	}{
		{"ChunkEvent of one", ChunkEvent(1, 2, []*llmv1.StreamChunk{a}).GetAssistantChunk(), []*llmv1.StreamChunk{a}, true},
		{"ChunkEvent of three", ChunkEvent(1, 2, []*llmv1.StreamChunk{a, b, c}).GetAssistantChunk(), []*llmv1.StreamChunk{a, b, c}, false},
		{"chunk, then chunks", &sessionv1.AssistantChunk{Chunk: a, Chunks: []*llmv1.StreamChunk{b, c}}, []*llmv1.StreamChunk{a, b, c}, true},
		{"nil entries skipped", &sessionv1.AssistantChunk{Chunks: []*llmv1.StreamChunk{nil, b, nil}}, []*llmv1.StreamChunk{b}, false},
		{"nil event", nil, nil, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := slices.Collect(Chunks(tt.ac)); !slices.Equal(got, tt.want) {
				t.Fatalf("Chunks yielded %v, want %v", got, tt.want)
			}
			if strings.HasPrefix(tt.name, "ChunkEvent") {
				if inside := tt.ac.GetChunk() != nil; inside != tt.loneInside || inside == (len(tt.ac.GetChunks()) > 0) {
					t.Fatalf("`chunk` set = %v with %d in `chunks`, want a lone chunk in `chunk` only", inside, len(tt.ac.GetChunks()))
				}
			}
			for range Chunks(tt.ac) {
				break // an early stop must not panic or go on
			}
		})
	}
	ev := ChunkEvent(3, 4, []*llmv1.StreamChunk{a, b})
	if ac := ev.GetAssistantChunk(); ac.GetTurn() != 3 || ac.GetStep() != 4 || TypeName(ev) != TypeAssistantChunk {
		t.Fatalf("ChunkEvent = %v", ev)
	}
}

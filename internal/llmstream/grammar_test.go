package llmstream

import (
	"errors"
	"testing"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

func TestCheckStream(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		chunks  []*llmv1.StreamChunk
		wantPos int // -1: valid
	}{
		{"minimal", []*llmv1.StreamChunk{finish(stop(), nil)}, -1},
		{"full", []*llmv1.StreamChunk{
			start(0, tReasoning), reasoning(0, "r"), end(0, reasoningBlock("r")),
			start(1, tText), text(1, "t"), start(2, tCall), call(2, "c", ptr("f"), "{}"),
			end(1, textBlock("t")), end(2, callBlock("c", "f", "{}")),
			usage(1, 1), finish(toolCalls(), ptr("{}")),
		}, -1},
		{"index reused after close", []*llmv1.StreamChunk{start(0, tText), end(0, textBlock("")), start(0, tText), end(0, textBlock("")), finish(stop(), nil)}, -1},
		{"extension block", []*llmv1.StreamChunk{startExt(0, "audio"), end(0, extBlock("audio", "{}")), finish(stop(), nil)}, -1},
		{"empty stream", nil, 0},
		{"no finish", []*llmv1.StreamChunk{start(0, tText), end(0, textBlock(""))}, 2},
		{"start repeats while open", []*llmv1.StreamChunk{start(0, tText), start(0, tText)}, 1},
		{"start without type", []*llmv1.StreamChunk{start(0, llmv1.BlockType_BLOCK_TYPE_UNSPECIFIED)}, 0},
		{"extension start without type name", []*llmv1.StreamChunk{startExt(0, "")}, 0},
		{"delta to unopened block", []*llmv1.StreamChunk{text(0, "x")}, 0},
		{"delta to closed block", []*llmv1.StreamChunk{start(0, tText), end(0, textBlock("")), text(0, "x")}, 2},
		{"text delta to reasoning block", []*llmv1.StreamChunk{start(0, tReasoning), text(0, "x")}, 1},
		{"reasoning delta to text block", []*llmv1.StreamChunk{start(0, tText), reasoning(0, "x")}, 1},
		{"tool-call delta to text block", []*llmv1.StreamChunk{start(0, tText), call(0, "c", nil, "")}, 1},
		{"end of unopened block", []*llmv1.StreamChunk{end(0, textBlock(""))}, 0},
		{"end with other type", []*llmv1.StreamChunk{start(0, tText), end(0, reasoningBlock(""))}, 1},
		{"end with other extension type", []*llmv1.StreamChunk{startExt(0, "a"), end(0, extBlock("b", "{}"))}, 1},
		{"end without block", []*llmv1.StreamChunk{start(0, tText), end(0, nil)}, 1},
		{"double end", []*llmv1.StreamChunk{start(0, tText), end(0, textBlock("")), end(0, textBlock(""))}, 2},
		{"usage twice", []*llmv1.StreamChunk{usage(1, 1), usage(1, 1)}, 1},
		{"open block at finish", []*llmv1.StreamChunk{start(0, tText), finish(stop(), nil)}, 1},
		{"chunk after finish", []*llmv1.StreamChunk{finish(stop(), nil), usage(1, 1)}, 1},
		{"finish without reason", []*llmv1.StreamChunk{finish(nil, nil)}, 0},
		{"empty chunk", []*llmv1.StreamChunk{{}}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := CheckStream(tt.chunks)
			if tt.wantPos < 0 {
				if err != nil {
					t.Fatalf("CheckStream: %v", err)
				}
				return
			}
			var ge *GrammarError
			if !errors.As(err, &ge) {
				t.Fatalf("CheckStream error = %v, want *GrammarError", err)
			}
			if ge.Pos != tt.wantPos || ge.Code() != "STREAM_GRAMMAR" {
				t.Fatalf("error at %d (%v), want at %d", ge.Pos, err, tt.wantPos)
			}
		})
	}
}

func TestGrammarCheckerSticky(t *testing.T) {
	t.Parallel()
	var g GrammarChecker
	first := g.Push(text(0, "x"))
	if first == nil {
		t.Fatal("want error")
	}
	if err := g.Push(finish(stop(), nil)); err != first {
		t.Fatalf("later Push = %v, want the first error", err)
	}
	if err := g.End(); err != first {
		t.Fatalf("End = %v, want the first error", err)
	}
}

// A stream the grammar accepts always assembles: every block is closed, so
// the assembler never errors, and it yields one block per block-start.
func FuzzGrammar(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{11, 0, 0})
	f.Add([]byte{0, 1, 2, 1, 1, 'a', 6, 1, 1, 'a', 10, 0, 11, 0, 0})
	f.Add([]byte{0, 3, 4, 3, 1, 'c', 1, '{', 7, 3, 1, 'c', 0, 0, 11, 0, 0})
	f.Add([]byte{1, 2, 5, 'a', 'u', 'd', 'i', 'o', 8, 2, 5, 'a', 'u', 'd', 'i', 'o', 11, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		chunks := chunksFromBytes(data)
		err := CheckStream(chunks)
		if err != nil {
			var ge *GrammarError
			if !errors.As(err, &ge) || ge.Pos < 0 || ge.Pos > len(chunks) {
				t.Fatalf("bad error %v for %d chunks", err, len(chunks))
			}
			return
		}
		var a Assembler
		starts := 0
		for _, c := range chunks {
			a.Push(c)
			if c.GetBlockStart() != nil {
				starts++
			}
		}
		blocks, err := a.Blocks()
		if err != nil {
			t.Fatalf("a grammatical stream failed to assemble: %v", err)
		}
		if len(blocks) > starts {
			t.Fatalf("%d blocks from %d block-starts", len(blocks), starts)
		}
		if !a.Finished() {
			t.Fatal("grammatical stream without finish")
		}
	})
}

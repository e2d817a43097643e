package provider

import (
	"context"
	"iter"
	"log/slog"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// Normalize turns an adapter's sequence into the one shape the gateway
// serves, whatever the adapter did:
//   - a yielded error becomes finish{error, failure} (finish{aborted} when
//     its code is ABORTED or the caller's ctx is done);
//   - a sequence that ends without finish ends with finish{aborted} if ctx
//     is done, else finish{error, STREAM_CLOSED};
//   - blocks still open at the finish are closed first with their content
//     assembled from the deltas seen;
//   - replay state is dropped from an unsuccessful finish, and nothing is
//     passed on after the finish (stragglers are logged).
//
// Adapters that use Emitter already obey all of this; Normalize is the
// gateway's guarantee, not their crutch. Boundary markers (see the package
// doc) are dropped.
func Normalize(ctx context.Context, log *slog.Logger, route string, in iter.Seq2[*llmv1.StreamChunk, error]) iter.Seq[*llmv1.StreamChunk] {
	return normalize(ctx, log, route, in, false)
}

// NormalizeMarked is Normalize passing the adapter's boundary markers on as
// nil chunks (after the finish too: a marker after it says the finish was
// produced before the adapter waited). The chunks Normalize adds itself
// come at the sequence's end.
func NormalizeMarked(ctx context.Context, log *slog.Logger, route string, in iter.Seq2[*llmv1.StreamChunk, error]) iter.Seq[*llmv1.StreamChunk] {
	return normalize(ctx, log, route, in, true)
}

func normalize(ctx context.Context, log *slog.Logger, route string, in iter.Seq2[*llmv1.StreamChunk, error], marked bool) iter.Seq[*llmv1.StreamChunk] {
	return func(yield func(*llmv1.StreamChunk) bool) {
		var t tracker
		finished, stragglers := false, 0
		for c, err := range in {
			if c == nil && err == nil {
				if marked && !yield(nil) {
					return
				}
				continue
			}
			if finished {
				stragglers++
				continue
			}
			if err != nil {
				f := AsFailure(err)
				if ctx.Err() != nil && f.Code != CodeTimeout {
					f = &Failure{Code: CodeAborted, Message: "the caller cancelled the request"}
				}
				finished = true
				if !t.close(yield) || !yield(f.Finish()) {
					return
				}
				continue
			}
			if fin := c.GetFinish(); fin != nil {
				finished = true
				switch fin.GetReason().GetKind().(type) {
				case *llmv1.FinishReason_Error, *llmv1.FinishReason_Aborted:
					if fin.ReplayState != nil {
						fin.ReplayState = nil
					}
				}
				if !t.close(yield) {
					return
				}
			} else {
				t.track(c)
			}
			if !yield(c) {
				return
			}
		}
		if stragglers > 0 {
			log.Warn("adapter yielded chunks after finish; dropped", "route", route, "chunks", stragglers)
		}
		if finished {
			return
		}
		f := &Failure{Code: CodeStreamClosed, Message: "the adapter ended the stream without a finish"}
		if ctx.Err() != nil {
			f = &Failure{Code: CodeAborted, Message: "the caller cancelled the request"}
		}
		if t.close(yield) {
			yield(f.Finish())
		}
	}
}

// tracker follows open blocks so Normalize can close them.
type tracker struct {
	open  []uint32
	parts map[uint32]*partial
}

func (t *tracker) track(c *llmv1.StreamChunk) {
	switch v := c.GetChunk().(type) {
	case *llmv1.StreamChunk_BlockStart:
		if t.parts == nil {
			t.parts = make(map[uint32]*partial)
		}
		if _, ok := t.parts[v.BlockStart.GetIndex()]; !ok {
			t.parts[v.BlockStart.GetIndex()] = &partial{typ: v.BlockStart.GetBlockType(), open: true}
			t.open = append(t.open, v.BlockStart.GetIndex())
		}
	case *llmv1.StreamChunk_TextDelta:
		if p := t.parts[v.TextDelta.GetIndex()]; p != nil {
			p.text.WriteString(v.TextDelta.GetText())
		}
	case *llmv1.StreamChunk_ReasoningDelta:
		if p := t.parts[v.ReasoningDelta.GetIndex()]; p != nil {
			p.text.WriteString(v.ReasoningDelta.GetText())
		}
	case *llmv1.StreamChunk_ToolCallDelta:
		if p := t.parts[v.ToolCallDelta.GetIndex()]; p != nil {
			p.id = v.ToolCallDelta.GetId()
			if v.ToolCallDelta.Name != nil {
				p.name = v.ToolCallDelta.GetName()
			}
			p.text.WriteString(v.ToolCallDelta.GetArgumentsDelta())
		}
	case *llmv1.StreamChunk_BlockEnd:
		if p := t.parts[v.BlockEnd.GetIndex()]; p != nil {
			p.open = false
		}
	}
}

// close yields a block-end for every block still open, in open order.
func (t *tracker) close(yield func(*llmv1.StreamChunk) bool) bool {
	for _, i := range t.open {
		p := t.parts[i]
		if !p.open {
			continue
		}
		p.open = false
		var b *llmv1.ContentBlock
		switch p.typ {
		case llmv1.BlockType_BLOCK_TYPE_TEXT:
			b = &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: p.text.String()}}}
		case llmv1.BlockType_BLOCK_TYPE_REASONING:
			b = &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Reasoning{Reasoning: &llmv1.ReasoningBlock{Text: p.text.String()}}}
		case llmv1.BlockType_BLOCK_TYPE_TOOL_CALL:
			b = &llmv1.ContentBlock{Block: &llmv1.ContentBlock_ToolCall{ToolCall: &llmv1.ToolCallBlock{Id: p.id, Name: p.name, Arguments: p.text.String()}}}
		default:
			b = &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Extension{Extension: &llmv1.Extension{Type: "unknown", Json: "{}"}}}
		}
		if !yield(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_BlockEnd{BlockEnd: &llmv1.BlockEnd{Index: i, Block: b}}}) {
			return false
		}
	}
	return true
}

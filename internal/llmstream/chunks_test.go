package llmstream

import (
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// Terse chunk constructors for the tests.

func start(i uint32, t llmv1.BlockType) *llmv1.StreamChunk {
	return &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_BlockStart{BlockStart: &llmv1.BlockStart{Index: i, BlockType: t}}}
}

func startExt(i uint32, ext string) *llmv1.StreamChunk {
	return &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_BlockStart{BlockStart: &llmv1.BlockStart{Index: i, BlockType: llmv1.BlockType_BLOCK_TYPE_EXTENSION, ExtensionType: ext}}}
}

func text(i uint32, s string) *llmv1.StreamChunk {
	return &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Index: i, Text: s}}}
}

func reasoning(i uint32, s string) *llmv1.StreamChunk {
	return &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_ReasoningDelta{ReasoningDelta: &llmv1.ReasoningDelta{Index: i, Text: s}}}
}

func call(i uint32, id string, name *string, args string) *llmv1.StreamChunk {
	return &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_ToolCallDelta{ToolCallDelta: &llmv1.ToolCallDelta{Index: i, Id: id, Name: name, ArgumentsDelta: args}}}
}

func end(i uint32, b *llmv1.ContentBlock) *llmv1.StreamChunk {
	return &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_BlockEnd{BlockEnd: &llmv1.BlockEnd{Index: i, Block: b}}}
}

func usage(in, out int64) *llmv1.StreamChunk {
	return &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Usage{Usage: &llmv1.UsageChunk{Usage: &llmv1.TokenUsage{InputTokens: in, OutputTokens: out}}}}
}

func finish(r *llmv1.FinishReason, replay *string) *llmv1.StreamChunk {
	return &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Finish{Finish: &llmv1.FinishChunk{Reason: r, ReplayState: replay}}}
}

func stop() *llmv1.FinishReason {
	return &llmv1.FinishReason{Kind: &llmv1.FinishReason_Stop{Stop: &llmv1.FinishStop{}}}
}

func toolCalls() *llmv1.FinishReason {
	return &llmv1.FinishReason{Kind: &llmv1.FinishReason_ToolCalls{ToolCalls: &llmv1.FinishToolCalls{}}}
}

func textBlock(s string) *llmv1.ContentBlock {
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}
}

func reasoningBlock(s string) *llmv1.ContentBlock {
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Reasoning{Reasoning: &llmv1.ReasoningBlock{Text: s}}}
}

func callBlock(id, name, args string) *llmv1.ContentBlock {
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_ToolCall{ToolCall: &llmv1.ToolCallBlock{Id: id, Name: name, Arguments: args}}}
}

func extBlock(typ, json string) *llmv1.ContentBlock {
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Extension{Extension: &llmv1.Extension{Type: typ, Json: json}}}
}

func ptr[T any](v T) *T { return &v }

const (
	tText      = llmv1.BlockType_BLOCK_TYPE_TEXT
	tReasoning = llmv1.BlockType_BLOCK_TYPE_REASONING
	tCall      = llmv1.BlockType_BLOCK_TYPE_TOOL_CALL
	tImage     = llmv1.BlockType_BLOCK_TYPE_IMAGE
)

// chunksFromBytes decodes fuzz input into a chunk sequence: each chunk takes
// a kind byte, an index byte (small indices, so collisions happen) and, for
// payload-carrying kinds, a length byte and that many payload bytes.
func chunksFromBytes(data []byte) []*llmv1.StreamChunk {
	var out []*llmv1.StreamChunk
	next := func() (byte, bool) {
		if len(data) == 0 {
			return 0, false
		}
		b := data[0]
		data = data[1:]
		return b, true
	}
	payload := func() string {
		n, _ := next()
		n %= 8
		if int(n) > len(data) {
			n = byte(len(data))
		}
		s := string(data[:n])
		data = data[n:]
		return s
	}
	for {
		k, ok := next()
		if !ok {
			return out
		}
		ib, _ := next()
		idx := uint32(ib % 5)
		if ib == 255 {
			idx = 1<<32 - 1
		}
		switch k % 13 {
		case 0:
			out = append(out, start(idx, llmv1.BlockType(ib%6)))
		case 1:
			out = append(out, startExt(idx, payload()))
		case 2:
			out = append(out, text(idx, payload()))
		case 3:
			out = append(out, reasoning(idx, payload()))
		case 4:
			out = append(out, call(idx, payload(), nil, payload()))
		case 5:
			out = append(out, call(idx, payload(), ptr(payload()), payload()))
		case 6:
			out = append(out, end(idx, textBlock(payload())))
		case 7:
			out = append(out, end(idx, callBlock(payload(), payload(), payload())))
		case 8:
			out = append(out, end(idx, extBlock(payload(), "{}")))
		case 9:
			out = append(out, end(idx, nil))
		case 10:
			out = append(out, usage(int64(ib), 1))
		case 11:
			out = append(out, finish(stop(), ptr(payload())))
		case 12:
			out = append(out, &llmv1.StreamChunk{})
		}
	}
}

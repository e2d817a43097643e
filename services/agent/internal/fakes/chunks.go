package fakes

import (
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// Call is one tool call of a scripted response.
type Call struct {
	ID, Name, Args string
}

// Text is a complete successful response with one text block.
func Text(s string) []*llmv1.StreamChunk {
	return append(TextBlock(0, s), Usage(10, 5), Finish(&llmv1.FinishReason{Kind: &llmv1.FinishReason_Stop{Stop: &llmv1.FinishStop{}}}))
}

// TextBlock is block-start, one text delta and block-end for block index i.
func TextBlock(i uint32, s string) []*llmv1.StreamChunk {
	return []*llmv1.StreamChunk{
		{Chunk: &llmv1.StreamChunk_BlockStart{BlockStart: &llmv1.BlockStart{Index: i, BlockType: llmv1.BlockType_BLOCK_TYPE_TEXT}}},
		{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Index: i, Text: s}}},
		{Chunk: &llmv1.StreamChunk_BlockEnd{BlockEnd: &llmv1.BlockEnd{Index: i, Block: &llmv1.ContentBlock{
			Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}}}},
	}
}

// ToolBlock is block-start, one argument delta and block-end of a tool call.
func ToolBlock(i uint32, c Call) []*llmv1.StreamChunk {
	name := c.Name
	return []*llmv1.StreamChunk{
		{Chunk: &llmv1.StreamChunk_BlockStart{BlockStart: &llmv1.BlockStart{Index: i, BlockType: llmv1.BlockType_BLOCK_TYPE_TOOL_CALL}}},
		{Chunk: &llmv1.StreamChunk_ToolCallDelta{ToolCallDelta: &llmv1.ToolCallDelta{Index: i, Id: c.ID, Name: &name, ArgumentsDelta: c.Args}}},
		{Chunk: &llmv1.StreamChunk_BlockEnd{BlockEnd: &llmv1.BlockEnd{Index: i, Block: &llmv1.ContentBlock{
			Block: &llmv1.ContentBlock_ToolCall{ToolCall: &llmv1.ToolCallBlock{Id: c.ID, Name: c.Name, Arguments: c.Args}}}}}},
	}
}

// ToolCalls is a complete response: optional text, then the calls, finishing
// with tool-calls.
func ToolCalls(text string, calls ...Call) []*llmv1.StreamChunk {
	var out []*llmv1.StreamChunk
	var i uint32
	if text != "" {
		out = append(out, TextBlock(0, text)...)
		i++
	}
	for _, c := range calls {
		out = append(out, ToolBlock(i, c)...)
		i++
	}
	return append(out, Usage(20, 8), Finish(&llmv1.FinishReason{Kind: &llmv1.FinishReason_ToolCalls{ToolCalls: &llmv1.FinishToolCalls{}}}))
}

// Usage is a usage chunk.
func Usage(in, out int64) *llmv1.StreamChunk {
	return &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Usage{Usage: &llmv1.UsageChunk{Usage: &llmv1.TokenUsage{InputTokens: in, OutputTokens: out}}}}
}

// Finish is a finish chunk.
func Finish(r *llmv1.FinishReason) *llmv1.StreamChunk {
	return &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Finish{Finish: &llmv1.FinishChunk{Reason: r}}}
}

// MaxTokens finishes a response with max-tokens.
func MaxTokens() *llmv1.StreamChunk {
	return Finish(&llmv1.FinishReason{Kind: &llmv1.FinishReason_MaxTokens{MaxTokens: &llmv1.FinishMaxTokens{}}})
}

// Failure is a complete failed response: a finish error with the failure.
func Failure(code, msg string, retryAfterMs int64) []*llmv1.StreamChunk {
	f := &llmv1.LlmFailure{Code: code, Message: msg}
	if retryAfterMs > 0 {
		f.ProviderRetryAfterMs = &retryAfterMs
	}
	return []*llmv1.StreamChunk{Finish(&llmv1.FinishReason{Kind: &llmv1.FinishReason_Error{Error: &llmv1.FinishError{Failure: f}}})}
}

package provider

import (
	"strings"

	"github.com/dsh-dev/dsh/services/llmgateway/internal/fragment"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// Emitter builds a grammatical chunk stream for an adapter: it numbers
// blocks in open order, assembles each block from its deltas so block-end can
// carry the authoritative block, and yields through the range-over-func
// yield function. Every method returns false once the consumer stopped.
type Emitter struct {
	yield   func(*llmv1.StreamChunk, error) bool
	blocks  []*partial
	stopped bool
}

type partial struct {
	typ   llmv1.BlockType
	open  bool
	text  strings.Builder
	id    string
	name  string
	carry fragment.Carry
}

// NewEmitter returns an Emitter yielding through yield.
func NewEmitter(yield func(*llmv1.StreamChunk, error) bool) *Emitter {
	return &Emitter{yield: yield}
}

func (e *Emitter) emit(c *llmv1.StreamChunk) bool {
	if e.stopped {
		return false
	}
	if !e.yield(c, nil) {
		e.stopped = true
	}
	return !e.stopped
}

// Open opens a new block of type t and returns its index.
func (e *Emitter) Open(t llmv1.BlockType) (uint32, bool) {
	i := uint32(len(e.blocks))
	e.blocks = append(e.blocks, &partial{typ: t, open: true})
	return i, e.emit(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_BlockStart{BlockStart: &llmv1.BlockStart{Index: i, BlockType: t}}})
}

// OpenToolCall opens a tool-call block with its call id and name.
func (e *Emitter) OpenToolCall(id, name string) (uint32, bool) {
	i, ok := e.Open(llmv1.BlockType_BLOCK_TYPE_TOOL_CALL)
	e.blocks[i].id, e.blocks[i].name = id, name
	return i, ok
}

// The delta chunks are the hot path (one per provider token), so each is
// built in one allocation: the chunk, its oneof wrapper and the delta live
// in one struct and point into it.
type textChunk struct {
	c llmv1.StreamChunk
	w llmv1.StreamChunk_TextDelta
	d llmv1.TextDelta
}

type reasoningChunk struct {
	c llmv1.StreamChunk
	w llmv1.StreamChunk_ReasoningDelta
	d llmv1.ReasoningDelta
}

type toolChunk struct {
	c llmv1.StreamChunk
	w llmv1.StreamChunk_ToolCallDelta
	d llmv1.ToolCallDelta
}

// Text appends visible text to text block i.
func (e *Emitter) Text(i uint32, s string) bool {
	e.blocks[i].text.WriteString(s)
	x := &textChunk{}
	x.d.Index, x.d.Text = i, s
	x.w.TextDelta = &x.d
	x.c.Chunk = &x.w
	return e.emit(&x.c)
}

// Reasoning appends reasoning text to reasoning block i.
func (e *Emitter) Reasoning(i uint32, s string) bool {
	e.blocks[i].text.WriteString(s)
	x := &reasoningChunk{}
	x.d.Index, x.d.Text = i, s
	x.w.ReasoningDelta = &x.d
	x.c.Chunk = &x.w
	return e.emit(&x.c)
}

// ToolArgs appends a raw argument fragment to tool-call block i. A non-empty
// name (re)names the call and travels on this delta.
func (e *Emitter) ToolArgs(i uint32, name, args string) bool {
	p := e.blocks[i]
	x := &toolChunk{}
	x.d.Index, x.d.Id, x.d.ArgumentsDelta = i, p.id, args
	if name != "" {
		p.name = name
		x.d.Name = &name
	}
	p.text.WriteString(args)
	x.w.ToolCallDelta = &x.d
	x.c.Chunk = &x.w
	return e.emit(&x.c)
}

// SetToolArgs replaces the assembled arguments of tool-call block i without
// emitting a delta (for providers whose deltas were empty and whose start
// carried the arguments as an object).
func (e *Emitter) SetToolArgs(i uint32, args string) {
	e.blocks[i].text.Reset()
	e.blocks[i].text.WriteString(args)
}

// Len reports the number of blocks opened so far.
func (e *Emitter) Len() int { return len(e.blocks) }

// IsOpen reports whether block i is open.
func (e *Emitter) IsOpen(i uint32) bool { return int(i) < len(e.blocks) && e.blocks[i].open }

// ArgsLen reports the length of tool-call block i's assembled arguments.
func (e *Emitter) ArgsLen(i uint32) int { return e.blocks[i].text.Len() }

// Block returns block i as assembled so far.
func (e *Emitter) Block(i uint32) *llmv1.ContentBlock {
	p := e.blocks[i]
	switch p.typ {
	case llmv1.BlockType_BLOCK_TYPE_REASONING:
		return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Reasoning{Reasoning: &llmv1.ReasoningBlock{Text: p.text.String()}}}
	case llmv1.BlockType_BLOCK_TYPE_TOOL_CALL:
		return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_ToolCall{ToolCall: &llmv1.ToolCallBlock{Id: p.id, Name: p.name, Arguments: p.text.String()}}}
	default:
		return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: p.text.String()}}}
	}
}

// Fragment appends decoded provider bytes (see fragment.Unquote) to block
// i, whatever its type, holding back a character split across fragments
// until it is complete. A tool call's non-empty name travels with it. It
// emits nothing when there is nothing complete to say.
func (e *Emitter) Fragment(i uint32, name string, b []byte) bool {
	s := e.blocks[i].carry.Push(b)
	return e.delta(i, name, s)
}

func (e *Emitter) delta(i uint32, name, s string) bool {
	switch e.blocks[i].typ {
	case llmv1.BlockType_BLOCK_TYPE_TOOL_CALL:
		if s == "" && name == "" {
			return !e.stopped
		}
		return e.ToolArgs(i, name, s)
	case llmv1.BlockType_BLOCK_TYPE_REASONING:
		if s == "" {
			return !e.stopped
		}
		return e.Reasoning(i, s)
	default:
		if s == "" {
			return !e.stopped
		}
		return e.Text(i, s)
	}
}

// End closes block i, yielding block-end with the assembled block. Closing a
// closed block does nothing. Held-back bytes are flushed first.
func (e *Emitter) End(i uint32) bool {
	if !e.blocks[i].open {
		return !e.stopped
	}
	if e.blocks[i].carry.Pending() && !e.delta(i, "", e.blocks[i].carry.Flush()) {
		return false
	}
	e.blocks[i].open = false
	return e.emit(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_BlockEnd{BlockEnd: &llmv1.BlockEnd{Index: i, Block: e.Block(i)}}})
}

// EndAll closes every open block in index order.
func (e *Emitter) EndAll() bool {
	for i := range e.blocks {
		if !e.End(uint32(i)) {
			return false
		}
	}
	return !e.stopped
}

// Usage yields the usage chunk.
func (e *Emitter) Usage(u *llmv1.TokenUsage) bool {
	return e.emit(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Usage{Usage: &llmv1.UsageChunk{Usage: u}}})
}

// Finish closes any open block and yields the terminal finish chunk.
// replayState is dropped unless the reason is a success.
func (e *Emitter) Finish(r *llmv1.FinishReason, replayState *string) bool {
	if !e.EndAll() {
		return false
	}
	switch r.GetKind().(type) {
	case *llmv1.FinishReason_Error, *llmv1.FinishReason_Aborted:
		replayState = nil
	}
	return e.emit(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Finish{Finish: &llmv1.FinishChunk{Reason: r, ReplayState: replayState}}})
}

// Fail closes any open block and yields finish{error|aborted} for f.
func (e *Emitter) Fail(f *Failure) bool {
	if !e.EndAll() {
		return false
	}
	return e.emit(f.Finish())
}

// Stop returns finish reason stop.
func Stop() *llmv1.FinishReason {
	return &llmv1.FinishReason{Kind: &llmv1.FinishReason_Stop{Stop: &llmv1.FinishStop{}}}
}

// ToolCalls returns finish reason tool-calls.
func ToolCalls() *llmv1.FinishReason {
	return &llmv1.FinishReason{Kind: &llmv1.FinishReason_ToolCalls{ToolCalls: &llmv1.FinishToolCalls{}}}
}

// MaxTokens returns finish reason max-tokens.
func MaxTokens() *llmv1.FinishReason {
	return &llmv1.FinishReason{Kind: &llmv1.FinishReason_MaxTokens{MaxTokens: &llmv1.FinishMaxTokens{}}}
}

// StoppedFor is the finish of a provider stop reason the protocol has no
// variant for: finish{error} with message "model stopped: <r>" and code
// UPPER(r).
func StoppedFor(r string) *llmv1.FinishReason {
	f := &Failure{Code: strings.ToUpper(r), Message: "model stopped: " + r}
	if f.Code == "" {
		f.Code = CodeUnknown
	}
	return f.Finish().GetFinish().GetReason()
}

package provider

import (
	"strings"
	"time"

	"github.com/dsh-dev/dsh/services/llmgateway/internal/fragment"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// Emitter builds a grammatical chunk stream for an adapter: it numbers
// blocks in open order, assembles each block from its deltas so block-end can
// carry the authoritative block, and yields through the range-over-func
// yield function. Every method returns false once the consumer stopped.
//
// # Coalescing
//
// After Coalesce, consecutive deltas of one block are merged into one chunk
// until Flush (the adapter calls it when its input is about to block: the
// deltas merged are only those already waiting, none is delayed to wait for
// another) or until any other chunk is emitted. Flush also yields a
// boundary marker (see Boundary), so the consumer knows what was produced
// together. One rule bounds how many
// chunks a block can produce however its provider cuts it: once a block has
// sent MinGrowthStart bytes, Flush holds back a merged delta shorter than
// 1/GrowthDivisor of what the block already sent, so the sent length grows
// geometrically and a 1.2 MB tool argument in 12-byte deltas becomes a few
// hundred chunks, not 100,000. The held bytes go out with the next delta
// that reaches the bound, any other chunk, the block's end, or FlushHeld
// (the adapter calls it when its input has been quiet for MaxHold); the
// assembled block is the same byte for byte.
type Emitter struct {
	yield    func(*llmv1.StreamChunk, error) bool
	blocks   []*partial
	stopped  bool
	coalesce bool
	pend     pending
	starts   []*llmv1.StreamChunk // block-starts not yet sent
}

// Coalescing bounds; see the Emitter's doc.
const (
	MinGrowthStart = 2 << 10
	GrowthDivisor  = 64
	// MaxHold bounds how long held bytes wait for the provider's next event.
	MaxHold = 50 * time.Millisecond
)

// pending is the merged delta not yet sent: block i's deltas since its last
// chunk. The first piece is kept as is; a second is copied into buf.
type pending struct {
	set   bool
	i     uint32
	name  string
	first string
	buf   []byte
	multi bool
}

func (p *pending) text() string {
	if p.multi {
		return string(p.buf)
	}
	return p.first
}

func (p *pending) len() int {
	if p.multi {
		return len(p.buf)
	}
	return len(p.first)
}

type partial struct {
	typ   llmv1.BlockType
	open  bool
	sent  int // bytes sent in deltas
	text  strings.Builder
	id    string
	name  string
	carry fragment.Carry
}

// NewEmitter returns an Emitter yielding through yield.
func NewEmitter(yield func(*llmv1.StreamChunk, error) bool) *Emitter {
	return &Emitter{yield: yield}
}

// Coalesce turns coalescing on (see the type's doc); the adapter must then
// call Flush whenever its input is about to block.
func (e *Emitter) Coalesce() { e.coalesce = true }

// Flush sends the merged delta, unless the growth bound holds it back, and
// then a boundary (see Boundary): the adapter is about to wait. It returns
// false once the consumer stopped.
func (e *Emitter) Flush() bool {
	ok := !e.stopped
	switch {
	case !e.pend.set:
		if len(e.starts) > 0 {
			ok = e.sendStarts()
		}
	case e.blocks[e.pend.i].sent >= MinGrowthStart && e.pend.len() < e.blocks[e.pend.i].sent/GrowthDivisor && e.pend.name == "":
		// held back by the growth bound
	default:
		ok = e.flush()
	}
	return ok && e.Boundary()
}

// Boundary yields the boundary marker (a nil chunk with a nil error; see
// Adapter): every chunk yielded since the previous marker was produced
// from input already read, and the adapter is about to wait for more. A
// consumer may send those chunks together (the gateway's batches); it
// must not hold any of them past the marker. It returns false once the
// consumer stopped.
func (e *Emitter) Boundary() bool {
	if e.stopped {
		return false
	}
	if !e.yield(nil, nil) {
		e.stopped = true
	}
	return !e.stopped
}

// Held reports whether Flush held a merged delta back (see the type's doc).
func (e *Emitter) Held() bool { return e.pend.set }

// FlushHeld sends a held delta, and then a boundary: the provider has been
// quiet for MaxHold.
func (e *Emitter) FlushHeld() bool { return e.flush() && e.Boundary() }

// flush sends the merged delta unconditionally.
func (e *Emitter) flush() bool {
	if !e.pend.set {
		return !e.stopped
	}
	p := e.pend
	e.pend.set, e.pend.multi, e.pend.first, e.pend.name, e.pend.buf = false, false, "", "", e.pend.buf[:0]
	return e.send(p.i, p.name, p.text())
}

func (e *Emitter) emit(c *llmv1.StreamChunk) bool {
	if len(e.starts) > 0 && !e.sendStarts() {
		return false
	}
	if e.pend.set && !e.flush() {
		return false
	}
	if e.stopped {
		return false
	}
	if !e.yield(c, nil) {
		e.stopped = true
	}
	return !e.stopped
}

// Open opens a new block of type t and returns its index. When coalescing,
// the block-start waits for the block's first delta or the next other
// chunk, whichever comes first, so that it and the first delta leave
// together (one write, not two, before the first token reaches the client).
func (e *Emitter) Open(t llmv1.BlockType) (uint32, bool) {
	i := uint32(len(e.blocks))
	e.blocks = append(e.blocks, &partial{typ: t, open: true})
	c := &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_BlockStart{BlockStart: &llmv1.BlockStart{Index: i, BlockType: t}}}
	if e.coalesce {
		// What is pending belongs to an earlier block: it goes first.
		if !e.flush() {
			return i, false
		}
		e.starts = append(e.starts, c)
		return i, true
	}
	return i, e.emit(c)
}

// sendStarts sends the block-starts waiting for their first delta.
func (e *Emitter) sendStarts() bool {
	for k, c := range e.starts {
		e.starts[k] = nil
		if !e.stopped && !e.yield(c, nil) {
			e.stopped = true
		}
	}
	e.starts = e.starts[:0]
	return !e.stopped
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
func (e *Emitter) Text(i uint32, s string) bool { return e.queue(i, "", s) }

// Reasoning appends reasoning text to reasoning block i.
func (e *Emitter) Reasoning(i uint32, s string) bool { return e.queue(i, "", s) }

// ToolArgs appends a raw argument fragment to tool-call block i. A non-empty
// name (re)names the call and travels on this delta.
func (e *Emitter) ToolArgs(i uint32, name, args string) bool { return e.queue(i, name, args) }

// queue records a delta of block i in the assembled block and sends it, or
// when coalescing merges it into the pending delta.
func (e *Emitter) queue(i uint32, name, s string) bool {
	p := e.blocks[i]
	p.text.WriteString(s)
	if name != "" {
		p.name = name
	}
	if !e.coalesce {
		return e.send(i, name, s)
	}
	if e.pend.set && (e.pend.i != i || (name != "" && e.pend.name != "" && name != e.pend.name)) {
		if !e.flush() {
			return false
		}
	}
	if !e.pend.set {
		e.pend.set, e.pend.i, e.pend.first = true, i, s
	} else {
		if !e.pend.multi {
			e.pend.buf = append(e.pend.buf[:0], e.pend.first...)
			e.pend.multi, e.pend.first = true, ""
		}
		e.pend.buf = append(e.pend.buf, s...)
	}
	if name != "" {
		e.pend.name = name
	}
	return !e.stopped
}

// send yields one delta chunk of block i, built in one allocation.
func (e *Emitter) send(i uint32, name, s string) bool {
	p := e.blocks[i]
	p.sent += len(s)
	switch p.typ {
	case llmv1.BlockType_BLOCK_TYPE_TOOL_CALL:
		x := &toolChunk{}
		x.d.Index, x.d.Id, x.d.ArgumentsDelta = i, p.id, s
		if name != "" {
			x.d.Name = &name
		}
		x.w.ToolCallDelta = &x.d
		x.c.Chunk = &x.w
		return e.emit(&x.c)
	case llmv1.BlockType_BLOCK_TYPE_REASONING:
		x := &reasoningChunk{}
		x.d.Index, x.d.Text = i, s
		x.w.ReasoningDelta = &x.d
		x.c.Chunk = &x.w
		return e.emit(&x.c)
	default:
		x := &textChunk{}
		x.d.Index, x.d.Text = i, s
		x.w.TextDelta = &x.d
		x.c.Chunk = &x.w
		return e.emit(&x.c)
	}
}

// SetToolArgs replaces the assembled arguments of tool-call block i without
// emitting a delta (for providers whose deltas were empty and whose start
// carried the arguments as an object).
func (e *Emitter) SetToolArgs(i uint32, args string) {
	if e.pend.set && e.pend.i == i {
		e.flush()
	}
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

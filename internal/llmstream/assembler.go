package llmstream

import (
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// partial is one block being assembled.
type partial struct {
	index   uint32
	typ     llmv1.BlockType
	extType string // extension type name, for BLOCK_TYPE_EXTENSION
	closed  bool
	block   *llmv1.ContentBlock // the authoritative block carried by block-end
	text    strings.Builder     // text or reasoning deltas
	args    strings.Builder     // tool-call argument fragments
	callID  string
	name    string
	hasID   bool
	hasName bool
}

// Assembler folds StreamChunks into content blocks (semantics.md §2.4). The
// zero value is ready to use. It is not safe for concurrent use.
//
// Rules: a block-start registers its index once (a repeated start is
// ignored); a delta creates its block implicitly when the index is unseen
// (text, reasoning or tool-call by the delta's kind), is ignored once the
// block closed, and otherwise appends; a tool-call delta sets the call id
// (last wins) and the name when present; the first block-end of an index
// wins and its block is authoritative; usage and finish overwrite.
//
// By default the assembler copies what it keeps of a pushed chunk (a
// block-end's block, usage, the finish reason) and hands out fresh copies.
// With Shared set, the caller promises that the chunks it pushes are
// never mutated and outlive what the assembler returns (the agent's loop:
// the chunks are logged, immutable, before they are pushed): the assembler
// then keeps those messages by reference and returns them as they are, so
// an assembled message shares its closed blocks and usage with the logged
// chunks instead of holding a second copy of them. Neither may be mutated.
type Assembler struct {
	Shared bool

	parts       []*partial // in first-seen order
	last        int        // position of the last partial touched, a lookup cache
	usage       *llmv1.TokenUsage
	finish      *llmv1.FinishReason
	replayState *string
}

// lookup returns the partial of index, or nil.
func (a *Assembler) lookup(index uint32) *partial {
	if a.last < len(a.parts) && a.parts[a.last].index == index {
		return a.parts[a.last]
	}
	for i, p := range a.parts {
		if p.index == index {
			a.last = i
			return p
		}
	}
	return nil
}

// getOrCreate returns the partial of index, registering it with typ when
// unseen.
func (a *Assembler) getOrCreate(index uint32, typ llmv1.BlockType, extType string) *partial {
	if p := a.lookup(index); p != nil {
		return p
	}
	p := &partial{index: index, typ: typ, extType: extType}
	a.last = len(a.parts)
	a.parts = append(a.parts, p)
	return p
}

// Push folds one chunk. Chunks with no variant are ignored.
func (a *Assembler) Push(c *llmv1.StreamChunk) {
	switch v := c.GetChunk().(type) {
	case *llmv1.StreamChunk_TextDelta:
		p := a.getOrCreate(v.TextDelta.GetIndex(), llmv1.BlockType_BLOCK_TYPE_TEXT, "")
		if !p.closed {
			p.text.WriteString(v.TextDelta.GetText())
		}
	case *llmv1.StreamChunk_ReasoningDelta:
		p := a.getOrCreate(v.ReasoningDelta.GetIndex(), llmv1.BlockType_BLOCK_TYPE_REASONING, "")
		if !p.closed {
			p.text.WriteString(v.ReasoningDelta.GetText())
		}
	case *llmv1.StreamChunk_ToolCallDelta:
		d := v.ToolCallDelta
		p := a.getOrCreate(d.GetIndex(), llmv1.BlockType_BLOCK_TYPE_TOOL_CALL, "")
		if p.closed {
			return
		}
		p.callID, p.hasID = d.GetId(), true
		if d.Name != nil {
			p.name, p.hasName = d.GetName(), true
		}
		p.args.WriteString(d.GetArgumentsDelta())
	case *llmv1.StreamChunk_BlockStart:
		s := v.BlockStart
		a.getOrCreate(s.GetIndex(), s.GetBlockType(), s.GetExtensionType())
	case *llmv1.StreamChunk_BlockEnd:
		e := v.BlockEnd
		typ, ext := BlockTypeOf(e.GetBlock())
		p := a.getOrCreate(e.GetIndex(), typ, ext)
		if p.closed {
			return
		}
		p.closed = true
		p.block = keep(a, e.GetBlock())
	case *llmv1.StreamChunk_Usage:
		a.usage = keep(a, v.Usage.GetUsage())
	case *llmv1.StreamChunk_Finish:
		a.finish = keep(a, v.Finish.GetReason())
		if v.Finish.ReplayState != nil {
			s := v.Finish.GetReplayState()
			a.replayState = &s
		} else {
			a.replayState = nil
		}
	}
}

// keep is what the assembler a keeps of a pushed message m: m itself when
// Shared, else a copy (nil for a nil m either way).
func keep[M proto.Message](a *Assembler, m M) M {
	if a.Shared {
		return m
	}
	return proto.CloneOf(m)
}

// BlockTypeOf returns the stream block type of a content block and, for an
// extension block, its type name.
func BlockTypeOf(b *llmv1.ContentBlock) (llmv1.BlockType, string) {
	switch v := b.GetBlock().(type) {
	case *llmv1.ContentBlock_Text:
		return llmv1.BlockType_BLOCK_TYPE_TEXT, ""
	case *llmv1.ContentBlock_Reasoning:
		return llmv1.BlockType_BLOCK_TYPE_REASONING, ""
	case *llmv1.ContentBlock_ToolCall:
		return llmv1.BlockType_BLOCK_TYPE_TOOL_CALL, ""
	case *llmv1.ContentBlock_ToolResult:
		return llmv1.BlockType_BLOCK_TYPE_TOOL_RESULT, ""
	case *llmv1.ContentBlock_Image:
		return llmv1.BlockType_BLOCK_TYPE_IMAGE, ""
	case *llmv1.ContentBlock_Extension:
		return llmv1.BlockType_BLOCK_TYPE_EXTENSION, v.Extension.GetType()
	}
	return llmv1.BlockType_BLOCK_TYPE_UNSPECIFIED, ""
}

// UnclosedBlockError reports a block of a type the assembler cannot build
// from deltas (anything but text, reasoning and tool-call) that never got its
// block-end.
type UnclosedBlockError struct {
	Index uint32
	Type  string // block type, or the extension type name
}

func (e *UnclosedBlockError) Error() string {
	return fmt.Sprintf("llmstream: block %d of type %q has no block-end carrying the block, and cannot be assembled from deltas", e.Index, e.Type)
}

// Code returns "UNCLOSED_BLOCK".
func (e *UnclosedBlockError) Code() string { return "UNCLOSED_BLOCK" }

// Blocks returns the assembled blocks in first-seen index order: a closed
// block's authoritative block, otherwise the block built from its deltas
// (a tool call without an id gets "call-<index>"). It fails with an
// [*UnclosedBlockError] for an unclosed block of any other type. The blocks
// are fresh (with Shared, a closed block is the pushed one); Blocks may be
// called repeatedly and between pushes.
func (a *Assembler) Blocks() ([]*llmv1.ContentBlock, error) {
	out := make([]*llmv1.ContentBlock, 0, len(a.parts))
	for _, p := range a.parts {
		if p.closed && p.block != nil {
			out = append(out, keep(a, p.block))
			continue
		}
		switch p.typ {
		case llmv1.BlockType_BLOCK_TYPE_TEXT:
			out = append(out, &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: p.text.String()}}})
		case llmv1.BlockType_BLOCK_TYPE_REASONING:
			out = append(out, &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Reasoning{Reasoning: &llmv1.ReasoningBlock{Text: p.text.String()}}})
		case llmv1.BlockType_BLOCK_TYPE_TOOL_CALL:
			id := p.callID
			if !p.hasID {
				id = "call-" + strconv.FormatUint(uint64(p.index), 10)
			}
			out = append(out, &llmv1.ContentBlock{Block: &llmv1.ContentBlock_ToolCall{ToolCall: &llmv1.ToolCallBlock{
				Id: id, Name: p.name, Arguments: p.args.String()}}})
		default:
			name := p.typ.String()
			if p.typ == llmv1.BlockType_BLOCK_TYPE_EXTENSION && p.extType != "" {
				name = p.extType
			}
			return nil, &UnclosedBlockError{Index: p.index, Type: name}
		}
	}
	return out, nil
}

// Message returns the assembled assistant message (role and content only).
func (a *Assembler) Message() (*llmv1.Message, error) {
	blocks, err := a.Blocks()
	if err != nil {
		return nil, err
	}
	return &llmv1.Message{Role: llmv1.Role_ROLE_ASSISTANT, Content: blocks}, nil
}

// Finish returns the stored finish reason (a copy, unless Shared), or
// "stop" when the stream ended without one.
func (a *Assembler) Finish() *llmv1.FinishReason {
	if a.finish != nil {
		return keep(a, a.finish)
	}
	return &llmv1.FinishReason{Kind: &llmv1.FinishReason_Stop{Stop: &llmv1.FinishStop{}}}
}

// Finished reports whether a finish chunk was seen.
func (a *Assembler) Finished() bool { return a.finish != nil }

// ReplayState returns the replay state of the finish chunk, or nil.
func (a *Assembler) ReplayState() *string {
	if a.replayState == nil {
		return nil
	}
	s := *a.replayState
	return &s
}

// Usage returns the last usage seen (a copy, unless Shared), or nil.
func (a *Assembler) Usage() *llmv1.TokenUsage {
	return keep(a, a.usage)
}

// Reset empties the assembler for reuse (Shared stays as it was).
func (a *Assembler) Reset() { *a = Assembler{Shared: a.Shared} }

package llmstream

import (
	"fmt"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// GrammarError reports the first chunk that breaks the stream grammar.
type GrammarError struct {
	Pos   int    // zero-based position of the chunk in the stream; the chunk count for End
	Chunk string // the chunk's kind ("text-delta", ...), or "end" for End
	Rule  string // the broken rule, in words
}

func (e *GrammarError) Error() string {
	return fmt.Sprintf("llmstream: stream grammar broken at chunk %d (%s): %s", e.Pos, e.Chunk, e.Rule)
}

// Code returns "STREAM_GRAMMAR".
func (e *GrammarError) Code() string { return "STREAM_GRAMMAR" }

type openBlock struct {
	index   uint32
	typ     llmv1.BlockType
	extType string
}

// GrammarChecker checks a stream against the strict StreamChunk grammar
// (semantics.md §2.4): a block-start index may not repeat while open; a delta
// must target an open block of its own type; a block-end must close an open
// block of the same type; usage comes at most once; no block is open at
// finish; nothing follows finish; the stream ends with finish. Indices are
// uint32 on the wire, so always non-negative safe integers. The zero value is
// ready; after the first error every later call returns that error.
type GrammarChecker struct {
	pos      int
	open     []openBlock
	sawUsage bool
	finished bool
	err      error
}

func (g *GrammarChecker) fail(kind, format string, args ...any) error {
	g.err = &GrammarError{Pos: g.pos, Chunk: kind, Rule: fmt.Sprintf(format, args...)}
	return g.err
}

func (g *GrammarChecker) find(index uint32) int {
	for i := range g.open {
		if g.open[i].index == index {
			return i
		}
	}
	return -1
}

// ChunkKind returns the protocol name of a chunk's variant ("block-start",
// "text-delta", ...), or "" when none is set.
func ChunkKind(c *llmv1.StreamChunk) string {
	switch c.GetChunk().(type) {
	case *llmv1.StreamChunk_BlockStart:
		return "block-start"
	case *llmv1.StreamChunk_TextDelta:
		return "text-delta"
	case *llmv1.StreamChunk_ReasoningDelta:
		return "reasoning-delta"
	case *llmv1.StreamChunk_ToolCallDelta:
		return "tool-call-delta"
	case *llmv1.StreamChunk_BlockEnd:
		return "block-end"
	case *llmv1.StreamChunk_Usage:
		return "usage"
	case *llmv1.StreamChunk_Finish:
		return "finish"
	}
	return ""
}

// Push checks the next chunk.
func (g *GrammarChecker) Push(c *llmv1.StreamChunk) error {
	if g.err != nil {
		return g.err
	}
	kind := ChunkKind(c)
	if g.finished {
		return g.fail(kind, "nothing may follow finish")
	}
	delta := func(index uint32, want llmv1.BlockType) error {
		i := g.find(index)
		if i < 0 {
			return g.fail(kind, "block %d is not open", index)
		}
		if g.open[i].typ != want {
			return g.fail(kind, "block %d is a %s block, not %s", index, g.open[i].typ, want)
		}
		return nil
	}
	var err error
	switch v := c.GetChunk().(type) {
	case *llmv1.StreamChunk_BlockStart:
		s := v.BlockStart
		switch {
		case s.GetBlockType() == llmv1.BlockType_BLOCK_TYPE_UNSPECIFIED:
			err = g.fail(kind, "block %d has no block type", s.GetIndex())
		case s.GetBlockType() == llmv1.BlockType_BLOCK_TYPE_EXTENSION && s.GetExtensionType() == "":
			err = g.fail(kind, "extension block %d has no extension type", s.GetIndex())
		case g.find(s.GetIndex()) >= 0:
			err = g.fail(kind, "block %d is already open", s.GetIndex())
		default:
			g.open = append(g.open, openBlock{index: s.GetIndex(), typ: s.GetBlockType(), extType: s.GetExtensionType()})
		}
	case *llmv1.StreamChunk_TextDelta:
		err = delta(v.TextDelta.GetIndex(), llmv1.BlockType_BLOCK_TYPE_TEXT)
	case *llmv1.StreamChunk_ReasoningDelta:
		err = delta(v.ReasoningDelta.GetIndex(), llmv1.BlockType_BLOCK_TYPE_REASONING)
	case *llmv1.StreamChunk_ToolCallDelta:
		err = delta(v.ToolCallDelta.GetIndex(), llmv1.BlockType_BLOCK_TYPE_TOOL_CALL)
	case *llmv1.StreamChunk_BlockEnd:
		e := v.BlockEnd
		i := g.find(e.GetIndex())
		typ, ext := BlockTypeOf(e.GetBlock())
		switch {
		case e.GetBlock() == nil || typ == llmv1.BlockType_BLOCK_TYPE_UNSPECIFIED:
			err = g.fail(kind, "block-end %d carries no block", e.GetIndex())
		case i < 0:
			err = g.fail(kind, "block %d is not open", e.GetIndex())
		case g.open[i].typ != typ:
			err = g.fail(kind, "block %d was opened as %s but closed as %s", e.GetIndex(), g.open[i].typ, typ)
		case typ == llmv1.BlockType_BLOCK_TYPE_EXTENSION && g.open[i].extType != ext:
			err = g.fail(kind, "extension block %d was opened as %q but closed as %q", e.GetIndex(), g.open[i].extType, ext)
		default:
			g.open = append(g.open[:i], g.open[i+1:]...)
		}
	case *llmv1.StreamChunk_Usage:
		if g.sawUsage {
			err = g.fail(kind, "usage may appear at most once")
		}
		g.sawUsage = true
	case *llmv1.StreamChunk_Finish:
		switch {
		case len(g.open) > 0:
			err = g.fail(kind, "block %d is still open at finish", g.open[0].index)
		case v.Finish.GetReason().GetKind() == nil:
			err = g.fail(kind, "finish carries no reason")
		}
		g.finished = true
	default:
		err = g.fail(kind, "chunk has no variant")
	}
	g.pos++
	return err
}

// End checks that the stream ended with a finish chunk.
func (g *GrammarChecker) End() error {
	if g.err != nil {
		return g.err
	}
	if !g.finished {
		return g.fail("end", "the stream must end with a finish chunk")
	}
	return nil
}

// CheckStream checks a whole stream with a [GrammarChecker].
func CheckStream(chunks []*llmv1.StreamChunk) error {
	var g GrammarChecker
	for _, c := range chunks {
		if err := g.Push(c); err != nil {
			return err
		}
	}
	return g.End()
}

package gateway

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
)

// decodeResponse decodes the GenerateResponse in b into resp (reset first)
// as proto.Unmarshal does, but with each chunk made in one allocation
// (the chunk, its oneof wrapper and its message, and a block-end's block
// or a finish's reason with it) and every string a substring of one copy
// of b. A step's chunks are logged and stay in memory while the session is
// loaded: with proto.Unmarshal a tool step's response was ~40 objects,
// nearly half of a loaded `read` session's, each one more for the
// collector to mark.
//
// It decodes only what a gateway sends in the common case: each message
// with every field known, at most once, with its wire type, a chunk with
// one kind set, a block-end's block text, reasoning or a tool call, a
// finish reason stop, tool-calls or max-tokens, valid UTF-8. For anything
// else it returns false, leaving resp undefined, and the caller decodes
// with proto.Unmarshal (FuzzDecodeResponse holds the two equal).
func decodeResponse(b []byte, resp *llmv1.GenerateResponse) bool {
	resp.Reset()
	d := decoder{b: b, s: string(b)}
	n := 0
	ok := d.fields(0, len(b), 2, func(f field) bool {
		if f.num == 2 {
			n++
		}
		return f.typ == protowire.BytesType && (f.num == 1 || f.num == 2)
	})
	if !ok {
		return false
	}
	if n > 0 {
		resp.Chunks = make([]*llmv1.StreamChunk, 0, n)
	}
	return d.fields(0, len(b), 2, func(f field) bool {
		c := d.chunk(f.start, f.end)
		if c == nil {
			return false
		}
		if f.num == 1 {
			resp.Chunk = c
		} else {
			resp.Chunks = append(resp.Chunks, c)
		}
		return true
	})
}

// decoder holds a response's bytes twice: b to parse, s for the strings
// (the same bytes; a string field is s[start:end]).
type decoder struct {
	b []byte
	s string
}

// field is one field of a message: its number and wire type, and its
// value: v for a varint, the bytes [start, end) for a length-delimited one.
type field struct {
	num        protowire.Number
	typ        protowire.Type
	v          uint64
	start, end int
}

// fields calls f with each field of the message in b[i:j], in order. It
// reports false for a malformed message, a field number above 63, a wire
// type other than varint and bytes, a field other than repeated seen a
// second time (0: none repeated), or when f does.
func (d *decoder) fields(i, j int, repeated protowire.Number, f func(field) bool) bool {
	var seen uint64
	for i < j {
		num, typ, n := protowire.ConsumeTag(d.b[i:j])
		if n < 0 || num > 63 {
			return false
		}
		i += n
		fl := field{num: num, typ: typ}
		switch typ {
		case protowire.VarintType:
			v, n := protowire.ConsumeVarint(d.b[i:j])
			if n < 0 {
				return false
			}
			fl.v, i = v, i+n
		case protowire.BytesType:
			v, n := protowire.ConsumeBytes(d.b[i:j])
			if n < 0 {
				return false
			}
			fl.start, fl.end, i = i+n-len(v), i+n, i+n
		default:
			return false
		}
		if num != repeated {
			if seen&(1<<num) != 0 {
				return false
			}
			seen |= 1 << num
		}
		if !f(fl) {
			return false
		}
	}
	return true
}

// str is the string field f, if it is one and valid UTF-8.
func (d *decoder) str(f field) (string, bool) {
	if f.typ != protowire.BytesType {
		return "", false
	}
	s := d.s[f.start:f.end]
	return s, utf8.ValidString(s)
}

// varint is the varint field f, if it is one.
func varint(f field) (uint64, bool) { return f.v, f.typ == protowire.VarintType }

// u32 is a uint32 field's value, truncated as proto.Unmarshal does.
func u32(f field) (uint32, bool) {
	v, ok := varint(f)
	return uint32(v), ok
}

// The one-allocation shapes of the chunks decodeResponse makes.
type (
	startChunk struct {
		c llmv1.StreamChunk
		w llmv1.StreamChunk_BlockStart
		m llmv1.BlockStart
	}
	textChunk struct {
		c llmv1.StreamChunk
		w llmv1.StreamChunk_TextDelta
		m llmv1.TextDelta
	}
	reasoningChunk struct {
		c llmv1.StreamChunk
		w llmv1.StreamChunk_ReasoningDelta
		m llmv1.ReasoningDelta
	}
	toolDeltaChunk struct {
		c    llmv1.StreamChunk
		w    llmv1.StreamChunk_ToolCallDelta
		m    llmv1.ToolCallDelta
		name string
	}
	endChunk struct {
		c llmv1.StreamChunk
		w llmv1.StreamChunk_BlockEnd
		m llmv1.BlockEnd
		b llmv1.ContentBlock
	}
	endTextChunk struct {
		endChunk
		bw llmv1.ContentBlock_Text
		t  llmv1.TextBlock
	}
	endReasoningChunk struct {
		endChunk
		bw llmv1.ContentBlock_Reasoning
		r  llmv1.ReasoningBlock
	}
	endToolChunk struct {
		endChunk
		bw llmv1.ContentBlock_ToolCall
		t  llmv1.ToolCallBlock
	}
	usageChunk struct {
		c                 llmv1.StreamChunk
		w                 llmv1.StreamChunk_Usage
		m                 llmv1.UsageChunk
		u                 llmv1.TokenUsage
		read, write, reas int64
	}
	finishChunk struct {
		c      llmv1.StreamChunk
		w      llmv1.StreamChunk_Finish
		m      llmv1.FinishChunk
		r      llmv1.FinishReason
		replay string
	}
	finishStopChunk struct {
		finishChunk
		w llmv1.FinishReason_Stop
		k llmv1.FinishStop
	}
	finishToolCallsChunk struct {
		finishChunk
		w llmv1.FinishReason_ToolCalls
		k llmv1.FinishToolCalls
	}
	finishMaxTokensChunk struct {
		finishChunk
		w llmv1.FinishReason_MaxTokens
		k llmv1.FinishMaxTokens
	}
)

// oneKind reads the message in b[i:j] as a oneof of messages: at most one
// field, length-delimited. It returns that field and whether one is set;
// ok is false for anything else (a second field declines). Callers check
// the field's number themselves.
func (d *decoder) oneKind(i, j int) (f field, ok, set bool) {
	ok = d.fields(i, j, 0, func(g field) bool {
		if set || g.typ != protowire.BytesType {
			return false
		}
		f, set = g, true
		return true
	})
	return f, ok, set
}

// chunk decodes the StreamChunk in b[i:j], or returns nil.
func (d *decoder) chunk(i, j int) *llmv1.StreamChunk {
	kind, ok, set := d.oneKind(i, j)
	if !ok {
		return nil
	}
	if !set {
		return &llmv1.StreamChunk{}
	}
	i, j = kind.start, kind.end
	switch kind.num {
	case 1:
		e := &startChunk{}
		ok := d.fields(i, j, 0, func(f field) bool {
			var ok bool
			switch f.num {
			case 1:
				e.m.Index, ok = u32(f)
			case 2:
				var v uint64
				v, ok = varint(f)
				e.m.BlockType = llmv1.BlockType(int32(v))
			case 3:
				e.m.ExtensionType, ok = d.str(f)
			}
			return ok
		})
		if !ok {
			return nil
		}
		e.w.BlockStart, e.c.Chunk = &e.m, &e.w
		return &e.c
	case 2, 3:
		var index uint64
		var text string
		ok := d.fields(i, j, 0, func(f field) bool {
			var ok bool
			switch f.num {
			case 1:
				index, ok = varint(f)
			case 2:
				text, ok = d.str(f)
			}
			return ok
		})
		if !ok {
			return nil
		}
		if kind.num == 2 {
			e := &textChunk{}
			e.m.Index, e.m.Text = uint32(index), text
			e.w.TextDelta, e.c.Chunk = &e.m, &e.w
			return &e.c
		}
		e := &reasoningChunk{}
		e.m.Index, e.m.Text = uint32(index), text
		e.w.ReasoningDelta, e.c.Chunk = &e.m, &e.w
		return &e.c
	case 4:
		e := &toolDeltaChunk{}
		ok := d.fields(i, j, 0, func(f field) bool {
			var ok bool
			switch f.num {
			case 1:
				e.m.Index, ok = u32(f)
			case 2:
				e.m.Id, ok = d.str(f)
			case 3:
				e.name, ok = d.str(f)
				e.m.Name = &e.name
			case 4:
				e.m.ArgumentsDelta, ok = d.str(f)
			}
			return ok
		})
		if !ok {
			return nil
		}
		e.w.ToolCallDelta, e.c.Chunk = &e.m, &e.w
		return &e.c
	case 5:
		return d.blockEnd(i, j)
	case 6:
		return d.usage(i, j)
	case 7:
		return d.finish(i, j)
	}
	return nil
}

// blockEnd decodes the BlockEnd in b[i:j] into a chunk, or returns nil.
func (d *decoder) blockEnd(i, j int) *llmv1.StreamChunk {
	var index uint64
	var block field
	hasBlock := false
	ok := d.fields(i, j, 0, func(f field) bool {
		var ok bool
		switch f.num {
		case 1:
			index, ok = varint(f)
		case 2:
			block, hasBlock, ok = f, true, f.typ == protowire.BytesType
		}
		return ok
	})
	if !ok {
		return nil
	}
	var kind field
	set := false
	if hasBlock {
		if kind, ok, set = d.oneKind(block.start, block.end); !ok || set && (kind.num < 1 || kind.num > 3) {
			return nil
		}
	}
	// The block's strings: text (text, reasoning) or id, name, arguments.
	var s [3]string
	if set {
		last := protowire.Number(1)
		if kind.num == 3 {
			last = 3
		}
		if !d.fields(kind.start, kind.end, 0, func(f field) bool {
			var ok bool
			if f.num >= 1 && f.num <= last {
				s[f.num-1], ok = d.str(f)
			}
			return ok
		}) {
			return nil
		}
	}
	var e *endChunk
	switch {
	case !set:
		e = &endChunk{}
	case kind.num == 1:
		x := &endTextChunk{}
		x.t.Text = s[0]
		x.bw.Text, x.b.Block = &x.t, &x.bw
		e = &x.endChunk
	case kind.num == 2:
		x := &endReasoningChunk{}
		x.r.Text = s[0]
		x.bw.Reasoning, x.b.Block = &x.r, &x.bw
		e = &x.endChunk
	default:
		x := &endToolChunk{}
		x.t.Id, x.t.Name, x.t.Arguments = s[0], s[1], s[2]
		x.bw.ToolCall, x.b.Block = &x.t, &x.bw
		e = &x.endChunk
	}
	e.m.Index = uint32(index)
	if hasBlock {
		e.m.Block = &e.b
	}
	e.w.BlockEnd, e.c.Chunk = &e.m, &e.w
	return &e.c
}

// usage decodes the UsageChunk in b[i:j] into a chunk, or returns nil.
func (d *decoder) usage(i, j int) *llmv1.StreamChunk {
	e := &usageChunk{}
	var usage field
	hasUsage := false
	if !d.fields(i, j, 0, func(f field) bool {
		usage, hasUsage = f, true
		return f.num == 1 && f.typ == protowire.BytesType
	}) {
		return nil
	}
	if hasUsage {
		u := &e.u
		if !d.fields(usage.start, usage.end, 0, func(f field) bool {
			v, ok := varint(f)
			switch f.num {
			case 1:
				u.InputTokens = int64(v)
			case 2:
				u.OutputTokens = int64(v)
			case 3:
				e.read, u.CacheReadTokens = int64(v), &e.read
			case 4:
				e.write, u.CacheWriteTokens = int64(v), &e.write
			case 5:
				e.reas, u.ReasoningTokens = int64(v), &e.reas
			default:
				return false
			}
			return ok
		}) {
			return nil
		}
		e.m.Usage = u
	}
	e.w.Usage, e.c.Chunk = &e.m, &e.w
	return &e.c
}

// finish decodes the FinishChunk in b[i:j] into a chunk, or returns nil.
func (d *decoder) finish(i, j int) *llmv1.StreamChunk {
	var replay, reason field
	hasReplay, hasReason := false, false
	if !d.fields(i, j, 0, func(f field) bool {
		switch f.num {
		case 1:
			reason, hasReason = f, true
		case 2:
			replay, hasReplay = f, true
		default:
			return false
		}
		return f.typ == protowire.BytesType
	}) {
		return nil
	}
	// The reason's kind: none, or one of the empty ones.
	var kind protowire.Number
	if hasReason {
		k, ok, set := d.oneKind(reason.start, reason.end)
		if !ok || set && (k.start != k.end || k.num < 1 || k.num > 3) {
			return nil
		}
		kind = k.num // 0 when none is set
	}
	var e *finishChunk
	switch kind {
	case 0:
		e = &finishChunk{}
	case 1:
		x := &finishStopChunk{}
		x.w.Stop, x.r.Kind = &x.k, &x.w
		e = &x.finishChunk
	case 2:
		x := &finishToolCallsChunk{}
		x.w.ToolCalls, x.r.Kind = &x.k, &x.w
		e = &x.finishChunk
	default:
		x := &finishMaxTokensChunk{}
		x.w.MaxTokens, x.r.Kind = &x.k, &x.w
		e = &x.finishChunk
	}
	if hasReplay {
		var ok bool
		if e.replay, ok = d.str(replay); !ok {
			return nil
		}
		e.m.ReplayState = &e.replay
	}
	if hasReason {
		e.m.Reason = &e.r
	}
	e.w.Finish, e.c.Chunk = &e.m, &e.w
	return &e.c
}

package provider

import (
	"fmt"
	"strings"
	"testing"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/internal/llmstream"
)

// op is one step an adapter takes on an Emitter: a delta of block b (with
// a tool name), a flush (its input is about to block), or a block end.
type op struct {
	kind  byte // 'd' delta, 'f' flush, 'e' end
	block uint32
	name  string
	text  string
}

// drive opens blocks of the given types, replays ops and finishes, with
// coalescing on or off; it returns the chunks (without boundary markers).
func drive(t testing.TB, types []llmv1.BlockType, ops []op, coalesce bool) []*llmv1.StreamChunk {
	var out []*llmv1.StreamChunk
	for _, c := range driveMarked(t, types, ops, coalesce) {
		if c != nil {
			out = append(out, c)
		}
	}
	return out
}

// driveMarked is drive returning the boundary markers too (nil chunks).
func driveMarked(t testing.TB, types []llmv1.BlockType, ops []op, coalesce bool) []*llmv1.StreamChunk {
	var out []*llmv1.StreamChunk
	e := NewEmitter(func(c *llmv1.StreamChunk, err error) bool {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
		return true
	})
	if coalesce {
		e.Coalesce()
	}
	for _, typ := range types {
		if typ == llmv1.BlockType_BLOCK_TYPE_TOOL_CALL {
			e.OpenToolCall(fmt.Sprintf("call-%d", e.Len()), "")
		} else {
			e.Open(typ)
		}
	}
	for _, o := range ops {
		switch o.kind {
		case 'd':
			e.delta(o.block, o.name, o.text)
		case 'f':
			e.Flush()
		case 'e':
			e.End(o.block)
		}
	}
	e.Finish(Stop(), nil)
	return out
}

// checkAssembled fails unless the stream is grammatical, has no empty
// text delta, and every block's deltas concatenate to its block-end.
func checkAssembled(t testing.TB, chunks []*llmv1.StreamChunk) {
	t.Helper()
	if err := llmstream.CheckStream(chunks); err != nil {
		t.Fatalf("grammar: %v", err)
	}
	got := map[uint32]*strings.Builder{}
	names := map[uint32]string{}
	b := func(i uint32) *strings.Builder {
		if got[i] == nil {
			got[i] = &strings.Builder{}
		}
		return got[i]
	}
	for _, c := range chunks {
		switch v := c.GetChunk().(type) {
		case *llmv1.StreamChunk_TextDelta:
			b(v.TextDelta.GetIndex()).WriteString(v.TextDelta.GetText())
		case *llmv1.StreamChunk_ReasoningDelta:
			b(v.ReasoningDelta.GetIndex()).WriteString(v.ReasoningDelta.GetText())
		case *llmv1.StreamChunk_ToolCallDelta:
			b(v.ToolCallDelta.GetIndex()).WriteString(v.ToolCallDelta.GetArgumentsDelta())
			if v.ToolCallDelta.Name != nil {
				names[v.ToolCallDelta.GetIndex()] = v.ToolCallDelta.GetName()
			}
		case *llmv1.StreamChunk_BlockEnd:
			i, blk := v.BlockEnd.GetIndex(), v.BlockEnd.GetBlock()
			want := blk.GetText().GetText() + blk.GetReasoning().GetText() + blk.GetToolCall().GetArguments()
			if have := b(i).String(); have != want {
				t.Fatalf("block %d: deltas assemble to %q, block-end says %q", i, have, want)
			}
			if tc := blk.GetToolCall(); tc != nil && tc.GetName() != names[i] {
				t.Fatalf("block %d: deltas name %q, block-end %q", i, names[i], tc.GetName())
			}
		}
	}
}

func deltas(chunks []*llmv1.StreamChunk) (n int) {
	for _, c := range chunks {
		switch c.GetChunk().(type) {
		case *llmv1.StreamChunk_TextDelta, *llmv1.StreamChunk_ReasoningDelta, *llmv1.StreamChunk_ToolCallDelta:
			n++
		}
	}
	return n
}

func TestCoalesce(t *testing.T) {
	t.Parallel()
	text, reasoning, tool := llmv1.BlockType_BLOCK_TYPE_TEXT, llmv1.BlockType_BLOCK_TYPE_REASONING, llmv1.BlockType_BLOCK_TYPE_TOOL_CALL
	d := func(b uint32, s string) op { return op{kind: 'd', block: b, text: s} }
	f := op{kind: 'f'}
	for _, tt := range []struct {
		name  string
		types []llmv1.BlockType
		ops   []op
		want  []string // the delta texts sent, in order
	}{
		{"deltas waiting together become one", []llmv1.BlockType{text}, []op{d(0, "Hel"), d(0, "lo"), d(0, " world"), f}, []string{"Hello world"}},
		{"a flush between sends each", []llmv1.BlockType{text}, []op{d(0, "a"), f, d(0, "b"), f, d(0, "c")}, []string{"a", "b", "c"}},
		{"another block's delta sends the first", []llmv1.BlockType{reasoning, text}, []op{d(0, "think"), d(1, "say"), d(1, "!"), d(0, "more"), f}, []string{"think", "say!", "more"}},
		{"the block end sends what is held", []llmv1.BlockType{text}, []op{d(0, "x"), d(0, "y"), {kind: 'e', block: 0}}, []string{"xy"}},
		{"a tool call's name travels on the merged delta", []llmv1.BlockType{tool}, []op{{kind: 'd', block: 0, name: "bash"}, d(0, `{"a"`), d(0, `:1}`), f}, []string{`{"a":1}`}},
		{"a renamed tool call is not merged across names", []llmv1.BlockType{tool}, []op{{kind: 'd', block: 0, name: "a", text: "1"}, {kind: 'd', block: 0, name: "b", text: "2"}, f}, []string{"1", "2"}},
		{"nothing held, nothing sent on flush", []llmv1.BlockType{text}, []op{f, f, d(0, "z"), f, f}, []string{"z"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			chunks := drive(t, tt.types, tt.ops, true)
			checkAssembled(t, chunks)
			var sent []string
			for _, c := range chunks {
				if s := c.GetTextDelta().GetText() + c.GetReasoningDelta().GetText() + c.GetToolCallDelta().GetArgumentsDelta(); s != "" {
					sent = append(sent, s)
				}
			}
			if strings.Join(sent, "|") != strings.Join(tt.want, "|") {
				t.Errorf("sent %q, want %q", sent, tt.want)
			}
		})
	}
}

// TestCoalesceBoundsHugeBlock: a 1.2 MB tool argument arriving in 12-byte
// deltas with a flush after each (the worst case: every delta in its own
// read) becomes a few hundred chunks, byte-identical when assembled; short
// blocks are not held back at all.
func TestCoalesceBoundsHugeBlock(t *testing.T) {
	t.Parallel()
	const size, piece = 1_200_000, 12
	var ops []op
	arg := strings.Repeat(`{"k":"0123"},`, size/13)
	for i := 0; i < len(arg); i += piece {
		ops = append(ops, op{kind: 'd', text: arg[i:min(i+piece, len(arg))]}, op{kind: 'f'})
	}
	chunks := drive(t, []llmv1.BlockType{llmv1.BlockType_BLOCK_TYPE_TOOL_CALL}, ops, true)
	checkAssembled(t, chunks)
	n := deltas(chunks)
	// MinGrowthStart/piece sends before the bound applies, then growth by
	// at least 1/GrowthDivisor per send: ~171 + 64·ln(1.2 MB / 2 KiB).
	if n > 600 {
		t.Errorf("%d delta chunks for a %d-byte argument in %d-byte deltas, want ≤ 600", n, len(arg), piece)
	}
	t.Logf("%d deltas of %d bytes → %d chunks", len(ops)/2, piece, n)

	short := drive(t, []llmv1.BlockType{llmv1.BlockType_BLOCK_TYPE_TEXT}, ops[:200], true)
	if got := deltas(short); got != 100 {
		t.Errorf("a 1.2 KB block flushed after each delta sent %d chunks, want all 100 (no hold-back below %d bytes)", got, MinGrowthStart)
	}
}

// FuzzCoalesce: whatever deltas, flushes and ends an adapter produces, the
// coalesced stream is grammatical, assembles to exactly what the
// uncoalesced stream assembles to (same block-ends), and never has more
// chunks.
func FuzzCoalesce(f *testing.F) {
	f.Add([]byte{0, 'a', 0, 'b', 1, 2, 'c', 3, 0})
	f.Add([]byte("\x00h\x00i\x01\x02x\x02y\x04\x00\x03\x02"))
	f.Fuzz(func(t *testing.T, prog []byte) {
		types := []llmv1.BlockType{llmv1.BlockType_BLOCK_TYPE_TEXT, llmv1.BlockType_BLOCK_TYPE_REASONING, llmv1.BlockType_BLOCK_TYPE_TOOL_CALL}
		var ops []op
		for i := 0; i+1 < len(prog); i += 2 {
			b := uint32(prog[i]>>4) % 3
			switch prog[i] & 7 {
			case 0, 1, 2:
				ops = append(ops, op{kind: 'd', block: b, text: strings.Repeat(string(rune('a'+prog[i+1]%26)), int(prog[i+1])%40)})
			case 3:
				ops = append(ops, op{kind: 'f'})
			case 4:
				ops = append(ops, op{kind: 'e', block: b})
			case 5:
				name := "n" + string(rune('a'+prog[i+1]%3))
				ops = append(ops, op{kind: 'd', block: 2, name: name, text: string(rune('0' + prog[i+1]%10))})
			default:
				// a big delta, to cross the growth bound
				ops = append(ops, op{kind: 'd', block: b, text: strings.Repeat("z", int(prog[i+1])*64)}, op{kind: 'f'})
			}
		}
		// Deltas after a block's end are not something an adapter does.
		ended := map[uint32]bool{}
		var valid []op
		for _, o := range ops {
			if (o.kind == 'd' || o.kind == 'e') && ended[o.block] {
				continue
			}
			if o.kind == 'e' {
				ended[o.block] = true
			}
			valid = append(valid, o)
		}
		plain := drive(t, types, valid, false)
		marked := driveMarked(t, types, valid, true)
		var merged []*llmv1.StreamChunk
		marks, flushes := 0, 0
		for _, c := range marked {
			if c == nil {
				marks++
			} else {
				merged = append(merged, c)
			}
		}
		for _, o := range valid {
			if o.kind == 'f' {
				flushes++
			}
		}
		// Every flush ends with a boundary marker, and nothing else yields one.
		if marks != flushes {
			t.Fatalf("%d boundary markers for %d flushes", marks, flushes)
		}
		checkAssembled(t, merged)
		var ends, plainEnds []string
		for _, c := range merged {
			if c.GetBlockEnd() != nil {
				ends = append(ends, c.GetBlockEnd().String())
			}
		}
		for _, c := range plain {
			if c.GetBlockEnd() != nil {
				plainEnds = append(plainEnds, c.GetBlockEnd().String())
			}
		}
		if strings.Join(ends, "\n") != strings.Join(plainEnds, "\n") {
			t.Fatalf("block-ends differ:\n%v\n%v", ends, plainEnds)
		}
		if len(merged) > len(plain) {
			t.Fatalf("coalescing produced more chunks (%d) than none (%d)", len(merged), len(plain))
		}
	})
}

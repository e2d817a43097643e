package gateway

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
)

// decodeCases are responses a gateway sends: decodeResponse takes each.
func decodeCases() map[string]*llmv1.GenerateResponse {
	name := "read"
	read, write, reasoning := int64(7), int64(0), int64(3)
	replay := `{"sig":"x"}`
	tool := fakes.ToolCalls("Step.", fakes.Call{ID: "call_1", Name: "read", Args: `{"file_path":"notes.txt"}`})
	return map[string]*llmv1.GenerateResponse{
		"a tool step":      {Chunks: tool},
		"a text step":      {Chunks: fakes.Text("All done. ✓")},
		"one chunk":        {Chunk: fakes.Text("x")[1]},
		"chunk and chunks": {Chunk: tool[0], Chunks: tool[1:]},
		"empty":            {},
		"empty chunk":      {Chunks: []*llmv1.StreamChunk{{}}},
		"reasoning": {Chunks: []*llmv1.StreamChunk{
			{Chunk: &llmv1.StreamChunk_BlockStart{BlockStart: &llmv1.BlockStart{Index: 2, BlockType: llmv1.BlockType_BLOCK_TYPE_REASONING}}},
			{Chunk: &llmv1.StreamChunk_ReasoningDelta{ReasoningDelta: &llmv1.ReasoningDelta{Index: 2, Text: "hmm"}}},
			{Chunk: &llmv1.StreamChunk_BlockEnd{BlockEnd: &llmv1.BlockEnd{Index: 2, Block: &llmv1.ContentBlock{
				Block: &llmv1.ContentBlock_Reasoning{Reasoning: &llmv1.ReasoningBlock{Text: "hmm"}}}}}},
		}},
		"a block start of an extension": {Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_BlockStart{BlockStart: &llmv1.BlockStart{
			Index: 1, BlockType: llmv1.BlockType_BLOCK_TYPE_EXTENSION, ExtensionType: "x.y"}}}},
		"a delta without a name":          {Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_ToolCallDelta{ToolCallDelta: &llmv1.ToolCallDelta{Index: 1, ArgumentsDelta: "{"}}}},
		"a delta with an empty name":      {Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_ToolCallDelta{ToolCallDelta: &llmv1.ToolCallDelta{Name: proto.String("")}}}},
		"a delta with a name":             {Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_ToolCallDelta{ToolCallDelta: &llmv1.ToolCallDelta{Id: "c", Name: &name}}}},
		"a block end without a block":     {Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_BlockEnd{BlockEnd: &llmv1.BlockEnd{Index: 3}}}},
		"a block end with an empty block": {Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_BlockEnd{BlockEnd: &llmv1.BlockEnd{Block: &llmv1.ContentBlock{}}}}},
		"usage with every field": {Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Usage{Usage: &llmv1.UsageChunk{Usage: &llmv1.TokenUsage{
			InputTokens: 1 << 40, OutputTokens: 5, CacheReadTokens: &read, CacheWriteTokens: &write, ReasoningTokens: &reasoning}}}}},
		"usage without usage": {Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Usage{Usage: &llmv1.UsageChunk{}}}},
		"max tokens with replay state": {Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Finish{Finish: &llmv1.FinishChunk{
			Reason: &llmv1.FinishReason{Kind: &llmv1.FinishReason_MaxTokens{MaxTokens: &llmv1.FinishMaxTokens{}}}, ReplayState: &replay}}}},
		"a finish without a reason": {Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Finish{Finish: &llmv1.FinishChunk{}}}},
		"an empty reason":           {Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Finish{Finish: &llmv1.FinishChunk{Reason: &llmv1.FinishReason{}}}}},
	}
}

// TestDecodeResponse: every common response decodes to what proto.Unmarshal
// makes, each chunk in one allocation (plus the strings' one and the chunk
// slice's); anything else is declined, for proto.Unmarshal to decode.
func TestDecodeResponse(t *testing.T) {
	for name, resp := range decodeCases() {
		t.Run(name, func(t *testing.T) {
			b, err := proto.Marshal(resp)
			if err != nil {
				t.Fatal(err)
			}
			var got llmv1.GenerateResponse
			if !decodeResponse(b, &got) {
				t.Fatal("declined")
			}
			if !proto.Equal(&got, resp) {
				t.Fatalf("got %v\nwant %v", &got, resp)
			}
			want := float64(len(resp.GetChunks())) + 2
			if resp.GetChunk() != nil {
				want++
			}
			if n := testing.AllocsPerRun(20, func() { decodeResponse(b, &got) }); n > want {
				t.Errorf("%v allocations, want at most %v", n, want)
			}
		})
	}
	for name, b := range declinedCases(t) {
		var got llmv1.GenerateResponse
		if decodeResponse(b, &got) {
			t.Errorf("%s: decoded (%v)", name, &got)
		}
	}
}

// declinedCases are encoded responses decodeResponse declines (proto.Unmarshal
// decodes them, or refuses them).
func declinedCases(t testing.TB) map[string][]byte {
	t.Helper()
	marshal := func(resp *llmv1.GenerateResponse) []byte {
		b, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	text := marshal(&llmv1.GenerateResponse{Chunk: fakes.Text("x")[1]})
	unknown := protowire.AppendBytes(protowire.AppendTag(nil, 9, protowire.BytesType), nil)
	bytesField := func(num protowire.Number, b []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), b)
	}
	wrapChunk := func(chunk []byte) []byte { return bytesField(1, chunk) }
	delta := func(fields []byte) []byte { // a StreamChunk's text delta with these fields
		return wrapChunk(bytesField(2, fields))
	}
	textField := func(s string) []byte {
		return protowire.AppendString(protowire.AppendTag(nil, 2, protowire.BytesType), s)
	}
	stopWith := func(fields []byte) []byte { // a finish chunk whose reason is a FinishStop with these fields
		return wrapChunk(bytesField(7, bytesField(1, bytesField(1, fields))))
	}
	usageWith := func(fields []byte) []byte { // a usage chunk whose TokenUsage has these fields
		return wrapChunk(bytesField(6, bytesField(1, fields)))
	}
	return map[string][]byte{
		"an unknown field":              append(text, unknown...),
		"chunk twice":                   append(text, text...),
		"a field of a delta twice":      delta(append(textField("a"), textField("b")...)),
		"invalid UTF-8":                 delta(textField("\xff")),
		"a wire type that does not fit": delta(protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), 1)),
		"two kinds in a chunk":          wrapChunk(append(bytesField(2, nil), bytesField(3, nil)...)),
		"an extension block": marshal(&llmv1.GenerateResponse{Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_BlockEnd{BlockEnd: &llmv1.BlockEnd{
			Block: &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Extension{Extension: &llmv1.Extension{Type: "x"}}}}}}}),
		"a failure":               marshal(&llmv1.GenerateResponse{Chunk: fakes.Failure("X", "boom", 0)[0]}),
		"truncated":               text[:len(text)-1],
		"a field number above 63": delta(append(textField("a"), protowire.AppendVarint(protowire.AppendTag(nil, 64, protowire.VarintType), 1)...)),
		"a group": delta(append(textField("a"),
			protowire.AppendTag(protowire.AppendTag(nil, 9, protowire.StartGroupType), 9, protowire.EndGroupType)...)),
		"a fixed32": delta(append(textField("a"), protowire.AppendFixed32(protowire.AppendTag(nil, 9, protowire.Fixed32Type), 1)...)),
		"a block with annotations": marshal(&llmv1.GenerateResponse{Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_BlockEnd{BlockEnd: &llmv1.BlockEnd{
			Block: &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: "x"}},
				Annotations: &llmv1.ContentAnnotations{Audience: []string{"user"}}}}}}}),
		"a non-empty stop":       stopWith(protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 1)),
		"an unknown usage field": usageWith(protowire.AppendVarint(protowire.AppendTag(nil, 6, protowire.VarintType), 1)),
	}
}

// FuzzDecodeResponse: whatever decodeResponse decodes, proto.Unmarshal
// decodes to an equal message.
func FuzzDecodeResponse(f *testing.F) {
	for _, resp := range decodeCases() {
		b, err := proto.Marshal(resp)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, b := range declinedCases(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var got llmv1.GenerateResponse
		if !decodeResponse(b, &got) {
			return
		}
		var want llmv1.GenerateResponse
		if err := proto.Unmarshal(b, &want); err != nil {
			t.Fatalf("decoded what proto.Unmarshal refuses (%v): %v", err, &got)
		}
		if !proto.Equal(&got, &want) {
			t.Fatalf("got %v\nwant %v", &got, &want)
		}
	})
}

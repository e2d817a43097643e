package session

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

func chunkEvent(c *llmv1.StreamChunk) *sessionv1.SessionEvent {
	return &sessionv1.SessionEvent{Seq: 3, Time: 9, Payload: &sessionv1.SessionEvent_AssistantChunk{AssistantChunk: &sessionv1.AssistantChunk{Turn: 1, Step: 2, Chunk: c}}}
}

func TestFastPathMatchesGeneralPath(t *testing.T) {
	t.Parallel()
	withUnknown := chunkEvent(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Text: "x"}}})
	withUnknown.GetAssistantChunk().GetChunk().GetTextDelta().ProtoReflect().SetUnknown(protoreflect.RawFields{0xf8, 0x01, 0x01}) // field 31 varint 1
	tests := []struct {
		name     string
		ev       *sessionv1.SessionEvent
		fast     bool
		wantRule string
	}{
		{"text delta", chunkEvent(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Index: 2, Text: "héllo"}}}), true, ""},
		{"reasoning delta", chunkEvent(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_ReasoningDelta{ReasoningDelta: &llmv1.ReasoningDelta{Index: 1, Text: "hmm"}}}), true, ""},
		{"tool-call delta with name", chunkEvent(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_ToolCallDelta{ToolCallDelta: &llmv1.ToolCallDelta{Index: 4, Id: "c", Name: ptr("read"), ArgumentsDelta: `{"a`}}}), true, ""},
		{"tool-call delta without name", chunkEvent(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_ToolCallDelta{ToolCallDelta: &llmv1.ToolCallDelta{Id: "c", ArgumentsDelta: `"}`}}}), true, ""},
		{"invalid UTF-8 text", chunkEvent(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Text: "a\xffb"}}}), true, "not valid UTF-8"},
		{"invalid UTF-8 arguments", chunkEvent(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_ToolCallDelta{ToolCallDelta: &llmv1.ToolCallDelta{ArgumentsDelta: "\xc3"}}}), true, "not valid UTF-8"},
		{"unknown fields take the general path", withUnknown, false, ""},
		{"usage chunk takes the general path", chunkEvent(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Usage{Usage: &llmv1.UsageChunk{}}}), false, ""},
		{"a batch takes the general path", func() *sessionv1.SessionEvent {
			ev := chunkEvent(nil)
			ev.GetAssistantChunk().Chunks = []*llmv1.StreamChunk{
				{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Text: "x"}}},
				{Chunk: &llmv1.StreamChunk_Usage{Usage: &llmv1.UsageChunk{}}},
			}
			return ev
		}(), false, ""},
		{"a delta with a batch after it takes the general path", func() *sessionv1.SessionEvent {
			ev := chunkEvent(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Text: "x"}}})
			ev.GetAssistantChunk().Chunks = []*llmv1.StreamChunk{{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Text: "y"}}}}
			return ev
		}(), false, ""},
		{"invalid UTF-8 in a batch's second chunk", func() *sessionv1.SessionEvent {
			ev := chunkEvent(nil)
			ev.GetAssistantChunk().Chunks = []*llmv1.StreamChunk{
				{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Text: "x"}}},
				{Chunk: &llmv1.StreamChunk_ToolCallDelta{ToolCallDelta: &llmv1.ToolCallDelta{ArgumentsDelta: "\xc3"}}},
			}
			return ev
		}(), false, "not valid UTF-8"},
		{"surface fields take the general path", func() *sessionv1.SessionEvent {
			ev := chunkEvent(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Text: "x"}}})
			ev.SurfaceOp = AppendOp()
			return ev
		}(), false, "surface_op is only allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if ac, _ := deltaChunk(tt.ev); (ac != nil) != tt.fast {
				t.Fatalf("fast path taken = %v, want %v", ac != nil, tt.fast)
			}
			clone := cloneEvent(tt.ev)
			if !proto.Equal(clone, tt.ev) {
				t.Fatalf("clone differs:\n%v\n%v", clone, tt.ev)
			}
			cloned, orig := slices.Collect(Chunks(clone.GetAssistantChunk())), slices.Collect(Chunks(tt.ev.GetAssistantChunk()))
			shared := clone == tt.ev || clone.GetAssistantChunk() == tt.ev.GetAssistantChunk() || len(cloned) != len(orig)
			for i := range min(len(cloned), len(orig)) {
				shared = shared || cloned[i] == orig[i]
			}
			if shared {
				t.Fatal("clone shares structure with the original")
			}
			rule := checkPayload(tt.ev)
			if tt.wantRule == "" && rule != "" || !strings.Contains(rule, tt.wantRule) {
				t.Fatalf("rule = %q, want %q", rule, tt.wantRule)
			}
			// The general walk agrees on the payload rules.
			if general := checkStrings(tt.ev.ProtoReflect()); tt.fast && (general == "") != (rule == "") {
				t.Fatalf("fast rule %q, general rule %q", rule, general)
			}
		})
	}
}

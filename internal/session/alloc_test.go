package session

import (
	"testing"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// TestOneAllocationConstructors: the constructors of the events every step
// logs (and the derived message of a tool result) build the very messages
// the plain literals do, each in one allocation (a loaded session keeps
// them, and each object is one more for the collector to mark).
func TestOneAllocationConstructors(t *testing.T) {
	content := []*llmv1.ContentBlock{Text("hello")}
	prov := &llmv1.AssistantProvenance{Provider: "p", Model: "m"}
	usage := &llmv1.TokenUsage{InputTokens: 3, OutputTokens: 4}
	view := &toolsv1.ToolCallView{}
	errInfo := &toolsv1.ToolErrorInfo{Code: "X"}
	seqs, one := []int64{4, 5}, []int64{7}
	resultEv := ToolResultEvent(1, 2, "c1", content, true, errInfo, 9)
	for _, tc := range []struct {
		name string
		make func() proto.Message
		want proto.Message
	}{
		{"step/start", func() proto.Message { return StepStartEvent(1, 2) },
			&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_StepStart{StepStart: &sessionv1.StepStart{Turn: 1, Step: 2}}}},
		{"step/end", func() proto.Message { return StepEndEvent(1, 2) },
			&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_StepEnd{StepEnd: &sessionv1.StepEnd{Turn: 1, Step: 2}}}},
		{"tool/call", func() proto.Message { return ToolCallEvent(1, 2, "c1", "read", `{"a":1}`, view) },
			&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_ToolCall{ToolCall: &sessionv1.ToolCall{
				Turn: 1, Step: 2, CallId: "c1", Name: "read", Arguments: `{"a":1}`, View: view}}}},
		{"tool/result", func() proto.Message { return ToolResultEvent(1, 2, "c1", content, true, errInfo, 9) },
			&sessionv1.SessionEvent{SurfaceOp: &sessionv1.SurfaceOp{Op: &sessionv1.SurfaceOp_Append{Append: &sessionv1.SurfaceAppend{}}},
				SourceEventSeqs: &sessionv1.EventSeqs{Seqs: []int64{9}},
				Payload: &sessionv1.SessionEvent_ToolResult{ToolResult: &sessionv1.ToolResult{
					Turn: 1, Step: 2, CallId: "c1", Content: content, IsError: true, Error: errInfo}}}},
		{"tool/result without a call", func() proto.Message { return ToolResultEvent(1, 2, "c1", content, false, nil, -1) },
			&sessionv1.SessionEvent{SurfaceOp: &sessionv1.SurfaceOp{Op: &sessionv1.SurfaceOp_Append{Append: &sessionv1.SurfaceAppend{}}},
				Payload: &sessionv1.SessionEvent_ToolResult{ToolResult: &sessionv1.ToolResult{Turn: 1, Step: 2, CallId: "c1", Content: content}}}},
		{"assistant/message", func() proto.Message { return AssistantMessageEvent(1, 2, content, prov, usage, seqs) },
			&sessionv1.SessionEvent{SurfaceOp: &sessionv1.SurfaceOp{Op: &sessionv1.SurfaceOp_Append{Append: &sessionv1.SurfaceAppend{}}},
				SourceEventSeqs: &sessionv1.EventSeqs{Seqs: seqs},
				Payload: &sessionv1.SessionEvent_AssistantMessage{AssistantMessage: &sessionv1.AssistantMessage{
					Turn: 1, Step: 2, Content: content, Provenance: prov, Usage: usage}}}},
		{"assistant/message of one response", func() proto.Message { return AssistantMessageEvent(1, 2, content, prov, usage, one) },
			&sessionv1.SessionEvent{SurfaceOp: &sessionv1.SurfaceOp{Op: &sessionv1.SurfaceOp_Append{Append: &sessionv1.SurfaceAppend{}}},
				SourceEventSeqs: &sessionv1.EventSeqs{Seqs: []int64{7}},
				Payload: &sessionv1.SessionEvent_AssistantMessage{AssistantMessage: &sessionv1.AssistantMessage{
					Turn: 1, Step: 2, Content: content, Provenance: prov, Usage: usage}}}},
		{"a tool result's message", func() proto.Message { return deriveEventMessage(resultEv) },
			&llmv1.Message{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{{Block: &llmv1.ContentBlock_ToolResult{
				ToolResult: &llmv1.ToolResultBlock{ToolCallId: "c1", Content: content, IsError: true}}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.make(); !proto.Equal(got, tc.want) {
				t.Fatalf("got %v\nwant %v", got, tc.want)
			}
			if n := testing.AllocsPerRun(20, func() { _ = tc.make() }); n != 1 {
				t.Errorf("%v allocations, want 1", n)
			}
		})
	}
	// One seq is copied in: the caller's slice (the loop's, with room for
	// a streamed step's many responses) is not kept by the event.
	if got := AssistantMessageEvent(1, 2, nil, nil, nil, one).GetSourceEventSeqs().GetSeqs(); &got[0] == &one[0] {
		t.Error("the event keeps the caller's seqs slice")
	}
}

package session

import (
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// The hot path of a session log is the assistant/chunk carrying one text,
// reasoning or tool-call delta: there is one per streamed token group, so
// they are most of a log. Cloning and checking them by hand avoids the
// protobuf runtime's reflective merge and walk; anything unusual (unknown
// fields, other chunk kinds, surface fields) takes the general path.

func noUnknown(m proto.Message) bool { return len(m.ProtoReflect().GetUnknown()) == 0 }

// deltaChunk returns the chunk of a plain delta assistant/chunk event (one
// delta in `chunk`, nothing in `chunks`), or nil.
func deltaChunk(ev *sessionv1.SessionEvent) (*sessionv1.AssistantChunk, *llmv1.StreamChunk) {
	ac := ev.GetAssistantChunk()
	if ac == nil || ev.SurfaceOp != nil || ev.SourceEventSeqs != nil || ac.Chunk == nil || len(ac.Chunks) > 0 ||
		!noUnknown(ev) || !noUnknown(ac) || !noUnknown(ac.Chunk) {
		return nil, nil
	}
	switch d := ac.Chunk.Chunk.(type) {
	case *llmv1.StreamChunk_TextDelta:
		if d.TextDelta != nil && noUnknown(d.TextDelta) {
			return ac, ac.Chunk
		}
	case *llmv1.StreamChunk_ReasoningDelta:
		if d.ReasoningDelta != nil && noUnknown(d.ReasoningDelta) {
			return ac, ac.Chunk
		}
	case *llmv1.StreamChunk_ToolCallDelta:
		if d.ToolCallDelta != nil && noUnknown(d.ToolCallDelta) {
			return ac, ac.Chunk
		}
	}
	return nil, nil
}

// cloneEvent deep-copies an event, by hand for a plain delta chunk.
func cloneEvent(ev *sessionv1.SessionEvent) *sessionv1.SessionEvent {
	clone, _ := cloneAndCheck(ev)
	return clone
}

// cloneAndCheck deep-copies an event and applies checkContent to it,
// recognising a plain delta chunk once for both.
func cloneAndCheck(ev *sessionv1.SessionEvent) (*sessionv1.SessionEvent, string) {
	ac, c := deltaChunk(ev)
	if ac == nil {
		clone := proto.CloneOf(ev)
		return clone, checkEvent(clone)
	}
	rule := checkDelta(c)
	var chunk *llmv1.StreamChunk
	switch d := c.Chunk.(type) {
	case *llmv1.StreamChunk_TextDelta:
		chunk = &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Index: d.TextDelta.Index, Text: d.TextDelta.Text}}}
	case *llmv1.StreamChunk_ReasoningDelta:
		chunk = &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_ReasoningDelta{ReasoningDelta: &llmv1.ReasoningDelta{Index: d.ReasoningDelta.Index, Text: d.ReasoningDelta.Text}}}
	case *llmv1.StreamChunk_ToolCallDelta:
		t := d.ToolCallDelta
		td := &llmv1.ToolCallDelta{Index: t.Index, Id: t.Id, ArgumentsDelta: t.ArgumentsDelta}
		if t.Name != nil {
			name := *t.Name
			td.Name = &name
		}
		chunk = &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_ToolCallDelta{ToolCallDelta: td}}
	}
	return &sessionv1.SessionEvent{Seq: ev.Seq, Time: ev.Time, Payload: &sessionv1.SessionEvent_AssistantChunk{
		AssistantChunk: &sessionv1.AssistantChunk{Turn: ac.Turn, Step: ac.Step, Chunk: chunk}}}, rule
}

// checkDeltaChunk applies checkPayload's rules to a plain delta chunk: only
// UTF-8 validity can fail. ok is false when ev is not one.
func checkDeltaChunk(ev *sessionv1.SessionEvent) (rule string, ok bool) {
	_, c := deltaChunk(ev)
	if c == nil {
		return "", false
	}
	return checkDelta(c), true
}

// checkDelta checks the strings of a plain delta chunk.
func checkDelta(c *llmv1.StreamChunk) string {
	var bad string
	switch d := c.Chunk.(type) {
	case *llmv1.StreamChunk_TextDelta:
		if !utf8.ValidString(d.TextDelta.Text) {
			bad = "dsh.llm.v1.TextDelta.text"
		}
	case *llmv1.StreamChunk_ReasoningDelta:
		if !utf8.ValidString(d.ReasoningDelta.Text) {
			bad = "dsh.llm.v1.ReasoningDelta.text"
		}
	case *llmv1.StreamChunk_ToolCallDelta:
		t := d.ToolCallDelta
		switch {
		case !utf8.ValidString(t.Id):
			bad = "dsh.llm.v1.ToolCallDelta.id"
		case t.Name != nil && !utf8.ValidString(*t.Name):
			bad = "dsh.llm.v1.ToolCallDelta.name"
		case !utf8.ValidString(t.ArgumentsDelta):
			bad = "dsh.llm.v1.ToolCallDelta.arguments_delta"
		}
	}
	if bad != "" {
		return bad + " is not valid UTF-8"
	}
	return ""
}

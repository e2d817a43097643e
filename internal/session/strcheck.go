package session

import (
	"encoding/json"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// The content rules (every string valid UTF-8, every raw-JSON field valid
// JSON) by direct field access for the messages a step produces: step and
// turn bounds, chunks of every kind, assistant messages, tool calls and
// results, and the content blocks they carry. checkStrings' reflective walk
// is the reference; it costs a protoreflect Range (closures, boxed values)
// per message, which profiles showed was most of Append's CPU. Any message
// not handled here (a view, a turn trigger, an image block, an extension
// kind of a oneof, ...) is checked by checkStrings itself, so the rules are
// the same on every path. TestCheckEventMatchesReflection sets every string
// field reachable from a SessionEvent, one at a time, to a bad and a good
// value and requires the same answer from both, so a field added to the
// proto later cannot slip past the fast path unchecked.

// Rules are named exactly as checkStrings names them.
func badUTF8(field string) string { return field + " is not valid UTF-8" }
func badJSON(field string) string { return field + " is not valid JSON" }

// str checks a plain string field.
func str(s, field string) string {
	if !utf8.ValidString(s) {
		return badUTF8(field)
	}
	return ""
}

// jsonStr checks a raw-JSON string field that is populated.
func jsonStr(s, field string) string {
	if !utf8.ValidString(s) {
		return badUTF8(field)
	}
	if !json.Valid([]byte(s)) {
		return badJSON(field)
	}
	return ""
}

// optJSON checks an optional raw-JSON field (checked whenever present,
// even empty, as the reflective walk does).
func optJSON(s *string, field string) string {
	if s == nil {
		return ""
	}
	return jsonStr(*s, field)
}

// reflective checks a message the fast path does not handle.
func reflective(m proto.Message) string { return checkStrings(m.ProtoReflect()) }

// checkEvent applies the content rules to an event.
func checkEvent(ev *sessionv1.SessionEvent) string {
	if r := str(ev.RequestId, "dsh.session.v1.SessionEvent.request_id"); r != "" {
		return r
	}
	// surface_op and source_event_seqs hold no strings.
	switch p := ev.Payload.(type) {
	case nil:
		return ""
	case *sessionv1.SessionEvent_StepStart, *sessionv1.SessionEvent_StepEnd:
		return ""
	case *sessionv1.SessionEvent_TurnEnd:
		if r := p.TurnEnd.GetReason(); r != nil {
			if _, done := r.Kind.(*sessionv1.TurnEndReason_Completed); !done {
				return reflective(r)
			}
		}
		return ""
	case *sessionv1.SessionEvent_UserMessage:
		m := p.UserMessage
		if m == nil {
			return ""
		}
		if r := checkBlocks(m.Content); r != "" {
			return r
		}
		if r := checkSource(m.Source); r != "" {
			return r
		}
		if m.Envelope != nil {
			return reflective(m.Envelope)
		}
		return ""
	case *sessionv1.SessionEvent_RequestHeader:
		h := p.RequestHeader.GetHeader()
		if h == nil {
			return ""
		}
		return checkHeader(h)
	case *sessionv1.SessionEvent_AssistantChunk:
		for c := range Chunks(p.AssistantChunk) {
			if r := checkStreamChunk(c); r != "" {
				return r
			}
		}
		return ""
	case *sessionv1.SessionEvent_AssistantMessage:
		m := p.AssistantMessage
		if m == nil {
			return ""
		}
		if r := checkBlocks(m.Content); r != "" {
			return r
		}
		// usage holds no strings.
		return checkProvenance(m.Provenance)
	case *sessionv1.SessionEvent_ToolCall:
		c := p.ToolCall
		if c == nil {
			return ""
		}
		switch {
		case !utf8.ValidString(c.CallId):
			return badUTF8("dsh.session.v1.ToolCall.call_id")
		case !utf8.ValidString(c.Name):
			return badUTF8("dsh.session.v1.ToolCall.name")
		case !utf8.ValidString(c.Arguments):
			return badUTF8("dsh.session.v1.ToolCall.arguments")
		case c.View != nil:
			return checkCallView(c.View)
		}
		return ""
	case *sessionv1.SessionEvent_ToolResult:
		t := p.ToolResult
		if t == nil {
			return ""
		}
		if r := str(t.CallId, "dsh.session.v1.ToolResult.call_id"); r != "" {
			return r
		}
		if r := checkBlocks(t.Content); r != "" {
			return r
		}
		if e := t.Error; e != nil {
			if r := str(e.Name, "dsh.tools.v1.ToolErrorInfo.name"); r != "" {
				return r
			}
			if r := str(e.Code, "dsh.tools.v1.ToolErrorInfo.code"); r != "" {
				return r
			}
		}
		if r := optJSON(t.Meta, "dsh.session.v1.ToolResult.meta"); r != "" {
			return r
		}
		if t.View != nil {
			return checkResultView(t.View)
		}
		return ""
	}
	return reflective(ev)
}

// checkCallView checks a call view: directly the generic card (the card
// of every built-in tool's call), by the reflective walk any other.
func checkCallView(v *toolsv1.ToolCallView) string {
	k, ok := v.Card.(*toolsv1.ToolCallView_Generic)
	if !ok || k.Generic == nil {
		return reflective(v)
	}
	g := k.Generic
	if r := str(g.Title, "dsh.tools.v1.GenericCallView.title"); r != "" {
		return r
	}
	if r := str(g.RawInput, "dsh.tools.v1.GenericCallView.raw_input"); r != "" {
		return r
	}
	if r := checkBlocks(g.Content); r != "" {
		return r
	}
	for _, l := range g.Locations {
		if r := str(l.GetPath(), "dsh.tools.v1.FileLocation.path"); r != "" {
			return r
		}
	}
	return ""
}

// checkResultView checks a result view: directly the generic card, by the
// reflective walk any other.
func checkResultView(v *toolsv1.ToolResultView) string {
	k, ok := v.Card.(*toolsv1.ToolResultView_Generic)
	if !ok || k.Generic == nil {
		return reflective(v)
	}
	if r := str(k.Generic.Title, "dsh.tools.v1.GenericResultView.title"); r != "" {
		return r
	}
	return checkBlocks(k.Generic.Content)
}

func checkSource(s *llmv1.MessageSource) string {
	switch k := s.GetKind().(type) {
	case nil, *llmv1.MessageSource_User:
		return ""
	case *llmv1.MessageSource_Plugin:
		return str(k.Plugin.GetPlugin(), "dsh.llm.v1.PluginSource.plugin")
	}
	return reflective(s)
}

func checkHeader(h *sessionv1.EpochHeader) string {
	if c := h.Config; c != nil {
		if r := str(c.Provider, "dsh.llm.v1.LlmCallConfig.provider"); r != "" {
			return r
		}
		if r := str(c.Model, "dsh.llm.v1.LlmCallConfig.model"); r != "" {
			return r
		}
		for _, st := range c.Stop {
			if r := str(st, "dsh.llm.v1.LlmCallConfig.stop"); r != "" {
				return r
			}
		}
	}
	if h.System != nil {
		if r := str(*h.System, "dsh.session.v1.EpochHeader.system"); r != "" {
			return r
		}
	}
	for _, t := range h.Tools {
		if t == nil {
			continue
		}
		if r := str(t.Name, "dsh.llm.v1.ToolSchema.name"); r != "" {
			return r
		}
		if r := str(t.Description, "dsh.llm.v1.ToolSchema.description"); r != "" {
			return r
		}
		if t.Parameters != "" {
			if r := jsonStr(t.Parameters, "dsh.llm.v1.ToolSchema.parameters"); r != "" {
				return r
			}
		}
	}
	for _, m := range h.MessagePrefix {
		if m == nil {
			continue
		}
		if r := checkBlocks(m.Content); r != "" {
			return r
		}
		if r := checkProvenance(m.Provenance); r != "" {
			return r
		}
	}
	return ""
}

func checkProvenance(p *llmv1.AssistantProvenance) string {
	if p == nil {
		return ""
	}
	if r := str(p.Provider, "dsh.llm.v1.AssistantProvenance.provider"); r != "" {
		return r
	}
	if r := str(p.Model, "dsh.llm.v1.AssistantProvenance.model"); r != "" {
		return r
	}
	return optJSON(p.ReplayState, "dsh.llm.v1.AssistantProvenance.replay_state")
}

func checkStreamChunk(c *llmv1.StreamChunk) string {
	switch k := c.Chunk.(type) {
	case nil:
		return ""
	case *llmv1.StreamChunk_TextDelta:
		if k.TextDelta == nil {
			return ""
		}
		return str(k.TextDelta.Text, "dsh.llm.v1.TextDelta.text")
	case *llmv1.StreamChunk_ReasoningDelta:
		if k.ReasoningDelta == nil {
			return ""
		}
		return str(k.ReasoningDelta.Text, "dsh.llm.v1.ReasoningDelta.text")
	case *llmv1.StreamChunk_ToolCallDelta:
		if k.ToolCallDelta == nil {
			return ""
		}
		return checkDelta(c)
	case *llmv1.StreamChunk_Usage:
		return "" // token counts only
	case *llmv1.StreamChunk_BlockStart:
		if k.BlockStart == nil {
			return ""
		}
		return str(k.BlockStart.ExtensionType, "dsh.llm.v1.BlockStart.extension_type")
	case *llmv1.StreamChunk_BlockEnd:
		if k.BlockEnd == nil {
			return ""
		}
		return checkBlock(k.BlockEnd.Block)
	case *llmv1.StreamChunk_Finish:
		f := k.Finish
		if f == nil {
			return ""
		}
		if r := optJSON(f.ReplayState, "dsh.llm.v1.FinishChunk.replay_state"); r != "" {
			return r
		}
		switch f.GetReason().GetKind().(type) {
		case nil, *llmv1.FinishReason_Stop, *llmv1.FinishReason_ToolCalls, *llmv1.FinishReason_MaxTokens:
			return ""
		}
		return reflective(f.Reason)
	}
	return reflective(c)
}

func checkBlocks(bs []*llmv1.ContentBlock) string {
	for _, b := range bs {
		if r := checkBlock(b); r != "" {
			return r
		}
	}
	return ""
}

func checkBlock(b *llmv1.ContentBlock) string {
	if b == nil {
		return ""
	}
	if b.Annotations != nil {
		if r := reflective(b.Annotations); r != "" {
			return r
		}
	}
	switch k := b.Block.(type) {
	case nil:
		return ""
	case *llmv1.ContentBlock_Text:
		if k.Text == nil {
			return ""
		}
		return str(k.Text.Text, "dsh.llm.v1.TextBlock.text")
	case *llmv1.ContentBlock_Reasoning:
		if k.Reasoning == nil {
			return ""
		}
		return str(k.Reasoning.Text, "dsh.llm.v1.ReasoningBlock.text")
	case *llmv1.ContentBlock_ToolCall:
		t := k.ToolCall
		if t == nil {
			return ""
		}
		switch {
		case !utf8.ValidString(t.Id):
			return badUTF8("dsh.llm.v1.ToolCallBlock.id")
		case !utf8.ValidString(t.Name):
			return badUTF8("dsh.llm.v1.ToolCallBlock.name")
		case !utf8.ValidString(t.Arguments):
			return badUTF8("dsh.llm.v1.ToolCallBlock.arguments")
		}
		return ""
	case *llmv1.ContentBlock_ToolResult:
		t := k.ToolResult
		if t == nil {
			return ""
		}
		if r := str(t.ToolCallId, "dsh.llm.v1.ToolResultBlock.tool_call_id"); r != "" {
			return r
		}
		return checkBlocks(t.Content)
	}
	return reflective(b)
}

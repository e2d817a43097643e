package loop_test

import (
	"fmt"
	"strings"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
)

// render is the stable golden form of a log: one "seq type key-fields" line
// per event.
func render(events []*sessionv1.SessionEvent) string {
	var b strings.Builder
	for _, ev := range events {
		op := ""
		if r := ev.GetSurfaceOp().GetReplace(); r != nil {
			op = fmt.Sprintf(" replace=%d..%d", r.GetStart(), r.GetEnd())
		}
		fmt.Fprintf(&b, "%d %s %s%s\n", ev.GetSeq(), session.TypeName(ev), fields(ev), op)
	}
	return b.String()
}

func q(s string) string {
	if len(s) > 60 {
		s = s[:57] + "..."
	}
	return fmt.Sprintf("%q", s)
}

func source(s *llmv1.MessageSource) string {
	switch k := s.GetKind().(type) {
	case *llmv1.MessageSource_User:
		return "user"
	case *llmv1.MessageSource_Plugin:
		return "plugin:" + k.Plugin.GetPlugin()
	case *llmv1.MessageSource_Agent:
		return "agent:" + k.Agent.GetSessionId()
	case *llmv1.MessageSource_Extension:
		return "ext:" + k.Extension.GetType()
	}
	return "none"
}

func blocks(bs []*llmv1.ContentBlock) string {
	var parts []string
	for _, b := range bs {
		switch {
		case b.GetText() != nil:
			parts = append(parts, "text:"+q(b.GetText().GetText()))
		case b.GetReasoning() != nil:
			parts = append(parts, "reasoning:"+q(b.GetReasoning().GetText()))
		case b.GetToolCall() != nil:
			tc := b.GetToolCall()
			parts = append(parts, fmt.Sprintf("tool-call:%s:%s:%s", tc.GetId(), tc.GetName(), tc.GetArguments()))
		default:
			parts = append(parts, "other")
		}
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func chunk(c *llmv1.StreamChunk) string {
	switch k := c.GetChunk().(type) {
	case *llmv1.StreamChunk_BlockStart:
		return fmt.Sprintf("block-start#%d %s", k.BlockStart.GetIndex(), strings.TrimPrefix(k.BlockStart.GetBlockType().String(), "BLOCK_TYPE_"))
	case *llmv1.StreamChunk_TextDelta:
		return fmt.Sprintf("text-delta#%d %s", k.TextDelta.GetIndex(), q(k.TextDelta.GetText()))
	case *llmv1.StreamChunk_ReasoningDelta:
		return fmt.Sprintf("reasoning-delta#%d %s", k.ReasoningDelta.GetIndex(), q(k.ReasoningDelta.GetText()))
	case *llmv1.StreamChunk_ToolCallDelta:
		return fmt.Sprintf("tool-call-delta#%d %s %s", k.ToolCallDelta.GetIndex(), k.ToolCallDelta.GetId(), k.ToolCallDelta.GetArgumentsDelta())
	case *llmv1.StreamChunk_BlockEnd:
		return fmt.Sprintf("block-end#%d", k.BlockEnd.GetIndex())
	case *llmv1.StreamChunk_Usage:
		return fmt.Sprintf("usage %d/%d", k.Usage.GetUsage().GetInputTokens(), k.Usage.GetUsage().GetOutputTokens())
	case *llmv1.StreamChunk_Finish:
		return "finish " + finish(k.Finish.GetReason())
	}
	return "?"
}

func finish(r *llmv1.FinishReason) string {
	switch k := r.GetKind().(type) {
	case *llmv1.FinishReason_Stop:
		return "stop"
	case *llmv1.FinishReason_ToolCalls:
		return "tool-calls"
	case *llmv1.FinishReason_MaxTokens:
		return "max-tokens"
	case *llmv1.FinishReason_Error:
		return "error " + k.Error.GetFailure().GetCode()
	case *llmv1.FinishReason_Aborted:
		return "aborted " + k.Aborted.GetFailure().GetCode()
	}
	return "other"
}

func reason(r *sessionv1.TurnEndReason) string {
	switch k := r.GetKind().(type) {
	case *sessionv1.TurnEndReason_Completed:
		return "completed"
	case *sessionv1.TurnEndReason_Aborted:
		return "aborted"
	case *sessionv1.TurnEndReason_Disposed:
		return "disposed"
	case *sessionv1.TurnEndReason_MaxTokens:
		return "max-tokens"
	case *sessionv1.TurnEndReason_Interrupted:
		return "interrupted"
	case *sessionv1.TurnEndReason_Rejected:
		return "rejected " + q(k.Rejected.GetReason())
	case *sessionv1.TurnEndReason_Error:
		e := k.Error
		if e.GetFailure() != nil {
			return fmt.Sprintf("error step=%d failure=%s %s", e.GetStep(), e.GetFailure().GetCode(), q(e.GetFailure().GetMessage()))
		}
		return fmt.Sprintf("error step=%d code=%s %s", e.GetStep(), e.GetCode(), q(e.GetMessage()))
	}
	return "other"
}

func seqs(s *sessionv1.EventSeqs) string {
	if s == nil {
		return "-"
	}
	return fmt.Sprint(s.GetSeqs())
}

func fields(ev *sessionv1.SessionEvent) string {
	switch p := ev.GetPayload().(type) {
	case *sessionv1.SessionEvent_TurnStart:
		tr := p.TurnStart.GetTrigger()
		kind := "message(" + source(tr.GetMessage().GetSource()) + ")"
		if tr.GetInjection() != nil {
			kind = "injection(" + source(tr.GetInjection().GetSource()) + ")"
		}
		if tr.GetExtension() != nil {
			kind = "ext:" + tr.GetExtension().GetType()
		}
		return fmt.Sprintf("turn=%d trigger=%s", p.TurnStart.GetTurn(), kind)
	case *sessionv1.SessionEvent_TurnEnd:
		return fmt.Sprintf("turn=%d reason=%s", p.TurnEnd.GetTurn(), reason(p.TurnEnd.GetReason()))
	case *sessionv1.SessionEvent_StepStart:
		return fmt.Sprintf("%d/%d", p.StepStart.GetTurn(), p.StepStart.GetStep())
	case *sessionv1.SessionEvent_StepEnd:
		return fmt.Sprintf("%d/%d", p.StepEnd.GetTurn(), p.StepEnd.GetStep())
	case *sessionv1.SessionEvent_UserMessage:
		s := fmt.Sprintf("%s %s", source(p.UserMessage.GetSource()), blocks(p.UserMessage.GetContent()))
		if e := p.UserMessage.GetEnvelope(); e != nil {
			s += " display=" + blocks(e.GetDisplayContent())
		}
		return s
	case *sessionv1.SessionEvent_PromptBlocked:
		return fmt.Sprintf("%s %s reason=%s", source(p.PromptBlocked.GetSource()), blocks(p.PromptBlocked.GetContent()), q(p.PromptBlocked.GetReason()))
	case *sessionv1.SessionEvent_ContextMessage:
		return fmt.Sprintf("%s %s", source(p.ContextMessage.GetSource()), blocks(p.ContextMessage.GetContent()))
	case *sessionv1.SessionEvent_AssistantChunk:
		var cs []string
		for c := range session.Chunks(p.AssistantChunk) {
			cs = append(cs, chunk(c))
		}
		return fmt.Sprintf("%d/%d %s", p.AssistantChunk.GetTurn(), p.AssistantChunk.GetStep(), strings.Join(cs, " | "))
	case *sessionv1.SessionEvent_AssistantMessage:
		m := p.AssistantMessage
		u := "-"
		if m.GetUsage() != nil {
			u = fmt.Sprintf("%d/%d", m.GetUsage().GetInputTokens(), m.GetUsage().GetOutputTokens())
		}
		return fmt.Sprintf("%d/%d %s %s/%s usage=%s src=%s", m.GetTurn(), m.GetStep(), blocks(m.GetContent()),
			m.GetProvenance().GetProvider(), m.GetProvenance().GetModel(), u, seqs(ev.GetSourceEventSeqs()))
	case *sessionv1.SessionEvent_ToolCall:
		c := p.ToolCall
		view := ""
		if g := c.GetView().GetGeneric(); g != nil {
			view = fmt.Sprintf(" view=%q", g.GetTitle()+" "+g.GetRawInput())
		}
		return fmt.Sprintf("%d/%d %s %s %s%s", c.GetTurn(), c.GetStep(), c.GetCallId(), c.GetName(), c.GetArguments(), view)
	case *sessionv1.SessionEvent_ToolResult:
		r := p.ToolResult
		e := ""
		if r.GetIsError() {
			e = " error"
			if r.GetError() != nil {
				e += "=" + r.GetError().GetCode()
			}
		}
		return fmt.Sprintf("%d/%d %s%s %s src=%s", r.GetTurn(), r.GetStep(), r.GetCallId(), e, blocks(r.GetContent()), seqs(ev.GetSourceEventSeqs()))
	case *sessionv1.SessionEvent_SteeringMessage:
		return fmt.Sprintf("turn=%d %s %s", p.SteeringMessage.GetTurn(), source(p.SteeringMessage.GetSource()), blocks(p.SteeringMessage.GetContent()))
	case *sessionv1.SessionEvent_TodoWrite:
		var ts []string
		for _, t := range p.TodoWrite.GetTodos() {
			ts = append(ts, t.GetStatus().String()+":"+q(t.GetContent()))
		}
		return "[" + strings.Join(ts, " ") + "]"
	case *sessionv1.SessionEvent_RequestHeader:
		h := p.RequestHeader.GetHeader()
		var names []string
		for _, t := range h.GetTools() {
			names = append(names, t.GetName())
		}
		return fmt.Sprintf("%s %s/%s system=%v tools=%v prefix=%d", strings.TrimPrefix(p.RequestHeader.GetReason().String(), "HEADER_REASON_"),
			h.GetConfig().GetProvider(), h.GetConfig().GetModel(), h.System != nil, names, len(h.GetMessagePrefix()))
	case *sessionv1.SessionEvent_CompactStart:
		return fmt.Sprintf("turn=%d trigger=%s", p.CompactStart.GetTurn(), strings.TrimPrefix(p.CompactStart.GetTrigger().String(), "COMPACT_TRIGGER_"))
	case *sessionv1.SessionEvent_CompactSummary:
		c := p.CompactSummary
		return fmt.Sprintf("range=%d..%d shadowed=%v tokens=%d %s/%s max=%d %s", c.GetShadowedRange().GetStart(), c.GetShadowedRange().GetEnd(),
			c.GetShadowedSeqs(), c.GetShadowedTokenCount(), c.GetProvider(), c.GetModel(), c.GetMaxTokens(), q(c.GetSummary()))
	case *sessionv1.SessionEvent_CompactEnd:
		if e := p.CompactEnd.GetError(); e != "" {
			return fmt.Sprintf("turn=%d error=%s", p.CompactEnd.GetTurn(), q(e))
		}
		return fmt.Sprintf("turn=%d", p.CompactEnd.GetTurn())
	case *sessionv1.SessionEvent_Extension:
		return p.Extension.GetJson()
	}
	return ""
}

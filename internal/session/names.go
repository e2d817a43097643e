package session

import (
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// The stable type names of the 14 core events (semantics.md §3.3). They are
// the names used in logs, NATS headers and JSON. A plugin event's type name is
// its extension's type.
const (
	TypeTurnStart        = "turn/start"
	TypeTurnEnd          = "turn/end"
	TypeStepStart        = "step/start"
	TypeStepEnd          = "step/end"
	TypeUserMessage      = "user/message"
	TypePromptBlocked    = "prompt/blocked"
	TypeContextMessage   = "context/message"
	TypeAssistantChunk   = "assistant/chunk"
	TypeAssistantMessage = "assistant/message"
	TypeToolCall         = "tool/call"
	TypeToolResult       = "tool/result"
	TypeSteeringMessage  = "steering/message"
	TypeTodoWrite        = "todo/write"
	TypeRequestHeader    = "request/header"
)

// The stable type names of the typed log-only events added in the second
// part (design round2.md §2, §3): approvals, questions and the session's
// mutable settings.
const (
	TypeApprovalAsked    = "approval/asked"
	TypeApprovalDecided  = "approval/decided"
	TypeQuestionAsked    = "question/asked"
	TypeQuestionAnswered = "question/answered"
	TypeSandboxMode      = "sandbox/mode"
	TypeApprovalPolicy   = "approval/policy"
	TypeModelChanged     = "session/model"
	TypeSessionTitle     = "session/title"
)

// The stable type names of the subagent events (semantics.md §7.7): log-only,
// inside the delegating parent's open turn, paired per child.
const (
	TypeSubagentStart = "subagent/start"
	TypeSubagentEnd   = "subagent/end"
)

// The stable type names of the compaction events (semantics.md §7.6):
// log-only, inside an open turn; compact/start takes the compaction lock and
// compact/end releases it.
const (
	TypeCompactStart   = "compact/start"
	TypeCompactSummary = "compact/summary"
	TypeCompactEnd     = "compact/end"
)

// Error names and codes of the synthetic tool results written by crash
// repair (semantics.md §3.11).
const (
	ToolOutcomeUnknownError = "ToolOutcomeUnknownError"
	ToolOutcomeUnknownCode  = "TOOL_OUTCOME_UNKNOWN"
	ToolNotStartedError     = "ToolNotStartedError"
	ToolNotStartedCode      = "TOOL_NOT_STARTED"
)

// coreTypes lists the core type names; an extension event may not reuse one,
// nor the legacy delta header type.
var coreTypes = map[string]bool{
	TypeTurnStart: true, TypeTurnEnd: true, TypeStepStart: true, TypeStepEnd: true,
	TypeUserMessage: true, TypePromptBlocked: true, TypeContextMessage: true,
	TypeAssistantChunk: true, TypeAssistantMessage: true, TypeToolCall: true,
	TypeToolResult: true, TypeSteeringMessage: true, TypeTodoWrite: true,
	TypeRequestHeader: true, "request/header-delta": true,
	TypeApprovalAsked: true, TypeApprovalDecided: true, TypeQuestionAsked: true,
	TypeQuestionAnswered: true, TypeSandboxMode: true, TypeApprovalPolicy: true,
	TypeModelChanged: true, TypeSessionTitle: true,
	TypeSubagentStart: true, TypeSubagentEnd: true,
	TypeCompactStart: true, TypeCompactSummary: true, TypeCompactEnd: true,
}

// TypeName returns the event's stable type name ("turn/start", ...), the
// extension's type for a plugin event, or "" when no payload is set.
func TypeName(ev *sessionv1.SessionEvent) string {
	switch p := ev.GetPayload().(type) {
	case *sessionv1.SessionEvent_TurnStart:
		return TypeTurnStart
	case *sessionv1.SessionEvent_TurnEnd:
		return TypeTurnEnd
	case *sessionv1.SessionEvent_StepStart:
		return TypeStepStart
	case *sessionv1.SessionEvent_StepEnd:
		return TypeStepEnd
	case *sessionv1.SessionEvent_UserMessage:
		return TypeUserMessage
	case *sessionv1.SessionEvent_PromptBlocked:
		return TypePromptBlocked
	case *sessionv1.SessionEvent_ContextMessage:
		return TypeContextMessage
	case *sessionv1.SessionEvent_AssistantChunk:
		return TypeAssistantChunk
	case *sessionv1.SessionEvent_AssistantMessage:
		return TypeAssistantMessage
	case *sessionv1.SessionEvent_ToolCall:
		return TypeToolCall
	case *sessionv1.SessionEvent_ToolResult:
		return TypeToolResult
	case *sessionv1.SessionEvent_SteeringMessage:
		return TypeSteeringMessage
	case *sessionv1.SessionEvent_TodoWrite:
		return TypeTodoWrite
	case *sessionv1.SessionEvent_RequestHeader:
		return TypeRequestHeader
	case *sessionv1.SessionEvent_ApprovalAsked:
		return TypeApprovalAsked
	case *sessionv1.SessionEvent_ApprovalDecided:
		return TypeApprovalDecided
	case *sessionv1.SessionEvent_QuestionAsked:
		return TypeQuestionAsked
	case *sessionv1.SessionEvent_QuestionAnswered:
		return TypeQuestionAnswered
	case *sessionv1.SessionEvent_SandboxMode:
		return TypeSandboxMode
	case *sessionv1.SessionEvent_ApprovalPolicy:
		return TypeApprovalPolicy
	case *sessionv1.SessionEvent_ModelChanged:
		return TypeModelChanged
	case *sessionv1.SessionEvent_SessionTitle:
		return TypeSessionTitle
	case *sessionv1.SessionEvent_SubagentStart:
		return TypeSubagentStart
	case *sessionv1.SessionEvent_SubagentEnd:
		return TypeSubagentEnd
	case *sessionv1.SessionEvent_CompactStart:
		return TypeCompactStart
	case *sessionv1.SessionEvent_CompactSummary:
		return TypeCompactSummary
	case *sessionv1.SessionEvent_CompactEnd:
		return TypeCompactEnd
	case *sessionv1.SessionEvent_Extension:
		return p.Extension.GetType()
	}
	return ""
}

// IsSurfaceEvent reports whether the event is of a surface type (user/message,
// assistant/message, tool/result, context/message, steering/message): the
// only types that carry a surface op and may enter the model's history.
func IsSurfaceEvent(ev *sessionv1.SessionEvent) bool {
	switch ev.GetPayload().(type) {
	case *sessionv1.SessionEvent_UserMessage,
		*sessionv1.SessionEvent_AssistantMessage,
		*sessionv1.SessionEvent_ToolResult,
		*sessionv1.SessionEvent_ContextMessage,
		*sessionv1.SessionEvent_SteeringMessage:
		return true
	}
	return false
}

// IsSurfaceType reports whether name is a surface event type name.
func IsSurfaceType(name string) bool {
	switch name {
	case TypeUserMessage, TypeAssistantMessage, TypeToolResult, TypeContextMessage, TypeSteeringMessage:
		return true
	}
	return false
}

// Text returns a text content block.
func Text(s string) *llmv1.ContentBlock {
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}
}

// Reasoning returns a reasoning content block.
func Reasoning(s string) *llmv1.ContentBlock {
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Reasoning{Reasoning: &llmv1.ReasoningBlock{Text: s}}}
}

// ToolCallBlock returns a tool-call content block; arguments is the raw text
// the model produced.
func ToolCallBlock(id, name, arguments string) *llmv1.ContentBlock {
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_ToolCall{ToolCall: &llmv1.ToolCallBlock{Id: id, Name: name, Arguments: arguments}}}
}

// ToolResultBlock returns a tool-result content block.
func ToolResultBlock(callID string, content []*llmv1.ContentBlock, isError bool) *llmv1.ContentBlock {
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_ToolResult{ToolResult: &llmv1.ToolResultBlock{ToolCallId: callID, Content: content, IsError: isError}}}
}

// ExtensionBlock returns a plugin content block; json must be valid JSON.
func ExtensionBlock(typ, json string) *llmv1.ContentBlock {
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Extension{Extension: &llmv1.Extension{Type: typ, Json: json}}}
}

// UserSource returns the "user" message source.
func UserSource() *llmv1.MessageSource {
	return &llmv1.MessageSource{Kind: &llmv1.MessageSource_User{User: &llmv1.UserSource{}}}
}

// PluginSource returns the "plugin" message source for the named plugin.
func PluginSource(name string) *llmv1.MessageSource {
	return &llmv1.MessageSource{Kind: &llmv1.MessageSource_Plugin{Plugin: &llmv1.PluginSource{Plugin: name}}}
}

// AgentSource returns the "agent" message source for the producing session.
func AgentSource(sessionID string) *llmv1.MessageSource {
	return &llmv1.MessageSource{Kind: &llmv1.MessageSource_Agent{Agent: &llmv1.AgentSource{SessionId: sessionID}}}
}

// AppendOp returns the surface op "append".
func AppendOp() *sessionv1.SurfaceOp {
	// Its three messages in one allocation (every surface event has one).
	return new(appendOp).init()
}

// appendOp is the three messages of an append surface op, for one
// allocation; a constructor that makes its event in one allocation
// embeds it.
type appendOp struct {
	op sessionv1.SurfaceOp
	w  sessionv1.SurfaceOp_Append
	a  sessionv1.SurfaceAppend
}

func (o *appendOp) init() *sessionv1.SurfaceOp {
	o.w.Append = &o.a
	o.op.Op = &o.w
	return &o.op
}

// oneSeq is a source-seqs list of one seq with its backing array, for one
// allocation; a constructor that makes its event in one allocation embeds
// it.
type oneSeq struct {
	s   sessionv1.EventSeqs
	one [1]int64
}

func (o *oneSeq) init(seq int64) *sessionv1.EventSeqs {
	o.one[0] = seq
	o.s.Seqs = o.one[:]
	return &o.s
}

// ReplaceOp returns the surface op replacing the inclusive positional range
// [start, end] of the current surface.
func ReplaceOp(start, end int64) *sessionv1.SurfaceOp {
	return &sessionv1.SurfaceOp{Op: &sessionv1.SurfaceOp_Replace{Replace: &sessionv1.SurfaceReplace{Start: start, End: end}}}
}

// Seqs returns a present source-event-seq list (Seqs() is a present, empty
// list, which differs from an absent one).
func Seqs(seqs ...int64) *sessionv1.EventSeqs {
	return &sessionv1.EventSeqs{Seqs: seqs}
}

// MessageTrigger returns the "message" turn trigger.
func MessageTrigger(src *llmv1.MessageSource) *sessionv1.TurnTrigger {
	return &sessionv1.TurnTrigger{Kind: &sessionv1.TurnTrigger_Message{Message: &sessionv1.TriggerMessage{Source: src}}}
}

// InjectionTrigger returns the "injection" turn trigger.
func InjectionTrigger(src *llmv1.MessageSource) *sessionv1.TurnTrigger {
	return &sessionv1.TurnTrigger{Kind: &sessionv1.TurnTrigger_Injection{Injection: &sessionv1.TriggerInjection{Source: src}}}
}

// TurnStartEvent returns a turn/start event (seq and time unset).
func TurnStartEvent(turn int32, trigger *sessionv1.TurnTrigger) *sessionv1.SessionEvent {
	return &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_TurnStart{TurnStart: &sessionv1.TurnStart{Turn: turn, Trigger: trigger}}}
}

// TurnEndEvent returns a turn/end event (seq and time unset).
func TurnEndEvent(turn int32, reason *sessionv1.TurnEndReason) *sessionv1.SessionEvent {
	return &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_TurnEnd{TurnEnd: &sessionv1.TurnEnd{Turn: turn, Reason: reason}}}
}

// StepStartEvent returns a step/start event (seq and time unset).
// The event, its payload wrapper and the StepStart are made in one
// allocation (as for the other events every step logs: a session's
// events stay in memory while it is loaded, and each object of them is
// one more for the collector to mark).
func StepStartEvent(turn, step int32) *sessionv1.SessionEvent {
	e := &struct {
		ev sessionv1.SessionEvent
		p  sessionv1.SessionEvent_StepStart
		s  sessionv1.StepStart
	}{}
	e.s.Turn, e.s.Step = turn, step
	e.p.StepStart = &e.s
	e.ev.Payload = &e.p
	return &e.ev
}

// StepEndEvent returns a step/end event (seq and time unset).
// Like StepStartEvent, it is one allocation.
func StepEndEvent(turn, step int32) *sessionv1.SessionEvent {
	e := &struct {
		ev sessionv1.SessionEvent
		p  sessionv1.SessionEvent_StepEnd
		s  sessionv1.StepEnd
	}{}
	e.s.Turn, e.s.Step = turn, step
	e.p.StepEnd = &e.s
	e.ev.Payload = &e.p
	return &e.ev
}

// UserMessageEvent returns a user/message event appended to the surface.
func UserMessageEvent(content []*llmv1.ContentBlock, src *llmv1.MessageSource) *sessionv1.SessionEvent {
	return &sessionv1.SessionEvent{
		SurfaceOp: AppendOp(),
		Payload:   &sessionv1.SessionEvent_UserMessage{UserMessage: &sessionv1.UserMessage{Content: content, Source: src}},
	}
}

// ContextMessageEvent returns a context/message event appended to the surface.
func ContextMessageEvent(content []*llmv1.ContentBlock, src *llmv1.MessageSource) *sessionv1.SessionEvent {
	return &sessionv1.SessionEvent{
		SurfaceOp: AppendOp(),
		Payload:   &sessionv1.SessionEvent_ContextMessage{ContextMessage: &sessionv1.ContextMessage{Content: content, Source: src}},
	}
}

// ToolResultEvent returns a tool/result event appended to the surface; when
// callSeq >= 0 it becomes the single source event seq (the tool/call's seq).
func ToolResultEvent(turn, step int32, callID string, content []*llmv1.ContentBlock, isError bool, errInfo *toolsv1.ToolErrorInfo, callSeq int64) *sessionv1.SessionEvent {
	// The event with its surface op, payload and source seqs in one
	// allocation.
	e := &struct {
		ev  sessionv1.SessionEvent
		op  appendOp
		p   sessionv1.SessionEvent_ToolResult
		r   sessionv1.ToolResult
		src oneSeq
	}{}
	e.r.Turn, e.r.Step, e.r.CallId, e.r.Content, e.r.IsError, e.r.Error = turn, step, callID, content, isError, errInfo
	e.p.ToolResult = &e.r
	e.ev.SurfaceOp, e.ev.Payload = e.op.init(), &e.p
	if callSeq >= 0 {
		e.ev.SourceEventSeqs = e.src.init(callSeq)
	}
	return &e.ev
}

// AssistantMessageEvent returns an assistant/message event appended to the
// surface, naming its chunk events in source_event_seqs (none: no sources);
// content, provenance, usage and seqs become the event's (one seq, a step
// answered in one gateway response, is copied in: the event is then one
// allocation, and the caller's slice, often larger than its length, is not
// kept).
func AssistantMessageEvent(turn, step int32, content []*llmv1.ContentBlock, prov *llmv1.AssistantProvenance, usage *llmv1.TokenUsage, seqs []int64) *sessionv1.SessionEvent {
	e := &struct {
		ev  sessionv1.SessionEvent
		op  appendOp
		p   sessionv1.SessionEvent_AssistantMessage
		m   sessionv1.AssistantMessage
		src oneSeq
	}{}
	e.m.Turn, e.m.Step, e.m.Content, e.m.Provenance, e.m.Usage = turn, step, content, prov, usage
	e.p.AssistantMessage = &e.m
	e.ev.SurfaceOp, e.ev.Payload = e.op.init(), &e.p
	if len(seqs) == 1 {
		e.ev.SourceEventSeqs = e.src.init(seqs[0])
	} else {
		e.src.s.Seqs = seqs
		e.ev.SourceEventSeqs = &e.src.s
	}
	return &e.ev
}

// ToolCallEvent returns a tool/call event (seq and time unset); view may be
// nil. It is one allocation.
func ToolCallEvent(turn, step int32, callID, name, args string, view *toolsv1.ToolCallView) *sessionv1.SessionEvent {
	e := &struct {
		ev sessionv1.SessionEvent
		p  sessionv1.SessionEvent_ToolCall
		c  sessionv1.ToolCall
	}{}
	e.c.Turn, e.c.Step, e.c.CallId, e.c.Name, e.c.Arguments, e.c.View = turn, step, callID, name, args, view
	e.p.ToolCall = &e.c
	e.ev.Payload = &e.p
	return &e.ev
}

// ExtensionEvent returns a plugin (log-only) event of the given type whose
// data is the JSON text json.
func ExtensionEvent(typ, json string) *sessionv1.SessionEvent {
	return &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_Extension{Extension: &llmv1.Extension{Type: typ, Json: json}}}
}

// IsAppendSurfaceEvent reports whether ev joined the surface by append (not
// by replace): the events a human transcript shows, since the surface
// deliberately hides replaced ranges (semantics.md §3.5).
func IsAppendSurfaceEvent(ev *sessionv1.SessionEvent) bool {
	return IsSurfaceEvent(ev) && ev.GetSurfaceOp().GetAppend() != nil
}

package session

import (
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// logBuilder builds event sequences tersely for tests: it assigns seq
// (contiguous from 0) and time (1000 + seq) and tracks the current turn and
// step so that callers name them only when they want to break a rule.
type logBuilder struct {
	evs        []*sessionv1.SessionEvent
	turn, step int32
}

func (b *logBuilder) add(ev *sessionv1.SessionEvent) int64 {
	ev.Seq = int64(len(b.evs))
	ev.Time = 1000 + ev.Seq
	b.evs = append(b.evs, ev)
	return ev.Seq
}

func (b *logBuilder) turnStart() int64 {
	b.turn++
	b.step = 0
	return b.add(TurnStartEvent(b.turn, MessageTrigger(UserSource())))
}

func (b *logBuilder) turnEnd() int64 { return b.add(TurnEndEvent(b.turn, completed())) }

func (b *logBuilder) stepStart() int64 {
	b.step++
	return b.add(StepStartEvent(b.turn, b.step))
}

func (b *logBuilder) stepEnd() int64 { return b.add(StepEndEvent(b.turn, b.step)) }

func (b *logBuilder) user(text string) int64 {
	return b.add(UserMessageEvent([]*llmv1.ContentBlock{Text(text)}, UserSource()))
}

func (b *logBuilder) context(text string) int64 {
	return b.add(ContextMessageEvent([]*llmv1.ContentBlock{Text(text)}, PluginSource("test")))
}

func (b *logBuilder) steering(text string) int64 {
	return b.add(&sessionv1.SessionEvent{SurfaceOp: AppendOp(), Payload: &sessionv1.SessionEvent_SteeringMessage{
		SteeringMessage: &sessionv1.SteeringMessage{Turn: b.turn, Content: []*llmv1.ContentBlock{Text(text)}, Source: UserSource()}}})
}

func (b *logBuilder) header(system string) int64 {
	return b.add(headerEvent(system, sessionv1.HeaderReason_HEADER_REASON_INITIAL))
}

func headerEvent(system string, reason sessionv1.HeaderReason) *sessionv1.SessionEvent {
	h := &sessionv1.EpochHeader{Config: &llmv1.LlmCallConfig{Provider: "scripted", Model: "m1"}}
	if system != "" {
		h.System = &system
	}
	return &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_RequestHeader{RequestHeader: &sessionv1.RequestHeader{Header: h, Reason: reason}}}
}

func (b *logBuilder) chunk(text string) int64 {
	return b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_AssistantChunk{AssistantChunk: &sessionv1.AssistantChunk{
		Turn: b.turn, Step: b.step, Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Text: text}}}}}})
}

// assistant appends an assistant/message with the given blocks, sourced from
// no chunks (a present empty list).
func (b *logBuilder) assistant(blocks ...*llmv1.ContentBlock) int64 {
	return b.add(assistantEvent(b.turn, b.step, blocks...))
}

func assistantEvent(turn, step int32, blocks ...*llmv1.ContentBlock) *sessionv1.SessionEvent {
	return &sessionv1.SessionEvent{SurfaceOp: AppendOp(), SourceEventSeqs: Seqs(), Payload: &sessionv1.SessionEvent_AssistantMessage{
		AssistantMessage: &sessionv1.AssistantMessage{Turn: turn, Step: step, Content: blocks,
			Provenance: &llmv1.AssistantProvenance{Provider: "scripted", Model: "m1"}}}}
}

func (b *logBuilder) call(id string) int64 {
	return b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_ToolCall{ToolCall: &sessionv1.ToolCall{
		Turn: b.turn, Step: b.step, CallId: id, Name: "read", Arguments: `{"path":"a"}`}}})
}

func (b *logBuilder) result(id string, callSeq int64, text string) int64 {
	return b.add(ToolResultEvent(b.turn, b.step, id, []*llmv1.ContentBlock{Text(text)}, false, nil, callSeq))
}

func (b *logBuilder) replace(ev *sessionv1.SessionEvent, start, end int64, sources ...int64) int64 {
	ev.SurfaceOp = ReplaceOp(start, end)
	ev.SourceEventSeqs = Seqs(sources...)
	return b.add(ev)
}

func completed() *sessionv1.TurnEndReason {
	return &sessionv1.TurnEndReason{Kind: &sessionv1.TurnEndReason_Completed{Completed: &sessionv1.EndCompleted{}}}
}

func interrupted() *sessionv1.TurnEndReason {
	return &sessionv1.TurnEndReason{Kind: &sessionv1.TurnEndReason_Interrupted{Interrupted: &sessionv1.EndInterrupted{}}}
}

func userMsg(texts ...string) *llmv1.Message {
	m := &llmv1.Message{Role: llmv1.Role_ROLE_USER}
	for _, t := range texts {
		m.Content = append(m.Content, Text(t))
	}
	return m
}

func assistantMsg(blocks ...*llmv1.ContentBlock) *llmv1.Message {
	return &llmv1.Message{Role: llmv1.Role_ROLE_ASSISTANT, Content: blocks,
		Provenance: &llmv1.AssistantProvenance{Provider: "scripted", Model: "m1"}}
}

func toolResultMsg(id, text string, isError bool) *llmv1.Message {
	return &llmv1.Message{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{
		ToolResultBlock(id, []*llmv1.ContentBlock{Text(text)}, isError)}}
}

var _ = toolsv1.ToolErrorInfo{}

func (b *logBuilder) asked(id string) int64 {
	return b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_ApprovalAsked{ApprovalAsked: &sessionv1.ApprovalAsked{
		Id: id, ToolName: "bash", CallId: "c1", Turn: b.turn}}})
}

func (b *logBuilder) decided(id string, outcome sessionv1.ApprovalOutcome) int64 {
	return b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_ApprovalDecided{ApprovalDecided: &sessionv1.ApprovalDecided{
		Id: id, Outcome: outcome, By: "user"}}})
}

func (b *logBuilder) question(id string) int64 {
	return b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_QuestionAsked{QuestionAsked: &sessionv1.QuestionAsked{
		Id: id, CallId: "c1", Turn: b.turn, Questions: []*sessionv1.Question{{Id: "q1", Question: "which?"}}}}})
}

func (b *logBuilder) answered(id string) int64 {
	return b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_QuestionAnswered{QuestionAnswered: &sessionv1.QuestionAnswered{
		Id: id, Answers: []*sessionv1.QuestionAnswer{{Id: "q1", Selected: []string{"a"}}}, By: "user"}}})
}

package persistencetest

import (
	"strconv"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
)

// BaseTime is the time of seq 0 in logs built by a Builder (Unix ms).
const BaseTime = 1_767_225_600_000

// Header returns a minimal valid header for id.
func Header(id string) *sessionv1.SessionHeader {
	return &sessionv1.SessionHeader{Version: 0, Id: id, CreatedAt: BaseTime}
}

// Builder builds valid session logs: it assigns seqs and times and keeps
// turn and step numbers. The zero value starts an empty log.
type Builder struct {
	events []*sessionv1.SessionEvent
	turn   int32
	step   int32
	calls  int
}

// Continue returns a Builder that continues events (a stored log): new
// events get the next seqs and the turn and step numbers carry on.
func Continue(events []*sessionv1.SessionEvent) *Builder {
	b := &Builder{events: append([]*sessionv1.SessionEvent(nil), events...)}
	for _, ev := range events {
		if ts := ev.GetTurnStart(); ts != nil {
			b.turn, b.step = ts.GetTurn(), 0
		}
		if ss := ev.GetStepStart(); ss != nil {
			b.step = ss.GetStep()
		}
	}
	return b
}

// Events returns the events built so far (shared, do not mutate).
func (b *Builder) Events() []*sessionv1.SessionEvent { return b.events }

// Len returns the number of events built so far.
func (b *Builder) Len() int64 { return int64(len(b.events)) }

// Add appends a raw event, assigning its seq and time.
func (b *Builder) Add(ev *sessionv1.SessionEvent) *sessionv1.SessionEvent {
	ev.Seq = int64(len(b.events))
	ev.Time = BaseTime + ev.Seq
	b.events = append(b.events, ev)
	return ev
}

// StartTurn appends turn/start and the prompt's user/message.
func (b *Builder) StartTurn(prompt string) {
	b.turn++
	b.step = 0
	b.Add(session.TurnStartEvent(b.turn, session.MessageTrigger(session.UserSource())))
	b.Add(session.UserMessageEvent([]*llmv1.ContentBlock{session.Text(prompt)}, session.UserSource()))
}

// StartStep appends step/start and a request/header.
func (b *Builder) StartStep() {
	b.step++
	b.Add(session.StepStartEvent(b.turn, b.step))
	b.Add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_RequestHeader{RequestHeader: &sessionv1.RequestHeader{
		Header: &sessionv1.EpochHeader{Config: &llmv1.LlmCallConfig{Provider: "scripted", Model: "m1"}},
		Reason: sessionv1.HeaderReason_HEADER_REASON_INITIAL,
	}}})
}

// Chunks appends n text-delta assistant/chunk events.
func (b *Builder) Chunks(n int, text string) {
	for range n {
		b.Add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_AssistantChunk{AssistantChunk: &sessionv1.AssistantChunk{
			Turn: b.turn, Step: b.step,
			Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Index: 0, Text: text}}},
		}}})
	}
}

// AssistantMessage appends an assistant/message whose content is the text
// (when non-empty) followed by one tool-call block per call id.
func (b *Builder) AssistantMessage(text string, callIDs ...string) {
	var content []*llmv1.ContentBlock
	if text != "" {
		content = append(content, session.Text(text))
	}
	for _, id := range callIDs {
		content = append(content, session.ToolCallBlock(id, "read_file", `{"path":"a.txt"}`))
	}
	b.Add(&sessionv1.SessionEvent{
		SurfaceOp:       session.AppendOp(),
		SourceEventSeqs: session.Seqs(),
		Payload: &sessionv1.SessionEvent_AssistantMessage{AssistantMessage: &sessionv1.AssistantMessage{
			Turn: b.turn, Step: b.step, Content: content,
			Provenance: &llmv1.AssistantProvenance{Provider: "scripted", Model: "m1"},
		}},
	})
}

// ToolCall appends a tool/call and returns its seq.
func (b *Builder) ToolCall(callID string) int64 {
	return b.Add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_ToolCall{ToolCall: &sessionv1.ToolCall{
		Turn: b.turn, Step: b.step, CallId: callID, Name: "read_file", Arguments: `{"path":"a.txt"}`,
	}}}).GetSeq()
}

// ToolResult appends a successful tool/result answering the call at callSeq.
func (b *Builder) ToolResult(callID string, callSeq int64) {
	b.Add(session.ToolResultEvent(b.turn, b.step, callID, []*llmv1.ContentBlock{session.Text("contents")}, false, nil, callSeq))
}

// EndStep appends step/end.
func (b *Builder) EndStep() { b.Add(session.StepEndEvent(b.turn, b.step)) }

// EndTurn appends turn/end {completed}.
func (b *Builder) EndTurn() {
	b.Add(session.TurnEndEvent(b.turn, &sessionv1.TurnEndReason{Kind: &sessionv1.TurnEndReason_Completed{Completed: &sessionv1.EndCompleted{}}}))
}

// CompletedTurn appends a whole turn: prompt, one step with chunks, an
// assistant message with one tool call and its result, a second step with
// the answer, and turn/end.
func (b *Builder) CompletedTurn(chunks int) {
	b.StartTurn("hello")
	b.StartStep()
	b.Chunks(chunks, "tok ")
	b.calls++
	id := "call-" + strconv.Itoa(b.calls)
	b.AssistantMessage("let me look", id)
	seq := b.ToolCall(id)
	b.ToolResult(id, seq)
	b.EndStep()
	b.StartStep()
	b.Chunks(chunks, "tok ")
	b.AssistantMessage("done")
	b.EndStep()
	b.EndTurn()
}

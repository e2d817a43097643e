package session

import (
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// Model-facing texts of the synthetic crash-repair tool results.
const (
	outcomeUnknownText = "Tool call interrupted: the session stopped while this tool call was running, so its outcome is unknown. " +
		"It may or may not have taken effect. Retry it only if it is read-only or idempotent; otherwise verify the current state first, or ask the user how to proceed."
	notStartedText = "Tool call interrupted: the session stopped before this tool call was recorded as started, so it did not run. " +
		"Retry it if it is still needed."
)

// CompactInterruptedError is the error of the compact/end crash repair
// appends for a compaction the crash interrupted.
const CompactInterruptedError = "interrupted: the session stopped during the compaction"

// RepairedBy is the "by" of a request settled by crash repair.
const RepairedBy = "repair"

// InterruptedTurnClosers returns the synthetic events that close a turn left
// open by a crash (semantics.md §3.11), or nil for a balanced or empty log.
//
// For an open turn it returns, with seqs continuing the log and the time of
// the last event: a cancelled settlement (by "repair") of every approval or
// question request still pending (a logged call whose approval was pending
// never ran, so it gets TOOL_NOT_STARTED); a compact/end releasing a
// compaction lock the crash left held; one error tool/result per tool call of the open step that no
// tool/result answered, in transcript order (TOOL_OUTCOME_UNKNOWN when the
// tool/call was logged, sourced from it; TOOL_NOT_STARTED otherwise); a
// step/end when a step is open; and turn/end {interrupted}. The log itself is
// never truncated: the caller appends the closers.
func InterruptedTurnClosers(events []*sessionv1.SessionEvent) []*sessionv1.SessionEvent {
	if len(events) == 0 {
		return nil
	}
	type pendingCall struct {
		id      string
		callSeq int64 // -1 when no tool/call was logged
	}
	var (
		turnOpen, stepOpen bool
		turn, step         int32
		pending            []pendingCall
		requests           turns // only the request and compaction bookkeeping is used
	)
	find := func(id string) int {
		for i := range pending {
			if pending[i].id == id {
				return i
			}
		}
		return -1
	}
	for _, ev := range events {
		switch ev.GetPayload().(type) {
		case *sessionv1.SessionEvent_TurnStart, *sessionv1.SessionEvent_TurnEnd,
			*sessionv1.SessionEvent_ApprovalAsked, *sessionv1.SessionEvent_QuestionAsked,
			*sessionv1.SessionEvent_ApprovalDecided, *sessionv1.SessionEvent_QuestionAnswered,
			*sessionv1.SessionEvent_CompactStart, *sessionv1.SessionEvent_CompactEnd:
			requests.apply(ev)
		}
		switch p := ev.GetPayload().(type) {
		case *sessionv1.SessionEvent_TurnStart:
			turnOpen, stepOpen, turn, step, pending = true, false, p.TurnStart.GetTurn(), 0, nil
		case *sessionv1.SessionEvent_TurnEnd:
			turnOpen, stepOpen, pending = false, false, nil
		case *sessionv1.SessionEvent_StepStart:
			stepOpen, step, pending = true, p.StepStart.GetStep(), nil
			if !turnOpen {
				turnOpen, turn = true, p.StepStart.GetTurn()
			}
		case *sessionv1.SessionEvent_StepEnd:
			stepOpen, pending = false, nil
		case *sessionv1.SessionEvent_AssistantMessage:
			for _, b := range p.AssistantMessage.GetContent() {
				if tc := b.GetToolCall(); tc != nil && find(tc.GetId()) < 0 {
					pending = append(pending, pendingCall{id: tc.GetId(), callSeq: -1})
				}
			}
		case *sessionv1.SessionEvent_ToolCall:
			if i := find(p.ToolCall.GetCallId()); i >= 0 {
				pending[i].callSeq = ev.GetSeq()
			} else {
				pending = append(pending, pendingCall{id: p.ToolCall.GetCallId(), callSeq: ev.GetSeq()})
			}
		case *sessionv1.SessionEvent_ToolResult:
			if i := find(p.ToolResult.GetCallId()); i >= 0 {
				pending = append(pending[:i], pending[i+1:]...)
			}
		}
	}
	if !turnOpen {
		return nil
	}
	last := events[len(events)-1]
	seq, now := last.GetSeq()+1, last.GetTime()
	var out []*sessionv1.SessionEvent
	add := func(ev *sessionv1.SessionEvent) {
		ev.Seq, ev.Time = seq, now
		seq++
		out = append(out, ev)
	}
	// A request pending at the crash is settled as cancelled: the repaired
	// log closes it, so nobody answers it later and it is never re-asked
	// silently (the model sees the call's interrupted result).
	for _, r := range requests.requests {
		if r.Event.GetApprovalAsked() != nil {
			add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_ApprovalDecided{ApprovalDecided: &sessionv1.ApprovalDecided{
				Id: r.ID, Outcome: sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_CANCELLED, By: RepairedBy}}})
		} else {
			add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_QuestionAnswered{QuestionAnswered: &sessionv1.QuestionAnswered{
				Id: r.ID, Unanswered: sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_CANCELLED, By: RepairedBy}}})
		}
	}
	// A compaction interrupted by the crash releases its lock. The surface
	// is whatever the log says: a checkpoint appended before the crash
	// stays (it is complete), otherwise nothing was replaced.
	if requests.compacting {
		add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_CompactEnd{CompactEnd: &sessionv1.CompactEnd{
			Turn: &turn, Error: CompactInterruptedError}}})
	}
	awaiting := map[string]bool{} // calls whose approval was pending: their bodies never ran
	for _, r := range requests.requests {
		if a := r.Event.GetApprovalAsked(); a != nil {
			awaiting[a.GetCallId()] = true
		}
	}
	for _, c := range pending {
		var ev *sessionv1.SessionEvent
		if c.callSeq >= 0 && awaiting[c.id] {
			ev = ToolResultEvent(turn, step, c.id, []*llmv1.ContentBlock{Text(notStartedText)}, true,
				&toolsv1.ToolErrorInfo{Name: ToolNotStartedError, Code: ToolNotStartedCode}, c.callSeq)
		} else if c.callSeq >= 0 {
			ev = ToolResultEvent(turn, step, c.id, []*llmv1.ContentBlock{Text(outcomeUnknownText)}, true,
				&toolsv1.ToolErrorInfo{Name: ToolOutcomeUnknownError, Code: ToolOutcomeUnknownCode}, c.callSeq)
		} else {
			ev = ToolResultEvent(turn, step, c.id, []*llmv1.ContentBlock{Text(notStartedText)}, true,
				&toolsv1.ToolErrorInfo{Name: ToolNotStartedError, Code: ToolNotStartedCode}, -1)
		}
		add(ev)
	}
	if stepOpen {
		add(StepEndEvent(turn, step))
	}
	add(TurnEndEvent(turn, &sessionv1.TurnEndReason{Kind: &sessionv1.TurnEndReason_Interrupted{Interrupted: &sessionv1.EndInterrupted{}}}))
	return out
}

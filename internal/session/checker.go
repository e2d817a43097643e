package session

import (
	"fmt"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// turns tracks the turn-enclosure invariant and the call/result trace
// (semantics.md §3.8).
type turns struct {
	lastSeq  int64
	turnOpen bool
	turn     int32
	nextTurn int32 // 0 means 1
	stepOpen bool
	step     int32
	nextStep int32
	pending  []string // tool/call ids of the open step not yet answered
	// requests are the approval and question requests of the open turn not
	// yet settled, in the order they were asked.
	requests []PendingRequest
	// asked counts every approval/asked and question/asked ever logged.
	asked int64
	// compacting: a compact/start has no compact/end yet (the compaction
	// lock of semantics.md §7.6 is held); compactSeq is its seq.
	compacting bool
	compactSeq int64
}

// PendingRequest is an approval or question request that no settling event
// answered yet: Event is its approval/asked or question/asked event.
type PendingRequest struct {
	ID    string
	Event *sessionv1.SessionEvent
}

func (t *turns) requestIndex(id string) int {
	for i, r := range t.requests {
		if r.ID == id {
			return i
		}
	}
	return -1
}

// checkRequest checks an approval/question event: asked needs a fresh
// non-empty id, a settling event needs a pending request of its own kind.
func (t *turns) checkRequest(ev *sessionv1.SessionEvent) string {
	if !t.turnOpen {
		return "no turn is open"
	}
	var id string
	var asking, approval bool
	switch p := ev.GetPayload().(type) {
	case *sessionv1.SessionEvent_ApprovalAsked:
		id, asking, approval = p.ApprovalAsked.GetId(), true, true
	case *sessionv1.SessionEvent_QuestionAsked:
		id, asking = p.QuestionAsked.GetId(), true
	case *sessionv1.SessionEvent_ApprovalDecided:
		id, approval = p.ApprovalDecided.GetId(), true
	case *sessionv1.SessionEvent_QuestionAnswered:
		id = p.QuestionAnswered.GetId()
	}
	if id == "" {
		return "a request event needs an id"
	}
	i := t.requestIndex(id)
	if asking {
		if i >= 0 {
			return fmt.Sprintf("request %q is already pending", id)
		}
		return ""
	}
	if i < 0 {
		return fmt.Sprintf("no pending request %q: a settling event must follow its request in the same turn", id)
	}
	if (t.requests[i].Event.GetApprovalAsked() != nil) != approval {
		return fmt.Sprintf("request %q is of the other kind (approval vs question)", id)
	}
	return ""
}

func (t *turns) pendingIndex(id string) int {
	for i, p := range t.pending {
		if p == id {
			return i
		}
	}
	return -1
}

func (t *turns) wantNextTurn() int32 {
	if t.nextTurn == 0 {
		return 1
	}
	return t.nextTurn
}

// check returns the rule ev breaks, or "". It does not change t.
func (t *turns) check(ev *sessionv1.SessionEvent, first bool) string {
	if !first && ev.GetSeq() <= t.lastSeq {
		return fmt.Sprintf("seq %d is not greater than the previous seq %d", ev.GetSeq(), t.lastSeq)
	}
	inStep := func(turn, step int32) string {
		switch {
		case !t.turnOpen:
			return "no turn is open"
		case turn != t.turn:
			return fmt.Sprintf("names turn %d but turn %d is open", turn, t.turn)
		case !t.stepOpen:
			return "no step is open"
		case step != t.step:
			return fmt.Sprintf("names step %d but step %d is open", step, t.step)
		}
		return ""
	}
	switch p := ev.GetPayload().(type) {
	case *sessionv1.SessionEvent_TurnStart:
		switch {
		case t.turnOpen:
			return fmt.Sprintf("turn %d is still open", t.turn)
		case p.TurnStart.GetTurn() != t.wantNextTurn():
			return fmt.Sprintf("turn %d starts but the next turn is %d", p.TurnStart.GetTurn(), t.wantNextTurn())
		}
	case *sessionv1.SessionEvent_TurnEnd:
		switch {
		case !t.turnOpen:
			return "no turn is open"
		case p.TurnEnd.GetTurn() != t.turn:
			return fmt.Sprintf("ends turn %d but turn %d is open", p.TurnEnd.GetTurn(), t.turn)
		case t.stepOpen:
			return fmt.Sprintf("step %d is still open", t.step)
		case len(t.requests) > 0:
			return fmt.Sprintf("request %q is still pending: settle it before the turn ends", t.requests[0].ID)
		case t.compacting:
			return fmt.Sprintf("the compaction started at seq %d is still running: compact/end must come before turn/end", t.compactSeq)
		}
	case *sessionv1.SessionEvent_CompactStart:
		switch {
		case !t.turnOpen:
			return "no turn is open"
		case t.compacting:
			return fmt.Sprintf("a compaction is already in progress (compact/start at seq %d)", t.compactSeq)
		case p.CompactStart.Turn != nil && p.CompactStart.GetTurn() != t.turn:
			return fmt.Sprintf("names turn %d but turn %d is open", p.CompactStart.GetTurn(), t.turn)
		}
	case *sessionv1.SessionEvent_CompactSummary:
		switch {
		case !t.turnOpen:
			return "no turn is open"
		case !t.compacting:
			return "compact/summary outside a compaction (no compact/start holds the lock)"
		}
	case *sessionv1.SessionEvent_CompactEnd:
		switch {
		case !t.turnOpen:
			return "no turn is open"
		case !t.compacting:
			return "compact/end without a compact/start"
		case p.CompactEnd.Turn != nil && p.CompactEnd.GetTurn() != t.turn:
			return fmt.Sprintf("names turn %d but turn %d is open", p.CompactEnd.GetTurn(), t.turn)
		}
	case *sessionv1.SessionEvent_ApprovalAsked, *sessionv1.SessionEvent_ApprovalDecided,
		*sessionv1.SessionEvent_QuestionAsked, *sessionv1.SessionEvent_QuestionAnswered:
		return t.checkRequest(ev)
	case *sessionv1.SessionEvent_StepStart:
		switch {
		case !t.turnOpen:
			return "no turn is open"
		case p.StepStart.GetTurn() != t.turn:
			return fmt.Sprintf("names turn %d but turn %d is open", p.StepStart.GetTurn(), t.turn)
		case t.stepOpen:
			return fmt.Sprintf("step %d is still open", t.step)
		case p.StepStart.GetStep() != t.nextStep:
			return fmt.Sprintf("step %d starts but the next step is %d", p.StepStart.GetStep(), t.nextStep)
		}
	case *sessionv1.SessionEvent_StepEnd:
		return inStep(p.StepEnd.GetTurn(), p.StepEnd.GetStep())
	case *sessionv1.SessionEvent_AssistantChunk:
		return inStep(p.AssistantChunk.GetTurn(), p.AssistantChunk.GetStep())
	case *sessionv1.SessionEvent_AssistantMessage:
		return inStep(p.AssistantMessage.GetTurn(), p.AssistantMessage.GetStep())
	case *sessionv1.SessionEvent_ToolCall:
		if r := inStep(p.ToolCall.GetTurn(), p.ToolCall.GetStep()); r != "" {
			return r
		}
		if p.ToolCall.GetCallId() == "" {
			return "a tool/call needs a call id"
		}
		if t.pendingIndex(p.ToolCall.GetCallId()) >= 0 {
			return fmt.Sprintf("call %q is already pending in this step", p.ToolCall.GetCallId())
		}
	case *sessionv1.SessionEvent_ToolResult:
		tr := p.ToolResult
		if ev.GetSurfaceOp().GetReplace() != nil {
			if !t.turnOpen {
				return "no turn is open"
			}
			return ""
		}
		if r := inStep(tr.GetTurn(), tr.GetStep()); r != "" {
			return r
		}
		if t.pendingIndex(tr.GetCallId()) < 0 && tr.GetError().GetCode() != ToolNotStartedCode {
			return fmt.Sprintf("no pending tool/call %q in this step", tr.GetCallId())
		}
	default:
		if !t.turnOpen {
			return "no turn is open"
		}
	}
	return ""
}

// apply records a checked event.
func (t *turns) apply(ev *sessionv1.SessionEvent) {
	t.lastSeq = ev.GetSeq()
	switch p := ev.GetPayload().(type) {
	case *sessionv1.SessionEvent_TurnStart:
		t.turnOpen, t.turn, t.stepOpen, t.nextStep, t.pending = true, p.TurnStart.GetTurn(), false, 1, nil
		t.requests = nil
	case *sessionv1.SessionEvent_TurnEnd:
		t.turnOpen, t.nextTurn, t.requests, t.compacting = false, t.turn+1, nil, false
	case *sessionv1.SessionEvent_CompactStart:
		t.compacting, t.compactSeq = true, ev.GetSeq()
	case *sessionv1.SessionEvent_CompactEnd:
		t.compacting = false
	case *sessionv1.SessionEvent_ApprovalAsked:
		t.asked++
		t.requests = append(t.requests[:len(t.requests):len(t.requests)], PendingRequest{ID: p.ApprovalAsked.GetId(), Event: ev})
	case *sessionv1.SessionEvent_QuestionAsked:
		t.asked++
		t.requests = append(t.requests[:len(t.requests):len(t.requests)], PendingRequest{ID: p.QuestionAsked.GetId(), Event: ev})
	case *sessionv1.SessionEvent_ApprovalDecided:
		t.settle(p.ApprovalDecided.GetId())
	case *sessionv1.SessionEvent_QuestionAnswered:
		t.settle(p.QuestionAnswered.GetId())
	case *sessionv1.SessionEvent_StepStart:
		t.stepOpen, t.step, t.pending = true, p.StepStart.GetStep(), nil
	case *sessionv1.SessionEvent_StepEnd:
		t.stepOpen, t.pending, t.nextStep = false, nil, t.step+1
	case *sessionv1.SessionEvent_ToolCall:
		t.pending = append(t.pending, p.ToolCall.GetCallId())
	case *sessionv1.SessionEvent_ToolResult:
		if ev.GetSurfaceOp().GetReplace() == nil {
			if i := t.pendingIndex(p.ToolResult.GetCallId()); i >= 0 {
				t.pending = append(t.pending[:i], t.pending[i+1:]...)
			}
		}
	}
}

// settle removes a settled request (copy on write: snapshots handed out by
// the log keep their slice).
func (t *turns) settle(id string) {
	if i := t.requestIndex(id); i >= 0 {
		rs := make([]PendingRequest, 0, len(t.requests)-1)
		t.requests = append(append(rs, t.requests[:i]...), t.requests[i+1:]...)
	}
}

// Checker checks a log event by event: the per-event rules and the surface
// rules that [Log.Append] applies (seqs contiguous from 0, surface fields,
// lossless JSON, replace ranges), the turn-enclosure invariant and the
// call/result trace (semantics.md §3.8):
//
//   - turn/start opens turn 1, 2, ... only when no turn is open;
//   - turn/end closes the open turn, with no step open;
//   - step/start opens step 1, 2, ... of the open turn, with no step open;
//   - step/end, assistant/chunk, assistant/message and tool/call name the
//     open turn and step; a tool/call's id becomes pending in its step;
//   - an appended tool/result names the open turn and step and answers a
//     pending tool/call of that step (a TOOL_NOT_STARTED repair result is
//     exempt); a replacing tool/result needs only an open turn;
//   - compact/start takes the compaction lock (none may be held), names
//     the open turn; compact/summary needs the lock; compact/end releases
//     it; turn/end needs it released;
//   - approval/asked and question/asked open a request with a fresh id;
//     approval/decided and question/answered settle a pending request of
//     their kind in the same turn; turn/end needs every request settled;
//   - every other event, plugin events included, needs an open turn.
//
// The zero value is ready. The first error is sticky. A Checker keeps a
// reference to every event it accepted; they must not be mutated.
type Checker struct {
	events []*sessionv1.SessionEvent
	surf   surface
	turns  turns
	err    error
}

// Check checks the next event and returns an [*InvariantError] naming its
// seq, its type and the broken rule.
func (c *Checker) Check(ev *sessionv1.SessionEvent) error {
	if c.err != nil {
		return c.err
	}
	if rule := c.rule(ev); rule != "" {
		// The position is the seq the event should have; it locates the
		// event even when its own seq is the problem.
		c.err = &InvariantError{Seq: int64(len(c.events)), Type: TypeName(ev), Rule: rule}
		return c.err
	}
	c.events = append(c.events, ev)
	if IsSurfaceEvent(ev) {
		c.surf.apply(ev)
	}
	c.turns.apply(ev)
	return nil
}

func (c *Checker) rule(ev *sessionv1.SessionEvent) string {
	if want := int64(len(c.events)); ev.GetSeq() != want {
		return fmt.Sprintf("seq must be %d (contiguous from 0), got %d", want, ev.GetSeq())
	}
	if r := checkPayload(ev); r != "" {
		return r
	}
	if IsSurfaceEvent(ev) {
		if r := c.surf.checkOp(ev, c.events); r != "" {
			return r
		}
	}
	return c.turns.check(ev, len(c.events) == 0)
}

// OpenTurn returns the open turn, if any.
func (c *Checker) OpenTurn() (turn int32, ok bool) { return c.turns.turn, c.turns.turnOpen }

// CheckLog checks a whole log with a [Checker] and returns the
// [*InvariantError] of the first bad event, or nil. A log whose last turn is
// still open is valid (see [InterruptedTurnClosers]).
func CheckLog(events []*sessionv1.SessionEvent) error {
	var c Checker
	for _, ev := range events {
		if err := c.Check(ev); err != nil {
			return err
		}
	}
	return nil
}

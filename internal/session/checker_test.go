package session

import (
	"errors"
	"strings"
	"testing"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

func TestCheckLog(t *testing.T) {
	t.Parallel()
	// Each case builds a log; bad is the seq of the first bad event (-1: valid).
	type tc struct {
		name  string
		build func(b *logBuilder) (bad int64)
		rule  string
	}
	valid := func(f func(b *logBuilder)) func(b *logBuilder) int64 {
		return func(b *logBuilder) int64 { f(b); return -1 }
	}
	cstart := func(b *logBuilder, turn int32) int64 {
		return b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_CompactStart{CompactStart: &sessionv1.CompactStart{Turn: &turn}}})
	}
	cend := func(b *logBuilder) int64 {
		return b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_CompactEnd{CompactEnd: &sessionv1.CompactEnd{Turn: &b.turn}}})
	}
	csummary := func(b *logBuilder) int64 {
		return b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_CompactSummary{CompactSummary: &sessionv1.CompactSummary{Summary: "s"}}})
	}
	tests := []tc{
		{name: "empty log", build: valid(func(*logBuilder) {})},
		{name: "balanced compaction", build: valid(func(b *logBuilder) {
			b.turnStart()
			u := b.user("u")
			cstart(b, 1)
			csummary(b)
			b.replace(UserMessageEvent([]*llmv1.ContentBlock{Text("sum")}, PluginSource("compact")), u, u, u)
			cend(b)
			b.turnEnd()
		})},
		{name: "second compact/start while the lock is held", rule: "already in progress", build: func(b *logBuilder) int64 {
			b.turnStart()
			cstart(b, 1)
			return cstart(b, 1)
		}},
		{name: "compact/start naming another turn", rule: "names turn 2", build: func(b *logBuilder) int64 {
			b.turnStart()
			return cstart(b, 2)
		}},
		{name: "compact/end without start", rule: "without a compact/start", build: func(b *logBuilder) int64 {
			b.turnStart()
			return cend(b)
		}},
		{name: "compact/summary outside a compaction", rule: "outside a compaction", build: func(b *logBuilder) int64 {
			b.turnStart()
			return csummary(b)
		}},
		{name: "turn/end while compacting", rule: "still running", build: func(b *logBuilder) int64 {
			b.turnStart()
			cstart(b, 1)
			return b.turnEnd()
		}},
		{name: "complete session", build: valid(func(b *logBuilder) {
			b.turnStart()
			b.user("u")
			b.stepStart()
			b.header("s")
			b.chunk("x")
			b.assistant(ToolCallBlock("c1", "read", "{}"), ToolCallBlock("c2", "read", "{}"))
			c1 := b.call("c1")
			c2 := b.call("c2")
			b.result("c2", c2, "r2") // results may commit in any order of calls
			b.result("c1", c1, "r1")
			b.context("after tools")
			b.steering("steer")
			b.stepEnd()
			b.stepStart()
			b.assistant(Text("done"))
			b.stepEnd()
			b.turnEnd()
			b.turnStart() // turn 2: steps restart at 1
			b.add(ExtensionEvent("example/title", `{"title":"t"}`))
			b.stepStart()
			b.stepEnd()
			b.turnEnd()
		})},
		{name: "open last turn is valid", build: valid(func(b *logBuilder) {
			b.turnStart()
			b.stepStart()
			b.chunk("x")
		})},
		{name: "zero-step turn", build: valid(func(b *logBuilder) {
			b.turnStart()
			b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_PromptBlocked{PromptBlocked: &sessionv1.PromptBlocked{Reason: "no"}}})
			b.turnEnd()
		})},
		{name: "TOOL_NOT_STARTED result needs no tool/call", build: valid(func(b *logBuilder) {
			b.turnStart()
			b.stepStart()
			b.assistant(ToolCallBlock("c1", "read", "{}"))
			b.add(ToolResultEvent(1, 1, "c1", []*llmv1.ContentBlock{Text("x")}, true, &toolsv1.ToolErrorInfo{Name: ToolNotStartedError, Code: ToolNotStartedCode}, -1))
		})},
		{name: "replacing tool/result needs only an open turn", build: valid(func(b *logBuilder) {
			b.turnStart()
			b.stepStart()
			c := b.call("c1")
			r := b.result("c1", c, "long")
			b.stepEnd()
			b.replace(ToolResultEvent(1, 1, "c1", []*llmv1.ContentBlock{Text("short")}, false, nil, -1), r, r, r)
		})},
		{name: "approval and question requests settled in their turn", build: valid(func(b *logBuilder) {
			b.turnStart()
			b.stepStart()
			b.asked("r1")
			b.question("r2")
			b.answered("r2")
			b.decided("r1", sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_ALLOWED_ONCE)
			b.stepEnd()
			b.turnEnd()
		})},
		// requests
		{name: "approval/decided without its request", rule: `no pending request "r1"`, build: func(b *logBuilder) int64 {
			b.turnStart()
			return b.decided("r1", sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_ALLOWED_ONCE)
		}},
		{name: "approval/decided twice", rule: `no pending request "r1"`, build: func(b *logBuilder) int64 {
			b.turnStart()
			b.asked("r1")
			b.decided("r1", sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_REJECTED)
			return b.decided("r1", sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_ALLOWED_ONCE)
		}},
		{name: "approval/decided for a request of an earlier turn", rule: "settle it before the turn ends", build: func(b *logBuilder) int64 {
			b.turnStart()
			b.asked("r1")
			return b.turnEnd()
		}},
		{name: "question/answered settling an approval", rule: "other kind", build: func(b *logBuilder) int64 {
			b.turnStart()
			b.asked("r1")
			return b.answered("r1")
		}},
		{name: "request id reused while pending", rule: "already pending", build: func(b *logBuilder) int64 {
			b.turnStart()
			b.asked("r1")
			return b.question("r1")
		}},
		{name: "approval/asked without an id", rule: "needs an id", build: func(b *logBuilder) int64 {
			b.turnStart()
			return b.asked("")
		}},
		{name: "approval/asked outside a turn", rule: "no turn is open", build: func(b *logBuilder) int64 { return b.asked("r1") }},
		// seq
		{name: "seq must start at 0", rule: "seq must be 0", build: func(b *logBuilder) int64 {
			b.turnStart()
			b.evs[0].Seq = 1
			return 0
		}},
		{name: "seq gap", rule: "seq must be 2", build: func(b *logBuilder) int64 {
			b.turnStart()
			b.user("a")
			b.user("b")
			b.evs[2].Seq = 3
			return 2
		}},
		// turn/start
		{name: "turn/start while a turn is open", rule: "turn 1 is still open", build: func(b *logBuilder) int64 {
			b.turnStart()
			return b.add(TurnStartEvent(2, MessageTrigger(UserSource())))
		}},
		{name: "first turn must be 1", rule: "next turn is 1", build: func(b *logBuilder) int64 {
			return b.add(TurnStartEvent(2, MessageTrigger(UserSource())))
		}},
		{name: "turn numbers are contiguous", rule: "next turn is 2", build: func(b *logBuilder) int64 {
			b.turnStart()
			b.turnEnd()
			return b.add(TurnStartEvent(3, MessageTrigger(UserSource())))
		}},
		// turn/end
		{name: "turn/end without an open turn", rule: "no turn is open", build: func(b *logBuilder) int64 {
			return b.add(TurnEndEvent(1, completed()))
		}},
		{name: "turn/end naming another turn", rule: "ends turn 2", build: func(b *logBuilder) int64 {
			b.turnStart()
			return b.add(TurnEndEvent(2, completed()))
		}},
		{name: "turn/end with a step open", rule: "step 1 is still open", build: func(b *logBuilder) int64 {
			b.turnStart()
			b.stepStart()
			return b.add(TurnEndEvent(1, completed()))
		}},
		// step/start
		{name: "step/start outside a turn", rule: "no turn is open", build: func(b *logBuilder) int64 {
			return b.add(StepStartEvent(1, 1))
		}},
		{name: "step/start naming another turn", rule: "names turn 2", build: func(b *logBuilder) int64 {
			b.turnStart()
			return b.add(StepStartEvent(2, 1))
		}},
		{name: "step/start with a step open", rule: "step 1 is still open", build: func(b *logBuilder) int64 {
			b.turnStart()
			b.stepStart()
			return b.add(StepStartEvent(1, 2))
		}},
		{name: "first step must be 1", rule: "next step is 1", build: func(b *logBuilder) int64 {
			b.turnStart()
			return b.add(StepStartEvent(1, 2))
		}},
		{name: "step numbers are contiguous", rule: "next step is 2", build: func(b *logBuilder) int64 {
			b.turnStart()
			b.stepStart()
			b.stepEnd()
			return b.add(StepStartEvent(1, 3))
		}},
		{name: "step numbers restart in each turn", rule: "next step is 1", build: func(b *logBuilder) int64 {
			b.turnStart()
			b.stepStart()
			b.stepEnd()
			b.turnEnd()
			b.turnStart()
			return b.add(StepStartEvent(2, 2))
		}},
		// in-step events
		{name: "step/end without a step", rule: "no step is open", build: func(b *logBuilder) int64 {
			b.turnStart()
			return b.add(StepEndEvent(1, 1))
		}},
		{name: "step/end naming another step", rule: "names step 2", build: func(b *logBuilder) int64 {
			b.turnStart()
			b.stepStart()
			return b.add(StepEndEvent(1, 2))
		}},
		{name: "assistant/chunk outside a step", rule: "no step is open", build: func(b *logBuilder) int64 {
			b.turnStart()
			return b.chunk("x")
		}},
		{name: "assistant/chunk outside a turn", rule: "no turn is open", build: func(b *logBuilder) int64 {
			return b.chunk("x")
		}},
		{name: "assistant/message naming another turn", rule: "names turn 7", build: func(b *logBuilder) int64 {
			b.turnStart()
			b.stepStart()
			return b.add(assistantEvent(7, 1, Text("x")))
		}},
		{name: "tool/call outside a step", rule: "no step is open", build: func(b *logBuilder) int64 {
			b.turnStart()
			return b.call("c1")
		}},
		{name: "tool/call without an id", rule: "needs a call id", build: func(b *logBuilder) int64 {
			b.turnStart()
			b.stepStart()
			return b.call("")
		}},
		{name: "tool/call repeated while pending", rule: "already pending", build: func(b *logBuilder) int64 {
			b.turnStart()
			b.stepStart()
			b.call("c1")
			return b.call("c1")
		}},
		// tool/result
		{name: "tool/result without a tool/call", rule: `no pending tool/call "c1"`, build: func(b *logBuilder) int64 {
			b.turnStart()
			b.stepStart()
			return b.result("c1", -1, "x")
		}},
		{name: "second tool/result for one call", rule: `no pending tool/call "c1"`, build: func(b *logBuilder) int64 {
			b.turnStart()
			b.stepStart()
			c := b.call("c1")
			b.result("c1", c, "x")
			return b.result("c1", c, "y")
		}},
		{name: "tool/result for a call of an earlier step", rule: "no pending tool/call", build: func(b *logBuilder) int64 {
			b.turnStart()
			b.stepStart()
			c := b.call("c1")
			b.stepEnd()
			b.stepStart()
			return b.result("c1", c, "x")
		}},
		{name: "tool/result outside a step", rule: "no step is open", build: func(b *logBuilder) int64 {
			b.turnStart()
			return b.add(ToolResultEvent(1, 1, "c1", []*llmv1.ContentBlock{Text("x")}, true, &toolsv1.ToolErrorInfo{Code: ToolNotStartedCode}, -1))
		}},
		{name: "replacing tool/result outside a turn", rule: "no turn is open", build: func(b *logBuilder) int64 {
			b.turnStart()
			b.stepStart()
			c := b.call("c1")
			r := b.result("c1", c, "long")
			b.stepEnd()
			b.turnEnd()
			return b.replace(ToolResultEvent(1, 1, "c1", []*llmv1.ContentBlock{Text("short")}, false, nil, -1), r, r, r)
		}},
		// everything else needs an open turn
		{name: "user/message outside a turn", rule: "no turn is open", build: func(b *logBuilder) int64 { return b.user("x") }},
		{name: "context/message outside a turn", rule: "no turn is open", build: func(b *logBuilder) int64 { return b.context("x") }},
		{name: "steering/message outside a turn", rule: "no turn is open", build: func(b *logBuilder) int64 { return b.steering("x") }},
		{name: "request/header outside a turn", rule: "no turn is open", build: func(b *logBuilder) int64 { return b.header("x") }},
		{name: "plugin event outside a turn", rule: "no turn is open", build: func(b *logBuilder) int64 {
			b.turnStart()
			b.turnEnd()
			return b.add(ExtensionEvent("example/asked", `{}`))
		}},
		{name: "todo/write outside a turn", rule: "no turn is open", build: func(b *logBuilder) int64 {
			return b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_TodoWrite{TodoWrite: &sessionv1.TodoWrite{}}})
		}},
		{name: "prompt/blocked outside a turn", rule: "no turn is open", build: func(b *logBuilder) int64 {
			return b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_PromptBlocked{PromptBlocked: &sessionv1.PromptBlocked{}}})
		}},
		// surface rules are part of the check
		{name: "replace of a seq not on the surface", rule: "not on the surface", build: func(b *logBuilder) int64 {
			b.turnStart()
			b.user("a")
			return b.replace(UserMessageEvent([]*llmv1.ContentBlock{Text("s")}, UserSource()), 0, 0, 0)
		}},
		{name: "surface fields on a non-surface event", rule: "surface_op is only allowed", build: func(b *logBuilder) int64 {
			b.turnStart()
			ev := StepStartEvent(1, 1)
			ev.SurfaceOp = AppendOp()
			return b.add(ev)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := &logBuilder{}
			bad := tt.build(b)
			if bad < 0 {
				if err := CheckLog(b.evs); err != nil {
					t.Fatalf("CheckLog: %v", err)
				}
				if _, err := NewLog(nil, b.evs); err != nil {
					t.Fatalf("NewLog: %v", err)
				}
				return
			}
			// Events after the bad one do not change the report.
			b.add(TurnStartEvent(99, MessageTrigger(UserSource())))
			err := CheckLog(b.evs)
			var ie *InvariantError
			if !errors.As(err, &ie) {
				t.Fatalf("CheckLog error = %v, want *InvariantError", err)
			}
			if ie.Seq != bad || !strings.Contains(ie.Rule, tt.rule) || ie.Code() != CodeInvariant {
				t.Fatalf("error %v, want seq %d and rule containing %q", err, bad, tt.rule)
			}
			if ie.Type != TypeName(b.evs[bad]) {
				t.Fatalf("error names type %q, want %q", ie.Type, TypeName(b.evs[bad]))
			}
			if _, err := NewLog(nil, b.evs); !errors.As(err, &ie) || ie.Seq != bad {
				t.Fatalf("NewLog = %v, want the same error", err)
			}
			// An incremental Checker fails on the same event and stays failed.
			var c Checker
			for _, ev := range b.evs[:bad] {
				if err := c.Check(ev); err != nil {
					t.Fatalf("Checker failed early at %d: %v", ev.GetSeq(), err)
				}
			}
			first := c.Check(b.evs[bad])
			if first == nil || c.Check(ExtensionEvent("x/y", "{}")) != first {
				t.Fatalf("Checker = %v, want a sticky error", first)
			}
		})
	}
}

func TestCheckerOpenTurn(t *testing.T) {
	t.Parallel()
	var c Checker
	b := &logBuilder{}
	b.turnStart()
	for _, ev := range b.evs {
		if err := c.Check(ev); err != nil {
			t.Fatal(err)
		}
	}
	if turn, ok := c.OpenTurn(); !ok || turn != 1 {
		t.Fatalf("OpenTurn = %d, %v", turn, ok)
	}
}

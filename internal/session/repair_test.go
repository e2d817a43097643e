package session

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

func TestInterruptedTurnClosers(t *testing.T) {
	t.Parallel()
	unknown := func(turn, step int32, id string, callSeq int64) *sessionv1.SessionEvent {
		return ToolResultEvent(turn, step, id, []*llmv1.ContentBlock{Text(outcomeUnknownText)}, true,
			&toolsv1.ToolErrorInfo{Name: ToolOutcomeUnknownError, Code: ToolOutcomeUnknownCode}, callSeq)
	}
	notStarted := func(turn, step int32, id string) *sessionv1.SessionEvent {
		return ToolResultEvent(turn, step, id, []*llmv1.ContentBlock{Text(notStartedText)}, true,
			&toolsv1.ToolErrorInfo{Name: ToolNotStartedError, Code: ToolNotStartedCode}, -1)
	}
	tests := []struct {
		name  string
		build func(b *logBuilder)
		want  func(b *logBuilder) []*sessionv1.SessionEvent
	}{
		{
			name: "orphan compact/start is closed before the turn",
			build: func(b *logBuilder) {
				b.turnStart()
				b.user("hi")
				b.stepStart()
				b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_CompactStart{CompactStart: &sessionv1.CompactStart{Turn: &b.turn}}})
			},
			want: func(b *logBuilder) []*sessionv1.SessionEvent {
				return []*sessionv1.SessionEvent{
					{Payload: &sessionv1.SessionEvent_CompactEnd{CompactEnd: &sessionv1.CompactEnd{Turn: &b.turn, Error: CompactInterruptedError}}},
					StepEndEvent(1, 1), TurnEndEvent(1, interrupted())}
			},
		},
		{
			name:  "empty log",
			build: func(*logBuilder) {},
			want:  func(*logBuilder) []*sessionv1.SessionEvent { return nil },
		},
		{
			name: "balanced log",
			build: func(b *logBuilder) {
				b.turnStart()
				b.user("hi")
				b.turnEnd()
			},
			want: func(*logBuilder) []*sessionv1.SessionEvent { return nil },
		},
		{
			name: "open turn without step",
			build: func(b *logBuilder) {
				b.turnStart()
				b.user("hi")
			},
			want: func(b *logBuilder) []*sessionv1.SessionEvent {
				return []*sessionv1.SessionEvent{TurnEndEvent(1, interrupted())}
			},
		},
		{
			name: "open step without calls",
			build: func(b *logBuilder) {
				b.turnStart()
				b.turnEnd()
				b.turnStart()
				b.user("hi")
				b.stepStart()
				b.stepEnd()
				b.stepStart()
				b.chunk("x")
			},
			want: func(b *logBuilder) []*sessionv1.SessionEvent {
				return []*sessionv1.SessionEvent{StepEndEvent(2, 2), TurnEndEvent(2, interrupted())}
			},
		},
		{
			name: "logged and unlogged calls in transcript order, answered call skipped",
			build: func(b *logBuilder) {
				b.turnStart()
				b.user("hi")
				b.stepStart()
				b.assistant(Text("working"), ToolCallBlock("c1", "read", "{}"), ToolCallBlock("c2", "read", "{}"), ToolCallBlock("c3", "read", "{"))
				c1 := b.call("c1")
				b.result("c1", c1, "ok")
				b.call("c2") // seq 6
			},
			want: func(b *logBuilder) []*sessionv1.SessionEvent {
				return []*sessionv1.SessionEvent{unknown(1, 1, "c2", 6), notStarted(1, 1, "c3"), StepEndEvent(1, 1), TurnEndEvent(1, interrupted())}
			},
		},
		{
			name: "pending requests are settled as cancelled before the call is closed",
			build: func(b *logBuilder) {
				b.turnStart()
				b.user("hi")
				b.stepStart()
				b.assistant(ToolCallBlock("c1", "bash", "{}"), ToolCallBlock("c2", "ask_user_question", "{}"))
				b.call("c1") // seq 4
				b.asked("r1")
				b.decided("r1", sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_ALLOWED_ONCE)
				b.question("r3")
			},
			want: func(b *logBuilder) []*sessionv1.SessionEvent {
				return []*sessionv1.SessionEvent{
					{Payload: &sessionv1.SessionEvent_QuestionAnswered{QuestionAnswered: &sessionv1.QuestionAnswered{
						Id: "r3", Unanswered: sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_CANCELLED, By: RepairedBy}}},
					unknown(1, 1, "c1", 4), notStarted(1, 1, "c2"), StepEndEvent(1, 1), TurnEndEvent(1, interrupted()),
				}
			},
		},
		{
			name: "a logged call whose approval was pending did not start",
			build: func(b *logBuilder) {
				b.turnStart()
				b.stepStart()
				b.assistant(ToolCallBlock("c1", "bash", "{}"))
				b.call("c1") // seq 3
				b.asked("r1")
			},
			want: func(b *logBuilder) []*sessionv1.SessionEvent {
				started := notStarted(1, 1, "c1")
				started.SourceEventSeqs = Seqs(3)
				return []*sessionv1.SessionEvent{
					{Payload: &sessionv1.SessionEvent_ApprovalDecided{ApprovalDecided: &sessionv1.ApprovalDecided{
						Id: "r1", Outcome: sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_CANCELLED, By: RepairedBy}}},
					started, StepEndEvent(1, 1), TurnEndEvent(1, interrupted()),
				}
			},
		},
		{
			name: "calls of a closed step are not repaired",
			build: func(b *logBuilder) {
				b.turnStart()
				b.user("hi")
				b.stepStart()
				b.assistant(ToolCallBlock("c1", "read", "{}"))
				b.stepEnd()
			},
			want: func(b *logBuilder) []*sessionv1.SessionEvent {
				return []*sessionv1.SessionEvent{TurnEndEvent(1, interrupted())}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := &logBuilder{}
			tt.build(b)
			want := tt.want(b)
			for i, ev := range want {
				ev.Seq = int64(len(b.evs) + i)
				ev.Time = b.evs[len(b.evs)-1].GetTime()
			}
			got := InterruptedTurnClosers(b.evs)
			if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
				t.Fatalf("closers (-want +got):\n%s", diff)
			}
			if len(got) == 0 {
				return
			}
			// The repaired log is balanced, passes the invariant checker and
			// needs no further repair.
			repaired := append(append([]*sessionv1.SessionEvent{}, b.evs...), got...)
			if err := CheckLog(repaired); err != nil {
				t.Fatalf("repaired log fails CheckLog: %v", err)
			}
			if again := InterruptedTurnClosers(repaired); again != nil {
				t.Fatalf("repaired log still needs closers: %v", again)
			}
		})
	}
}

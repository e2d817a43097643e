package session

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

func cloneEvents(evs []*sessionv1.SessionEvent) []*sessionv1.SessionEvent {
	out := make([]*sessionv1.SessionEvent, len(evs))
	for i, ev := range evs {
		out[i] = proto.CloneOf(ev)
	}
	return out
}

// logState is everything a Log derives from its events.
type logState struct {
	Len        int64
	Events     []*sessionv1.SessionEvent
	Messages   []*llmv1.Message
	Nodes      []int64
	Generation int
	Header     *sessionv1.EpochHeader
	Turn       int32
	TurnOpen   bool
	Step       int32
	StepOpen   bool
	NextTurn   int32
}

func stateOf(l *Log) logState {
	s := logState{Len: l.Len(), Events: l.Events(), Messages: l.Messages(), Header: l.RequestHeader(), NextTurn: l.NextTurn()}
	s.Nodes, s.Generation = l.Surface()
	s.Turn, s.TurnOpen = l.OpenTurn()
	s.Step, s.StepOpen = l.OpenStep()
	return s
}

// A trusted seed (one a Store already checked) derives exactly what the same
// seed derives when NewLog checks it: surface, messages, header fold and turn
// state, also after further appends.
func TestTrustedSeedDerivesTheSame(t *testing.T) {
	t.Parallel()
	cases := map[string][]*sessionv1.SessionEvent{
		"empty":          nil,
		"representative": representativeLog(),
	}
	for seed := range uint64(6) {
		g := newGen(seed)
		for range 300 {
			if _, err := g.l.Append(g.next()); err != nil {
				t.Fatalf("generator produced an invalid event: %v", err)
			}
		}
		cases[fmt.Sprintf("generated/%d", seed)] = g.l.Events()
	}
	h := &sessionv1.SessionHeader{Id: "trusted"}
	clock := WithClock(func() time.Time { return time.UnixMilli(1_000_000) })
	for name, evs := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			checked, err := NewLog(h, cloneEvents(evs), WithTurnChecks(), clock)
			if err != nil {
				t.Fatalf("checked seed: %v", err)
			}
			seed := cloneEvents(evs)
			trusted, err := NewLog(h, seed, WithTurnChecks(), WithTrustedSeed(), clock)
			if err != nil {
				t.Fatalf("trusted seed: %v", err)
			}
			if diff := cmp.Diff(stateOf(checked), stateOf(trusted), protocmp.Transform()); diff != "" {
				t.Fatalf("trusted seed derives differently (-checked +trusted):\n%s", diff)
			}
			for i, ev := range trusted.Events() {
				if ev != seed[i] {
					t.Fatalf("event %d was copied; a trusted seed is adopted", i)
				}
			}
			// Repair the open turn (if any) and start the next one: the
			// rebuilt turn state must accept exactly what the checked one does.
			more := append(InterruptedTurnClosers(evs), TurnStartEvent(checked.NextTurn(), MessageTrigger(UserSource())))
			if len(evs) > 0 {
				more = append(more, TurnStartEvent(checked.NextTurn()+1, MessageTrigger(UserSource()))) // a turn is open: refused
			}
			for _, ev := range more {
				ev.Seq = 0
				_, errChecked := checked.Append(ev)
				_, errTrusted := trusted.Append(ev)
				if (errChecked == nil) != (errTrusted == nil) {
					t.Fatalf("append %s: checked log: %v, trusted log: %v", TypeName(ev), errChecked, errTrusted)
				}
			}
			if diff := cmp.Diff(stateOf(checked), stateOf(trusted), protocmp.Transform()); diff != "" {
				t.Fatalf("after appends (-checked +trusted):\n%s", diff)
			}
		})
	}
}

// A trusted seed skips the content and invariant checks but not the
// structural ones that cost nothing.
func TestTrustedSeedRejects(t *testing.T) {
	t.Parallel()
	b := &logBuilder{}
	b.turnStart()
	b.user("hi")
	b.turnEnd()
	good := b.evs
	cases := []struct {
		name string
		seed []*sessionv1.SessionEvent
		seq  int64
	}{
		{"gap", []*sessionv1.SessionEvent{good[0], good[2]}, 1},
		{"not from zero", good[1:], 0},
		{"nil event", []*sessionv1.SessionEvent{good[0], nil}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := NewLog(nil, c.seed, WithTrustedSeed())
			var inv *InvariantError
			if !errors.As(err, &inv) || inv.Seq != c.seq {
				t.Fatalf("NewLog = %v, want an *InvariantError at seq %d", err, c.seq)
			}
		})
	}
}

func TestValidateEvent(t *testing.T) {
	t.Parallel()
	bad := ContextMessageEvent(nil, UserSource())
	bad.Seq = 7
	bad.GetContextMessage().Meta = ptr("{not json")
	cases := []struct {
		name string
		ev   *sessionv1.SessionEvent
		rule string // "" when valid
	}{
		{"valid", UserMessageEvent(nil, UserSource()), ""},
		{"no payload", &sessionv1.SessionEvent{}, "the event has no payload"},
		{"raw JSON", bad, "dsh.session.v1.ContextMessage.meta is not valid JSON"},
		{"extension JSON", ExtensionEvent("plugin/x", ""), "dsh.llm.v1.Extension.json is not valid JSON (use {} or null for no data)"},
		{"surface field on a non-surface event", &sessionv1.SessionEvent{SurfaceOp: AppendOp(), Payload: &sessionv1.SessionEvent_TodoWrite{TodoWrite: &sessionv1.TodoWrite{}}},
			"surface_op is only allowed on surface events"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			err := ValidateEvent(c.ev)
			var inv *InvariantError
			switch {
			case c.rule == "" && err != nil:
				t.Fatalf("ValidateEvent = %v, want nil", err)
			case c.rule == "":
			case !errors.As(err, &inv):
				t.Fatalf("ValidateEvent = %v, want an *InvariantError", err)
			case inv.Rule != c.rule || inv.Seq != c.ev.GetSeq() || inv.Type != TypeName(c.ev):
				t.Fatalf("ValidateEvent = %+v, want rule %q at seq %d (%s)", inv, c.rule, c.ev.GetSeq(), TypeName(c.ev))
			}
		})
	}
}

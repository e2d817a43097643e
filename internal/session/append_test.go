package session

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// baseLog is the log every append rule is tried against:
//
//	0 turn/start  1 user/message "u"  2 step/start  3 request/header
//	4 assistant/message [tool-call c1, tool-call c2]  5 tool/call c1
//	6 tool/result c1  7 context/message "ctx"
//
// Surface: 1, 4, 6, 7.
func baseLog() *logBuilder {
	b := &logBuilder{}
	b.turnStart()
	b.user("u")
	b.stepStart()
	b.header("sys")
	b.assistant(ToolCallBlock("c1", "read", "{}"), ToolCallBlock("c2", "read", "{}"))
	c := b.call("c1")
	b.result("c1", c, "r1")
	b.context("ctx")
	return b
}

func TestAppendRules(t *testing.T) {
	t.Parallel()
	withSeqs := func(ev *sessionv1.SessionEvent, seqs ...int64) *sessionv1.SessionEvent {
		ev.SourceEventSeqs = Seqs(seqs...)
		return ev
	}
	replacing := func(ev *sessionv1.SessionEvent, start, end int64, seqs ...int64) *sessionv1.SessionEvent {
		ev.SurfaceOp = ReplaceOp(start, end)
		ev.SourceEventSeqs = Seqs(seqs...)
		return ev
	}
	user := func(s string) *sessionv1.SessionEvent {
		return UserMessageEvent([]*llmv1.ContentBlock{Text(s)}, UserSource())
	}
	result := func(text string, isError bool, meta *string) *sessionv1.SessionEvent {
		ev := ToolResultEvent(1, 1, "c1", []*llmv1.ContentBlock{Text(text)}, isError, nil, -1)
		ev.GetToolResult().Meta = meta
		return ev
	}
	header := func(provider string, reason sessionv1.HeaderReason, params string) *sessionv1.SessionEvent {
		return &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_RequestHeader{RequestHeader: &sessionv1.RequestHeader{
			Reason: reason,
			Header: &sessionv1.EpochHeader{Config: &llmv1.LlmCallConfig{Provider: provider, Model: "m"},
				Tools: []*llmv1.ToolSchema{{Name: "t", Parameters: params}}},
		}}}
	}
	chunk := func(c *llmv1.StreamChunk) *sessionv1.SessionEvent {
		return &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_AssistantChunk{AssistantChunk: &sessionv1.AssistantChunk{Turn: 1, Step: 1, Chunk: c}}}
	}
	tests := []struct {
		name string
		ev   *sessionv1.SessionEvent
		rule string // "" = accepted; else a substring of the rule
	}{
		// payload and plugin types
		{"no payload", &sessionv1.SessionEvent{}, "no payload"},
		{"plugin event", ExtensionEvent("example/asked", `{"id":"a","toolName":"bash"}`), ""},
		{"plugin event with null data", ExtensionEvent("plan/mode", `null`), ""},
		{"plugin event without type", ExtensionEvent("", `{}`), "non-empty type"},
		{"plugin event reusing a core type", ExtensionEvent("user/message", `{}`), "reserved"},
		{"legacy header delta", ExtensionEvent("request/header-delta", `{}`), "reserved"},
		{"plugin event with invalid JSON", ExtensionEvent("x/y", `{"a":`), "not valid JSON"},
		{"plugin event with empty JSON", ExtensionEvent("x/y", ``), "not valid JSON"},
		// seq
		{"explicit next seq", func() *sessionv1.SessionEvent { e := user("x"); e.Seq = 8; return e }(), ""},
		{"seq gap", func() *sessionv1.SessionEvent { e := user("x"); e.Seq = 9; return e }(), "gap"},
		{"seq rewriting history", func() *sessionv1.SessionEvent { e := user("x"); e.Seq = 3; return e }(), "gap"},
		// surface fields
		{"surface op on a non-surface event", func() *sessionv1.SessionEvent { e := StepEndEvent(1, 1); e.SurfaceOp = AppendOp(); return e }(), "surface_op is only allowed"},
		{"source seqs on a non-surface event", func() *sessionv1.SessionEvent { e := StepEndEvent(1, 1); e.SourceEventSeqs = Seqs(1); return e }(), "source_event_seqs is only allowed"},
		{"source seqs on a plugin event", withSeqs(ExtensionEvent("a/b", "{}"), 1), "only allowed on surface"},
		{"surface event without op", func() *sessionv1.SessionEvent { e := user("x"); e.SurfaceOp = nil; return e }(), "needs a surface_op"},
		{"surface event with empty op", func() *sessionv1.SessionEvent { e := user("x"); e.SurfaceOp = &sessionv1.SurfaceOp{}; return e }(), "needs a surface_op"},
		{"negative replace range", replacing(user("x"), -1, 1, 1), "non-negative"},
		{"source seqs on an append", withSeqs(user("x"), 1, 4), ""},
		{"empty source seqs on user/message", withSeqs(user("x")), "empty only on assistant/message"},
		{"empty source seqs on assistant/message", withSeqs(assistantEvent(1, 1)), ""},
		{"negative source seq", withSeqs(user("x"), -1), "negative"},
		{"source seq not earlier", withSeqs(user("x"), 8), "not strictly earlier"},
		{"duplicate source seq", withSeqs(user("x"), 1, 1), "twice"},
		// replace
		{"replace a range", replacing(user("sum"), 1, 6, 1, 4, 6), ""},
		{"replace start not on surface", replacing(user("sum"), 2, 6, 2, 4, 6), "start 2 is not on the surface"},
		{"replace end not on surface", replacing(user("sum"), 1, 5, 1, 4, 5), "end 5 is not on the surface"},
		{"replace start after end", replacing(user("sum"), 6, 1, 1, 4, 6), "comes after"},
		{"replace without every shadowed seq", replacing(user("sum"), 1, 6, 1, 6), "shadowed seq 4"},
		{"replace without source seqs", func() *sessionv1.SessionEvent { e := user("s"); e.SurfaceOp = ReplaceOp(1, 1); return e }(), "shadowed seq 1"},
		{"replacing tool/result", replacing(result("pruned", false, nil), 6, 6, 6), ""},
		{"replacing tool/result shadowing two nodes", replacing(result("pruned", false, nil), 6, 7, 6, 7), "exactly one node"},
		{"replacing tool/result shadowing a user/message", replacing(result("pruned", false, nil), 1, 1, 1), "must shadow a tool/result"},
		{"replacing tool/result changing is_error", replacing(result("pruned", true, nil), 6, 6, 6), "only in content"},
		{"replacing tool/result changing meta", replacing(result("pruned", false, ptr(`{}`)), 6, 6, 6), "only in content"},
		{"replacing tool/result changing error", func() *sessionv1.SessionEvent {
			e := replacing(result("pruned", false, nil), 6, 6, 6)
			e.GetToolResult().Error = &toolsv1.ToolErrorInfo{Name: "E", Code: "C"}
			return e
		}(), "only in content"},
		// lossless JSON
		{"tool-call arguments need not be JSON", &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_ToolCall{ToolCall: &sessionv1.ToolCall{Turn: 1, Step: 1, CallId: "c2", Name: "read", Arguments: `{"path": "unterminated`}}}, ""},
		{"context meta", func() *sessionv1.SessionEvent { e := user("x"); return e }(), ""},
		{"invalid context meta", func() *sessionv1.SessionEvent {
			e := ContextMessageEvent([]*llmv1.ContentBlock{Text("x")}, UserSource())
			e.GetContextMessage().Meta = ptr(`{nope}`)
			return e
		}(), "ContextMessage.meta is not valid JSON"},
		{"empty context meta", func() *sessionv1.SessionEvent {
			e := ContextMessageEvent([]*llmv1.ContentBlock{Text("x")}, UserSource())
			e.GetContextMessage().Meta = ptr(``)
			return e
		}(), "ContextMessage.meta is not valid JSON"},
		{"invalid tool/result meta", func() *sessionv1.SessionEvent {
			return withSeqs(result("x", false, ptr(`[1,`)), 5)
		}(), "ToolResult.meta is not valid JSON"},
		{"invalid replay state", func() *sessionv1.SessionEvent {
			e := assistantEvent(1, 1, Text("x"))
			e.GetAssistantMessage().Provenance.ReplayState = ptr(`{'a':1}`)
			return e
		}(), "replay_state is not valid JSON"},
		{"invalid prefix-context meta", func() *sessionv1.SessionEvent {
			e := user("x")
			e.GetUserMessage().Envelope = &sessionv1.PromptEnvelope{PrefixContexts: []*sessionv1.PromptPrefixContext{{Source: UserSource(), Meta: ptr(`x`)}}}
			return e
		}(), "PromptPrefixContext.meta is not valid JSON"},
		{"invalid nested extension block", func() *sessionv1.SessionEvent {
			return withSeqs(ToolResultEvent(1, 1, "c1", []*llmv1.ContentBlock{ToolResultBlock("c", []*llmv1.ContentBlock{ExtensionBlock("audio", "{")}, false)}, false, nil, -1), 5)
		}(), "Extension.json is not valid JSON"},
		{"invalid extension source", func() *sessionv1.SessionEvent {
			return UserMessageEvent([]*llmv1.ContentBlock{Text("x")}, &llmv1.MessageSource{Kind: &llmv1.MessageSource_Extension{Extension: &llmv1.Extension{Type: "cron", Json: "nope"}}})
		}(), "Extension.json is not valid JSON"},
		{"invalid tool schema parameters", header("p", sessionv1.HeaderReason_HEADER_REASON_CHANGE, `{"type":`), "ToolSchema.parameters is not valid JSON"},
		{"tool schema without parameters", header("p", sessionv1.HeaderReason_HEADER_REASON_CHANGE, ``), ""},
		{"invalid finish replay state in a chunk", chunk(&llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Finish{Finish: &llmv1.FinishChunk{
			Reason: &llmv1.FinishReason{Kind: &llmv1.FinishReason_Stop{Stop: &llmv1.FinishStop{}}}, ReplayState: ptr("{")}}}), "FinishChunk.replay_state is not valid JSON"},
		{"invalid UTF-8 text", user("bad \xff byte"), "not valid UTF-8"},
		// historical-data requirements
		{"header without provider", header("", sessionv1.HeaderReason_HEADER_REASON_CHANGE, `{}`), "config.provider and config.model"},
		{"header without reason", header("p", sessionv1.HeaderReason_HEADER_REASON_UNSPECIFIED, `{}`), "needs a reason"},
		{"assistant/message without provenance", func() *sessionv1.SessionEvent {
			e := assistantEvent(1, 1, Text("x"))
			e.GetAssistantMessage().Provenance = nil
			return e
		}(), "provenance.provider"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := baseLog()
			l, err := NewLog(nil, b.evs, WithClock(func() time.Time { return time.UnixMilli(5000) }))
			if err != nil {
				t.Fatal(err)
			}
			before, beforeMsgs, beforeHdr := l.Len(), l.Messages(), l.RequestHeader()
			beforeNodes, beforeGen := l.Surface()
			in := proto.CloneOf(tt.ev)
			got, err := l.Append(tt.ev)
			if !proto.Equal(in, tt.ev) {
				t.Fatal("Append mutated its argument")
			}
			if tt.rule == "" {
				if err != nil {
					t.Fatalf("Append: %v", err)
				}
				if got.GetSeq() != before || l.Len() != before+1 || got.GetTime() != 5000 {
					t.Fatalf("appended seq %d time %d, len %d", got.GetSeq(), got.GetTime(), l.Len())
				}
				// Every accepted event here is also turn-enclosed, so the
				// whole log passes the checker.
				if err := CheckLog(l.Events()); err != nil {
					t.Fatalf("CheckLog disagrees with Append: %v", err)
				}
				return
			}
			var ae *AppendError
			if !errors.As(err, &ae) {
				t.Fatalf("Append error = %v, want *AppendError", err)
			}
			if !strings.Contains(ae.Rule, tt.rule) || ae.Code() != CodeInvariant || ae.Seq != before || ae.Type != TypeName(tt.ev) {
				t.Fatalf("error %+v (%v), want rule containing %q at seq %d", ae, err, tt.rule, before)
			}
			if !strings.Contains(err.Error(), typeOrNone(TypeName(tt.ev))) {
				t.Fatalf("error %q does not name the event type", err)
			}
			nodes, gen := l.Surface()
			if l.Len() != before || len(l.Messages()) != len(beforeMsgs) || l.RequestHeader() != beforeHdr ||
				!cmp.Equal(nodes, beforeNodes) || gen != beforeGen {
				t.Fatal("a rejected append changed the log")
			}
			// The same event in a seed fails loading with its seq.
			seed := append(append([]*sessionv1.SessionEvent{}, b.evs...), proto.CloneOf(tt.ev))
			if tt.ev.GetSeq() == 0 {
				seed[len(seed)-1].Seq = before
			}
			_, err = NewLog(nil, seed)
			var ie *InvariantError
			if !errors.As(err, &ie) || ie.Seq != before {
				t.Fatalf("NewLog with the event in the seed: %v, want *InvariantError at seq %d", err, before)
			}
		})
	}
}

func TestAppendTurnChecks(t *testing.T) {
	t.Parallel()
	l, err := NewLog(nil, nil, WithTurnChecks())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(UserMessageEvent([]*llmv1.ContentBlock{Text("x")}, UserSource())); err == nil || !strings.Contains(err.Error(), "no turn is open") {
		t.Fatalf("strict append outside a turn: %v", err)
	}
	if _, err := l.Append(TurnStartEvent(1, MessageTrigger(UserSource()))); err != nil {
		t.Fatal(err)
	}
	if turn, ok := l.OpenTurn(); !ok || turn != 1 {
		t.Fatalf("OpenTurn = %d %v", turn, ok)
	}
	if _, err := l.Append(StepEndEvent(1, 1)); err == nil {
		t.Fatal("step/end without a step was accepted")
	}
	// Without the option the same append is accepted.
	lax, _ := NewLog(nil, nil)
	if _, err := lax.Append(UserMessageEvent([]*llmv1.ContentBlock{Text("x")}, UserSource())); err != nil {
		t.Fatalf("lax append: %v", err)
	}
}

func TestLogAccessors(t *testing.T) {
	t.Parallel()
	b := baseLog()
	h := &sessionv1.SessionHeader{Id: "s1", Cwd: "/w"}
	l, err := NewLog(h, b.evs)
	if err != nil {
		t.Fatal(err)
	}
	h.Id = "mutated"
	b.evs[1].GetUserMessage().Content[0].GetText().Text = "mutated"
	if l.Header().GetId() != "s1" || l.Messages()[0].GetContent()[0].GetText().GetText() != "u" {
		t.Fatal("NewLog does not copy its inputs")
	}
	snap := l.Events()
	if _, err := l.Append(StepEndEvent(1, 1)); err != nil {
		t.Fatal(err)
	}
	if len(snap) != 8 || len(l.Events()) != 9 {
		t.Fatalf("snapshot changed: %d, %d", len(snap), len(l.Events()))
	}
	if got := l.EventsFrom(7); len(got) != 2 || got[0].GetSeq() != 7 {
		t.Fatalf("EventsFrom(7) = %v", got)
	}
	if got := l.EventsFrom(9); got != nil {
		t.Fatalf("EventsFrom(past end) = %v", got)
	}
	if got := l.EventsFrom(-3); len(got) != 9 {
		t.Fatalf("EventsFrom(-3) has %d events", len(got))
	}
	if s, ok := l.OpenStep(); ok {
		t.Fatalf("OpenStep = %d after step/end", s)
	}
	if _, err := l.Append(TurnEndEvent(1, completed())); err != nil {
		t.Fatal(err)
	}
	if _, ok := l.OpenTurn(); ok || l.NextTurn() != 2 {
		t.Fatalf("after turn/end: open %v next %d", ok, l.NextTurn())
	}
	if l.RequestHeader().GetSystem() != "sys" {
		t.Fatalf("RequestHeader = %v", l.RequestHeader())
	}
	empty, _ := NewLog(nil, nil)
	if m := empty.Messages(); m == nil || len(m) != 0 || empty.RequestHeader() != nil || empty.Len() != 0 {
		t.Fatal("empty log accessors")
	}
}

func TestMessagesSnapshotIsStable(t *testing.T) {
	t.Parallel()
	b := &logBuilder{}
	b.turnStart()
	s1 := b.user("a")
	l, _ := NewLog(nil, b.evs)
	before := l.Messages()
	if _, err := l.Append(UserMessageEvent([]*llmv1.ContentBlock{Text("b")}, UserSource())); err != nil {
		t.Fatal(err)
	}
	ev := UserMessageEvent([]*llmv1.ContentBlock{Text("r")}, UserSource())
	ev.SurfaceOp, ev.SourceEventSeqs = ReplaceOp(s1, s1), Seqs(s1)
	if _, err := l.Append(ev); err != nil {
		t.Fatal(err)
	}
	if len(before) != 1 || before[0].GetContent()[0].GetText().GetText() != "a" {
		t.Fatalf("earlier snapshot changed: %v", before)
	}
	if diff := cmp.Diff([]*llmv1.Message{userMsg("r"), userMsg("b")}, l.Messages(), protocmp.Transform()); diff != "" {
		t.Fatal(diff)
	}
}

func TestObservers(t *testing.T) {
	t.Parallel()
	l, _ := NewLog(nil, nil)
	var (
		mu   sync.Mutex
		seen []int64
	)
	stop := l.Observe(func(ev *sessionv1.SessionEvent) {
		mu.Lock()
		seen = append(seen, ev.GetSeq())
		mu.Unlock()
		if l.Len() <= ev.GetSeq() {
			t.Errorf("observer saw seq %d before it was committed", ev.GetSeq())
		}
		// An observer may append; its event is delivered after this one.
		if ev.GetTurnStart() != nil {
			if _, err := l.Append(UserMessageEvent([]*llmv1.ContentBlock{Text("from observer")}, UserSource())); err != nil {
				t.Errorf("re-entrant append: %v", err)
			}
		}
	})
	l.Observe(func(ev *sessionv1.SessionEvent) {
		if ev.GetSeq() == 0 {
			panic("contained")
		}
	})
	if _, err := l.Append(TurnStartEvent(1, MessageTrigger(UserSource()))); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := l.Append(ExtensionEvent("x/y", "{}")); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	stop()
	if _, err := l.Append(ExtensionEvent("x/y", "{}")); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := make([]int64, 10)
	for i := range want {
		want[i] = int64(i)
	}
	if diff := cmp.Diff(want, seen); diff != "" {
		t.Fatalf("observed seqs (-want +got):\n%s", diff)
	}
}

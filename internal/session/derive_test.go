package session

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

func TestDeriveMessages(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		build func(b *logBuilder)
		want  []*llmv1.Message
	}{
		{
			name:  "no events derive an empty history",
			build: func(*logBuilder) {},
			want:  []*llmv1.Message{},
		},
		{
			name: "user/message is a verbatim user message; source and envelope are not rendered",
			build: func(b *logBuilder) {
				b.turnStart()
				ev := UserMessageEvent([]*llmv1.ContentBlock{Text("ctx"), Text("\n\n## My request:\n"), Text("hi")}, UserSource())
				ev.GetUserMessage().Envelope = &sessionv1.PromptEnvelope{DisplayContent: []*llmv1.ContentBlock{Text("hi")}}
				b.add(ev)
			},
			want: []*llmv1.Message{userMsg("ctx", "\n\n## My request:\n", "hi")},
		},
		{
			name: "context/message is a verbatim user message; meta is not rendered",
			build: func(b *logBuilder) {
				b.turnStart()
				ev := ContextMessageEvent([]*llmv1.ContentBlock{Text("<system-reminder>x</system-reminder>")}, PluginSource("fs"))
				ev.GetContextMessage().Meta = ptr(`{"k":1}`)
				b.add(ev)
			},
			want: []*llmv1.Message{userMsg("<system-reminder>x</system-reminder>")},
		},
		{
			name: "steering/message is a verbatim user message",
			build: func(b *logBuilder) {
				b.turnStart()
				b.steering("also do y")
			},
			want: []*llmv1.Message{userMsg("also do y")},
		},
		{
			name: "assistant/message keeps content and provenance with replay state",
			build: func(b *logBuilder) {
				b = openTurnInto(b)
				ev := assistantEvent(1, 1, Reasoning("hmm"), Text("ok"), ToolCallBlock("c1", "read", `{"p":`))
				ev.GetAssistantMessage().Provenance.ReplayState = ptr(`{"sig":"abc"}`)
				b.add(ev)
			},
			want: []*llmv1.Message{{Role: llmv1.Role_ROLE_ASSISTANT, Content: []*llmv1.ContentBlock{Reasoning("hmm"), Text("ok"), ToolCallBlock("c1", "read", `{"p":`)},
				Provenance: &llmv1.AssistantProvenance{Provider: "scripted", Model: "m1", ReplayState: ptr(`{"sig":"abc"}`)}}},
		},
		{
			name: "an empty assistant/message derives no message",
			build: func(b *logBuilder) {
				b = openTurnInto(b)
				b.user("hi")
				b.assistant()
			},
			want: []*llmv1.Message{userMsg("hi")},
		},
		{
			name: "tool/result is a user message holding one tool-result block",
			build: func(b *logBuilder) {
				b = openTurnInto(b)
				b.assistant(ToolCallBlock("c1", "read", "{}"))
				c := b.call("c1")
				ev := ToolResultEvent(1, 1, "c1", []*llmv1.ContentBlock{Text("boom")}, true, &toolsv1.ToolErrorInfo{Name: "E", Code: "X"}, c)
				ev.GetToolResult().Meta = ptr(`{"diff":true}`)
				b.add(ev)
			},
			want: []*llmv1.Message{assistantMsg(ToolCallBlock("c1", "read", "{}")), toolResultMsg("c1", "boom", true)},
		},
		{
			name: "non-surface events derive nothing",
			build: func(b *logBuilder) {
				b = openTurnInto(b)
				b.header("sys")
				b.chunk("x")
				b.call("c9")
				b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_TodoWrite{TodoWrite: &sessionv1.TodoWrite{}}})
				b.add(ExtensionEvent("example/asked", `{"id":"a"}`))
				b.add(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_PromptBlocked{PromptBlocked: &sessionv1.PromptBlocked{Content: []*llmv1.ContentBlock{Text("no")}, Reason: "r"}}})
				b.stepEnd()
				b.turnEnd()
			},
			want: []*llmv1.Message{},
		},
		{
			name: "replace removes the shadowed range and puts the replacement in its place",
			build: func(b *logBuilder) {
				b.turnStart()
				s1 := b.user("one")  // 1
				s2 := b.context("a") // 2
				s3 := b.user("two")  // 3
				b.user("three")      // 4
				b.replace(UserMessageEvent([]*llmv1.ContentBlock{Text("summary")}, PluginSource("compact")), s1, s3, s1, s2, s3)
			},
			want: []*llmv1.Message{userMsg("summary"), userMsg("three")},
		},
		{
			name: "replace of one node (start == end)",
			build: func(b *logBuilder) {
				b.turnStart()
				b.user("one")
				s := b.user("two")
				b.user("three")
				b.replace(UserMessageEvent([]*llmv1.ContentBlock{Text("TWO")}, UserSource()), s, s, s)
			},
			want: []*llmv1.Message{userMsg("one"), userMsg("TWO"), userMsg("three")},
		},
		{
			name: "replace over an earlier replacement, start seq greater than end seq",
			build: func(b *logBuilder) {
				b.turnStart()
				b.user("a")                                                                                        // 1
				s2 := b.user("b")                                                                                  // 2
				s3 := b.user("c")                                                                                  // 3
				s4 := b.user("d")                                                                                  // 4
				r5 := b.replace(UserMessageEvent([]*llmv1.ContentBlock{Text("bc")}, UserSource()), s2, s3, s2, s3) // surface 1,5,4
				b.replace(UserMessageEvent([]*llmv1.ContentBlock{Text("bcd")}, UserSource()), r5, s4, r5, s4)      // surface 1,6
			},
			want: []*llmv1.Message{userMsg("a"), userMsg("bcd")},
		},
		{
			name: "a replacement may shadow nodes that derive nothing",
			build: func(b *logBuilder) {
				b = openTurnInto(b)
				u := b.user("q")
				a := b.assistant()
				b.replace(UserMessageEvent([]*llmv1.ContentBlock{Text("s")}, UserSource()), u, a, u, a)
			},
			want: []*llmv1.Message{userMsg("s")},
		},
		{
			name: "a replacing tool/result swaps only the content",
			build: func(b *logBuilder) {
				b = openTurnInto(b)
				b.assistant(ToolCallBlock("c1", "read", "{}"))
				c := b.call("c1")
				r := b.result("c1", c, "a very long output")
				b.user("next")
				b.replace(ToolResultEvent(1, 1, "c1", []*llmv1.ContentBlock{Text("[pruned]")}, false, nil, -1), r, r, r)
			},
			want: []*llmv1.Message{assistantMsg(ToolCallBlock("c1", "read", "{}")), toolResultMsg("c1", "[pruned]", false), userMsg("next")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := &logBuilder{}
			tt.build(b)
			if diff := cmp.Diff(tt.want, DeriveMessages(b.evs), protocmp.Transform()); diff != "" {
				t.Fatalf("DeriveMessages (-want +got):\n%s", diff)
			}
			// The same events through a Log, one append at a time.
			l, err := NewLog(nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range b.evs {
				if _, err := l.Append(ev); err != nil {
					t.Fatalf("Append: %v", err)
				}
			}
			if diff := cmp.Diff(tt.want, l.Messages(), protocmp.Transform()); diff != "" {
				t.Fatalf("Log.Messages (-want +got):\n%s", diff)
			}
			if err := CheckLog(b.evs); err != nil {
				t.Fatalf("CheckLog: %v", err)
			}
		})
	}
}

// openTurnInto opens turn 1 and step 1 on b.
func openTurnInto(b *logBuilder) *logBuilder {
	b.turnStart()
	b.stepStart()
	return b
}

func ptr[T any](v T) *T { return &v }

func TestSurfaceGeneration(t *testing.T) {
	t.Parallel()
	b := &logBuilder{}
	b.turnStart()
	s1 := b.user("a")
	s2 := b.user("b")
	r := b.replace(UserMessageEvent([]*llmv1.ContentBlock{Text("ab")}, UserSource()), s1, s2, s1, s2)
	b.user("c")
	l, err := NewLog(&sessionv1.SessionHeader{Id: "s"}, b.evs)
	if err != nil {
		t.Fatal(err)
	}
	nodes, gen := l.Surface()
	if diff := cmp.Diff([]int64{r, r + 1}, nodes); diff != "" || gen != 1 {
		t.Fatalf("surface = %v gen %d (%s)", nodes, gen, diff)
	}
}

func TestEventClassifiers(t *testing.T) {
	t.Parallel()
	b := &logBuilder{}
	b.turnStart()
	s := b.user("a")
	r := b.replace(UserMessageEvent([]*llmv1.ContentBlock{Text("b")}, UserSource()), s, s, s)
	tests := []struct {
		ev                *sessionv1.SessionEvent
		name              string
		surface, appended bool
		derives           bool
	}{
		{b.evs[0], TypeTurnStart, false, false, false},
		{b.evs[s], TypeUserMessage, true, true, true},
		{b.evs[r], TypeUserMessage, true, false, true},
		{assistantEvent(1, 1), TypeAssistantMessage, true, true, false},
		{ExtensionEvent("example/asked", "{}"), "example/asked", false, false, false},
		{&sessionv1.SessionEvent{}, "", false, false, false},
	}
	for _, tt := range tests {
		if got := TypeName(tt.ev); got != tt.name {
			t.Errorf("TypeName = %q, want %q", got, tt.name)
		}
		if IsSurfaceEvent(tt.ev) != tt.surface || IsSurfaceType(tt.name) != tt.surface || IsAppendSurfaceEvent(tt.ev) != tt.appended {
			t.Errorf("%s: surface %v / append %v, want %v / %v", tt.name, IsSurfaceEvent(tt.ev), IsAppendSurfaceEvent(tt.ev), tt.surface, tt.appended)
		}
		if (DeriveEventMessage(tt.ev) != nil) != tt.derives {
			t.Errorf("%s: DeriveEventMessage = %v", tt.name, DeriveEventMessage(tt.ev))
		}
	}
}

package render

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func text(s string) *llmv1.ContentBlock {
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}
}

func ev(p any) *sessionv1.SessionEvent {
	e := &sessionv1.SessionEvent{}
	switch v := p.(type) {
	case *sessionv1.TurnStart:
		e.Payload = &sessionv1.SessionEvent_TurnStart{TurnStart: v}
	case *sessionv1.TurnEnd:
		e.Payload = &sessionv1.SessionEvent_TurnEnd{TurnEnd: v}
	case *sessionv1.UserMessage:
		e.Payload = &sessionv1.SessionEvent_UserMessage{UserMessage: v}
	case *sessionv1.AssistantChunk:
		e.Payload = &sessionv1.SessionEvent_AssistantChunk{AssistantChunk: v}
	case *sessionv1.AssistantMessage:
		e.Payload = &sessionv1.SessionEvent_AssistantMessage{AssistantMessage: v}
	case *sessionv1.ToolCall:
		e.Payload = &sessionv1.SessionEvent_ToolCall{ToolCall: v}
	case *sessionv1.ToolResult:
		e.Payload = &sessionv1.SessionEvent_ToolResult{ToolResult: v}
	case *sessionv1.TodoWrite:
		e.Payload = &sessionv1.SessionEvent_TodoWrite{TodoWrite: v}
	case *sessionv1.StepStart:
		e.Payload = &sessionv1.SessionEvent_StepStart{StepStart: v}
	case *sessionv1.SessionTitle:
		e.Payload = &sessionv1.SessionEvent_SessionTitle{SessionTitle: v}
	default:
		panic("unknown payload")
	}
	return e
}

func textDelta(turn, step int32, s string) *sessionv1.SessionEvent {
	return ev(&sessionv1.AssistantChunk{Turn: turn, Step: step, Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Text: s}}}})
}

func reasoningDelta(turn, step int32, s string) *sessionv1.SessionEvent {
	return ev(&sessionv1.AssistantChunk{Turn: turn, Step: step, Chunk: &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_ReasoningDelta{ReasoningDelta: &llmv1.ReasoningDelta{Text: s}}}})
}

func scenarios() map[string][]*sessionv1.SessionEvent {
	completed := &sessionv1.TurnEndReason{Kind: &sessionv1.TurnEndReason_Completed{Completed: &sessionv1.EndCompleted{}}}
	return map[string][]*sessionv1.SessionEvent{
		"tool_turn": {
			ev(&sessionv1.TurnStart{Turn: 1}),
			ev(&sessionv1.UserMessage{Content: []*llmv1.ContentBlock{text("list the files and fix the typo")}}),
			ev(&sessionv1.StepStart{Turn: 1, Step: 1}),
			reasoningDelta(1, 1, "The user wants "),
			reasoningDelta(1, 1, "a listing."),
			textDelta(1, 1, "Let me "),
			textDelta(1, 1, "look."),
			ev(&sessionv1.AssistantMessage{Turn: 1, Step: 1, Content: []*llmv1.ContentBlock{text("Let me look.")},
				Usage: &llmv1.TokenUsage{InputTokens: 1200, OutputTokens: 30, CacheReadTokens: proto.Int64(1000)}}),
			ev(&sessionv1.ToolCall{Turn: 1, Step: 1, CallId: "c1", Name: "bash", Arguments: `{"command":"ls"}`,
				View: &toolsv1.ToolCallView{Card: &toolsv1.ToolCallView_Terminal{Terminal: &toolsv1.TerminalCallView{Title: "ls", Description: "List files"}}}}),
			ev(&sessionv1.ToolResult{Turn: 1, Step: 1, CallId: "c1", Content: []*llmv1.ContentBlock{text("a.go\nb.go\n")},
				View: &toolsv1.ToolResultView{Card: &toolsv1.ToolResultView_Terminal{Terminal: &toolsv1.TerminalResultView{Output: "a.go\nb.go\n", ExitCode: proto.Int32(0)}}}}),
			ev(&sessionv1.ToolCall{Turn: 1, Step: 2, CallId: "c2", Name: "edit", Arguments: `{}`,
				View: &toolsv1.ToolCallView{Card: &toolsv1.ToolCallView_Diff{Diff: &toolsv1.DiffCallView{Title: "Edit a.go"}}}}),
			ev(&sessionv1.ToolResult{Turn: 1, Step: 2, CallId: "c2", Content: []*llmv1.ContentBlock{text("ok")},
				View: &toolsv1.ToolResultView{Card: &toolsv1.ToolResultView_Diff{Diff: &toolsv1.DiffResultView{Diffs: []*toolsv1.FileDiff{
					{Path: "a.go", OldText: proto.String("package a\nfunc Mian() {}\n"), NewText: "package a\nfunc Main() {}\n"}}}}}}),
			ev(&sessionv1.ToolCall{Turn: 1, Step: 2, CallId: "c3", Name: "read",
				View: &toolsv1.ToolCallView{Card: &toolsv1.ToolCallView_Generic{Generic: &toolsv1.GenericCallView{Title: "Read b.go"}}}}),
			ev(&sessionv1.ToolResult{Turn: 1, Step: 2, CallId: "c3", Content: []*llmv1.ContentBlock{text("package b")},
				View: &toolsv1.ToolResultView{Card: &toolsv1.ToolResultView_Generic{Generic: &toolsv1.GenericResultView{Title: "b.go"}}}}),
			ev(&sessionv1.ToolCall{Turn: 1, Step: 2, CallId: "c4", Name: "bash",
				View: &toolsv1.ToolCallView{Card: &toolsv1.ToolCallView_Terminal{Terminal: &toolsv1.TerminalCallView{Title: "false"}}}}),
			ev(&sessionv1.ToolResult{Turn: 1, Step: 2, CallId: "c4", IsError: true, Content: []*llmv1.ContentBlock{text("")},
				View: &toolsv1.ToolResultView{Card: &toolsv1.ToolResultView_Terminal{Terminal: &toolsv1.TerminalResultView{ExitCode: proto.Int32(1)}}}}),
			ev(&sessionv1.TodoWrite{Todos: []*sessionv1.TodoItem{
				{Content: "fix typo", Status: sessionv1.TodoStatus_TODO_STATUS_COMPLETED},
				{Content: "run tests", Status: sessionv1.TodoStatus_TODO_STATUS_IN_PROGRESS},
				{Content: "ship", Status: sessionv1.TodoStatus_TODO_STATUS_PENDING}}}),
			// A step whose text was not streamed (chunks absent) renders from the message.
			ev(&sessionv1.AssistantMessage{Turn: 1, Step: 3, Content: []*llmv1.ContentBlock{text("Fixed the typo in a.go.")},
				Usage: &llmv1.TokenUsage{InputTokens: 1300, OutputTokens: 12, CacheReadTokens: proto.Int64(1200)}}),
			ev(&sessionv1.TurnEnd{Turn: 1, Reason: completed}),
			// The generated title arrives in a zero-step turn of its own.
			ev(&sessionv1.TurnStart{Turn: 2}),
			ev(&sessionv1.SessionTitle{Title: "Fix the typo", Source: "model"}),
			ev(&sessionv1.TurnEnd{Turn: 2, Reason: completed}),
		},
		"failed_turn": {
			ev(&sessionv1.TurnStart{Turn: 2}),
			ev(&sessionv1.UserMessage{Content: []*llmv1.ContentBlock{text("hello")}}),
			ev(&sessionv1.ToolCall{Turn: 2, Step: 1, CallId: "x", Name: "mystery", Arguments: `{"a": 1}`}),
			ev(&sessionv1.ToolResult{Turn: 2, Step: 1, CallId: "x", IsError: true, Content: []*llmv1.ContentBlock{text("Error: unknown tool")},
				Error: &toolsv1.ToolErrorInfo{Code: "UNKNOWN_TOOL"}}),
			ev(&sessionv1.TurnEnd{Turn: 2, Reason: &sessionv1.TurnEndReason{Kind: &sessionv1.TurnEndReason_Error{Error: &sessionv1.EndError{
				Step: 2, Failure: &llmv1.LlmFailure{Code: "RATE_LIMITED", Message: "slow down"}}}}}),
		},
	}
}

func TestGolden(t *testing.T) {
	t.Parallel()
	for name, evs := range scenarios() {
		for _, color := range []bool{false, true} {
			file := name + ".txt"
			if color {
				file = name + ".ansi.txt"
			}
			t.Run(file, func(t *testing.T) {
				t.Parallel()
				var buf bytes.Buffer
				r := New(&buf, Options{Color: color, ShowUser: true})
				for _, e := range evs {
					r.Event(e)
				}
				if len(r.Running()) != 0 {
					t.Errorf("Running after the turn ended = %v", r.Running())
				}
				path := filepath.Join("testdata", file)
				if *update {
					if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				want, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(string(want), buf.String()); diff != "" {
					t.Errorf("render mismatch (-want +got):\n%s", diff)
				}
			})
		}
	}
}

func TestReasoningModes(t *testing.T) {
	t.Parallel()
	evs := []*sessionv1.SessionEvent{
		reasoningDelta(1, 1, "let me "),
		reasoningDelta(1, 1, "think hard"),
		textDelta(1, 1, "Answer."),
		ev(&sessionv1.AssistantMessage{Turn: 1, Step: 1}),
		// Not streamed: rendered from the message.
		ev(&sessionv1.AssistantMessage{Turn: 1, Step: 2, Content: []*llmv1.ContentBlock{
			{Block: &llmv1.ContentBlock_Reasoning{Reasoning: &llmv1.ReasoningBlock{Text: "one two three"}}}, text("Done.")}}),
	}
	// The same step received in one response: one event holding the
	// three chunks renders the same.
	var batch []*llmv1.StreamChunk
	for _, e := range evs[:3] {
		batch = append(batch, e.GetAssistantChunk().GetChunk())
	}
	batched := append([]*sessionv1.SessionEvent{ev(&sessionv1.AssistantChunk{Turn: 1, Step: 1, Chunks: batch})}, evs[3:]...)
	tests := []struct {
		mode string
		want string
	}{
		{"full", "✻ let me think hard\nAnswer.\n✻ one two three\nDone.\n"},
		{"collapsed", "✻ reasoned (4 words)\nAnswer.\n✻ reasoned (3 words)\nDone.\n"},
		{"hidden", "Answer.\nDone.\n"},
	}
	for _, tt := range tests {
		m, ok := ParseReasoningMode(tt.mode)
		if !ok {
			t.Fatalf("ParseReasoningMode(%q) failed", tt.mode)
		}
		for _, log := range [][]*sessionv1.SessionEvent{evs, batched} {
			var buf bytes.Buffer
			r := New(&buf, Options{Reasoning: m})
			for _, e := range log {
				r.Event(e)
			}
			if diff := cmp.Diff(tt.want, buf.String()); diff != "" {
				t.Errorf("mode %s, %d events (-want +got):\n%s", tt.mode, len(log), diff)
			}
		}
	}
	if _, ok := ParseReasoningMode("loud"); ok {
		t.Error("ParseReasoningMode accepted an unknown mode")
	}
}

func TestRunningTracksToolCalls(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	r := New(&buf, Options{})
	r.Event(ev(&sessionv1.ToolCall{CallId: "a", Name: "bash"}))
	r.Event(ev(&sessionv1.ToolCall{CallId: "b", Name: "read"}))
	if got := r.Running(); len(got) != 2 {
		t.Fatalf("Running = %v", got)
	}
	r.Event(ev(&sessionv1.ToolResult{CallId: "a"}))
	if got := r.Running(); len(got) != 1 || got[0] != "read" {
		t.Fatalf("Running = %v, want [read]", got)
	}
}

func TestTrimExitNote(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"hi\n[exit code: 0]\n": "hi",
		"[exit code: 2]":       "",
		"hi\n":                 "hi\n",
		"a\n[exit code: x\n":   "a\n[exit code: x\n",
	} {
		if got := trimExitNote(in); got != want {
			t.Errorf("trimExitNote(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLineDiff(t *testing.T) {
	t.Parallel()
	tests := []struct {
		a, b string
		want string
	}{
		{"", "x\n", "+x"},
		{"a\nb\nc\n", "a\nB\nc\n", " a-b+B c"},
		{"a\n", "", "-a"},
	}
	for _, tt := range tests {
		var got string
		for _, op := range lineDiff(tt.a, tt.b) {
			got += string(op.kind) + op.text
		}
		if got != tt.want {
			t.Errorf("lineDiff(%q, %q) = %q, want %q", tt.a, tt.b, got, tt.want)
		}
	}
}

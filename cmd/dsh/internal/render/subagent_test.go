package render

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

func TestSubagentCard(t *testing.T) {
	start := func(s *sessionv1.SubagentStart) *sessionv1.SessionEvent {
		return &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_SubagentStart{SubagentStart: s}}
	}
	end := func(e *sessionv1.SubagentEnd) *sessionv1.SessionEvent {
		return &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_SubagentEnd{SubagentEnd: e}}
	}
	evs := []*sessionv1.SessionEvent{
		ev(&sessionv1.ToolCall{Turn: 1, Step: 1, CallId: "c1", Name: "subagent", Arguments: `{"description":"find the bug","prompt":"…"}`}),
		start(&sessionv1.SubagentStart{ChildSession: "k1", Description: "find the bug", Mode: sessionv1.SubagentMode_SUBAGENT_MODE_SPAWN, ToolCallId: "c1", Turn: 1}),
		end(&sessionv1.SubagentEnd{ChildSession: "k1", Outcome: "completed", ToolCallId: "c1", Usage: &llmv1.TokenUsage{InputTokens: 12000, OutputTokens: 340}}),
		ev(&sessionv1.ToolResult{Turn: 1, Step: 1, CallId: "c1", Content: []*llmv1.ContentBlock{text("The bug is in parse.go:42.")}}),
		start(&sessionv1.SubagentStart{ChildSession: "k2", Description: "run the suite", Mode: sessionv1.SubagentMode_SUBAGENT_MODE_FORK, Background: true, TaskId: "subagent-1"}),
		end(&sessionv1.SubagentEnd{ChildSession: "k2", Outcome: "aborted", Error: "the subagent's turn was cancelled", Usage: &llmv1.TokenUsage{}}),
	}
	for _, color := range []bool{false, true} {
		var b bytes.Buffer
		r := New(&b, Options{Color: color})
		for _, e := range evs {
			r.Event(e)
		}
		file := filepath.Join("testdata", "subagent.txt")
		if color {
			file = filepath.Join("testdata", "subagent.ansi.txt")
		}
		if *update {
			if err := os.WriteFile(file, b.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if b.String() != string(want) {
			t.Fatalf("%s differs:\n--- got\n%s--- want\n%s", file, b.String(), want)
		}
	}
}

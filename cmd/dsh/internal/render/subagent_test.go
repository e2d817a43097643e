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

func TestCompactionCard(t *testing.T) {
	two := int32(2)
	evs := []*sessionv1.SessionEvent{
		{Payload: &sessionv1.SessionEvent_CompactStart{CompactStart: &sessionv1.CompactStart{Turn: &two, Trigger: sessionv1.CompactTrigger_COMPACT_TRIGGER_CONTEXT_OVERFLOW}}},
		{Payload: &sessionv1.SessionEvent_CompactSummary{CompactSummary: &sessionv1.CompactSummary{Summary: "The user asked for a parser.\nlexer.go was fixed.\nTests pass.\nNext: docs.",
			ShadowedSeqs: []int64{1, 9, 11}, ShadowedTokenCount: 12345}}},
		{SurfaceOp: &sessionv1.SurfaceOp{Op: &sessionv1.SurfaceOp_Replace{Replace: &sessionv1.SurfaceReplace{Start: 1, End: 11}}},
			Payload: &sessionv1.SessionEvent_UserMessage{UserMessage: &sessionv1.UserMessage{Content: []*llmv1.ContentBlock{text("checkpoint: not shown")}}}},
		{Payload: &sessionv1.SessionEvent_CompactEnd{CompactEnd: &sessionv1.CompactEnd{Turn: &two}}},
		{SurfaceOp: &sessionv1.SurfaceOp{Op: &sessionv1.SurfaceOp_Replace{Replace: &sessionv1.SurfaceReplace{Start: 20, End: 20}}},
			Payload: &sessionv1.SessionEvent_ToolResult{ToolResult: &sessionv1.ToolResult{CallId: "c7", Content: []*llmv1.ContentBlock{text("head … tail")}}}},
		{Payload: &sessionv1.SessionEvent_CompactStart{CompactStart: &sessionv1.CompactStart{Turn: &two, Trigger: sessionv1.CompactTrigger_COMPACT_TRIGGER_MANUAL}}},
		{Payload: &sessionv1.SessionEvent_CompactEnd{CompactEnd: &sessionv1.CompactEnd{Turn: &two, Error: "the summary (900 tokens) does not shrink the 800 tokens it would replace"}}},
	}
	for _, color := range []bool{false, true} {
		var b bytes.Buffer
		r := New(&b, Options{Color: color, ShowUser: true})
		for _, e := range evs {
			r.Event(e)
		}
		file := filepath.Join("testdata", "compaction.txt")
		if color {
			file = filepath.Join("testdata", "compaction.ansi.txt")
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

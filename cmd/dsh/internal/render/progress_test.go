package render

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

func prog(call, text string) *agentv1.ToolProgress {
	return &agentv1.ToolProgress{CallId: call, ToolName: "build", Output: &toolsv1.ToolOutput{Stream: "stdout", Text: text}}
}

// A running card's live tail keeps the last lines (a partial one included)
// and goes away with the result; output of a call that is not running is
// ignored.
func TestProgressLiveTail(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	r := New(&buf, Options{})
	r.Event(ev(&sessionv1.ToolCall{CallId: "c1", Name: "build", Arguments: "{}"}))
	r.Progress(prog("c1", "one\ntwo\n"))
	r.Progress(prog("c1", "three\nfo"))
	r.Progress(prog("c1", "ur\r\nfive"))
	r.Progress(prog("other", "not running\n"))
	want := []string{"  ┊ build: three", "  ┊ build: four", "  ┊ build: five"}
	if diff := cmp.Diff(want, r.LiveTail()); diff != "" {
		t.Errorf("tail (-want +got):\n%s", diff)
	}
	if strings.Contains(buf.String(), "┊") {
		t.Errorf("printed progress without PrintProgress:\n%s", buf.String())
	}
	r.Event(ev(&sessionv1.ToolResult{CallId: "c1", Content: []*llmv1.ContentBlock{text("ok")}}))
	if got := r.LiveTail(); len(got) != 0 {
		t.Errorf("tail after the result: %q", got)
	}
	r.Progress(prog("c1", "late\n"))
	if got := r.LiveTail(); len(got) != 0 {
		t.Errorf("tail from late progress: %q", got)
	}
}

// Without a terminal, complete lines print under the card as they come.
func TestProgressPrinted(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	r := New(&buf, Options{PrintProgress: true})
	r.Event(ev(&sessionv1.ToolCall{CallId: "c1", Name: "build", Arguments: "{}"}))
	r.Progress(prog("c1", "compiling\nlink"))
	r.Progress(prog("c1", "ing\n"))
	want := "⏺ build {}\n  ┊ compiling\n  ┊ linking\n"
	if buf.String() != want {
		t.Errorf("output %q, want %q", buf.String(), want)
	}
}

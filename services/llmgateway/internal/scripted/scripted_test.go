package scripted

import (
	"encoding/json"
	"strings"
	"testing"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/providertest"
)

func text(s string) *llmv1.ContentBlock {
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}
}

func user(s string) *llmv1.Message {
	return &llmv1.Message{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{text(s)}}
}

func assistant() *llmv1.Message {
	return &llmv1.Message{Role: llmv1.Role_ROLE_ASSISTANT, Content: []*llmv1.ContentBlock{text("…")}}
}

func toolResult(id, out string) *llmv1.Message {
	return &llmv1.Message{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{{Block: &llmv1.ContentBlock_ToolResult{ToolResult: &llmv1.ToolResultBlock{ToolCallId: id, Content: []*llmv1.ContentBlock{text(out)}}}}}}
}

func req(msgs ...*llmv1.Message) *llmv1.GenerateRequest {
	return &llmv1.GenerateRequest{Provider: "scripted", Model: "demo", Messages: msgs}
}

func TestDemo(t *testing.T) {
	t.Parallel()
	a := New(Demo())
	first := providertest.Collect(t, t.Context(), a, req(user("hello")))
	providertest.Golden(t, "testdata/golden/demo_step0.chunks", first)
	var call *llmv1.ToolCallBlock
	for _, c := range first {
		if tc := c.GetBlockEnd().GetBlock().GetToolCall(); tc != nil {
			call = tc
		}
	}
	if call == nil || call.GetName() != "bash" || !json.Valid([]byte(call.GetArguments())) {
		t.Fatalf("first demo step has no valid bash call: %v", call)
	}
	second := providertest.Collect(t, t.Context(), a, req(user("hello"), assistant(), toolResult(call.GetId(), "hello from dsh\nLinux")))
	providertest.Golden(t, "testdata/golden/demo_step1.chunks", second)
	// A new user turn starts over at step 0.
	third := providertest.Collect(t, t.Context(), a, req(user("hello"), assistant(), toolResult(call.GetId(), "x"), assistant(), user("again")))
	if providertest.Finish(third).GetReason().GetToolCalls() == nil {
		t.Errorf("new turn did not restart at step 0: %s", providertest.Format(third))
	}
}

func TestStepRule(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		msgs       []*llmv1.Message
		turn, step int
	}{
		{"first call", []*llmv1.Message{user("a")}, 0, 0},
		{"after tool results", []*llmv1.Message{user("a"), assistant(), toolResult("c", "x")}, 0, 1},
		{"two tool rounds", []*llmv1.Message{user("a"), assistant(), toolResult("c", "x"), assistant(), toolResult("d", "y")}, 0, 2},
		{"second turn", []*llmv1.Message{user("a"), assistant(), user("b")}, 1, 0},
		{"no user message", []*llmv1.Message{assistant(), assistant()}, 0, 2},
		{"a session-prefix reminder is no turn", []*llmv1.Message{user("<system-reminder>\nskills\n</system-reminder>"), user("a"), assistant(), user("b")}, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			turn, step := position(tt.msgs)
			if turn != tt.turn || step != tt.step {
				t.Errorf("position = (%d, %d), want (%d, %d)", turn, step, tt.turn, tt.step)
			}
		})
	}
}

func TestScriptFeatures(t *testing.T) {
	t.Parallel()
	s, err := Parse([]byte(`{
		"sequential": true,
		"steps": [
			{"failure": {"code": "RATE_LIMIT", "message": "slow down", "status": 429, "retry_after_ms": 1500}},
			{"text": "partial answer", "finish": "max-tokens", "usage": {"input_tokens": 10, "output_tokens": 3}},
			{"tool_calls": [{"id": "c1", "name": "raw", "arguments": "{\"broken\":"}]}
		]}`))
	if err != nil {
		t.Fatal(err)
	}
	a := New(s)
	r := req(user("x"))
	c := providertest.Collect(t, t.Context(), a, r)
	f := providertest.Finish(c).GetReason().GetError().GetFailure()
	if f.GetCode() != "RATE_LIMIT" || f.GetStatus() != 429 || f.GetProviderRetryAfterMs() != 1500 {
		t.Errorf("failure = %v", f)
	}
	c = providertest.Collect(t, t.Context(), a, r)
	if providertest.Finish(c).GetReason().GetMaxTokens() == nil || c[len(c)-2].GetUsage().GetUsage().GetOutputTokens() != 3 {
		t.Errorf("max-tokens step:\n%s", providertest.Format(c))
	}
	c = providertest.Collect(t, t.Context(), a, r)
	if got := c[len(c)-3].GetBlockEnd().GetBlock().GetToolCall().GetArguments(); got != `{"broken":` {
		t.Errorf("raw arguments = %q", got)
	}
	c = providertest.Collect(t, t.Context(), a, r)
	if providertest.FailureCode(c) != provider.CodeInvalidRequest {
		t.Errorf("past the end: %s", providertest.Format(c))
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	for _, in := range []string{`{}`, `[]`, `[{"tool_calls":[{"arguments":{}}]}]`, `[{"failure":{}}]`, `[{"finish":"bogus"}]`, `{"steps":`} {
		if _, err := Parse([]byte(in)); err == nil {
			t.Errorf("Parse(%s) succeeded", in)
		}
	}
	if _, err := Load(`[{"text":"inline"}]`); err != nil {
		t.Errorf("inline script: %v", err)
	}
	if _, err := Load("/nonexistent/script.json"); err == nil || !strings.Contains(err.Error(), "read script") {
		t.Errorf("missing file: %v", err)
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	providertest.Run(t, func(t *testing.T, m providertest.Mode) providertest.Subject {
		s := Script{Steps: []Step{{Text: "one two three"}}}
		if m == providertest.Stall {
			// The block-start arrives at once; the first delta waits a minute.
			s.Steps[0] = Step{Reasoning: "r", Text: "slow text", DelayMS: 60_000}
		}
		return providertest.Subject{Adapter: New(s), Request: req(user("x"))}
	})
}

// TestTitle: a purpose-TITLE call is answered apart from the steps (a
// sequential script's counter is not consumed) and deterministically.
func TestTitle(t *testing.T) {
	t.Parallel()
	titled := func(r *llmv1.GenerateRequest) *llmv1.GenerateRequest {
		r.Purpose = llmv1.Purpose_PURPOSE_TITLE
		return r
	}
	textOf := func(chunks []*llmv1.StreamChunk) string {
		var b strings.Builder
		for _, c := range chunks {
			b.WriteString(c.GetBlockEnd().GetBlock().GetText().GetText())
		}
		return b.String()
	}
	seq := New(Script{Sequential: true, Steps: []Step{{Text: "one"}, {Text: "two"}}})
	tests := []struct {
		name string
		a    *Adapter
		req  *llmv1.GenerateRequest
		want string
	}{
		{"default: first words", seq, titled(req(user("please fix the flaky login test in ci today"))), "please fix the flaky login test"},
		{"script title", New(Script{Title: "Fixed title", Steps: []Step{{Text: "x"}}}), titled(req(user("anything"))), "Fixed title"},
		{"no user text", seq, titled(req()), "Untitled session"},
	}
	for _, tt := range tests {
		got := textOf(providertest.Collect(t, t.Context(), tt.a, tt.req))
		if got != tt.want {
			t.Errorf("%s: title %q, want %q", tt.name, got, tt.want)
		}
	}
	if got := textOf(providertest.Collect(t, t.Context(), seq, req(user("hi")))); got != "one" {
		t.Errorf("a title call consumed a sequential step: first step answered %q", got)
	}
}

func textOf(chunks []*llmv1.StreamChunk) string {
	var sb strings.Builder
	for _, c := range chunks {
		sb.WriteString(c.GetTextDelta().GetText())
	}
	return sb.String()
}

func TestContextWindow(t *testing.T) {
	t.Parallel()
	s := Script{Sequential: true, Models: []provider.Model{{ID: "small", ContextWindow: 100}},
		Steps: []Step{{Text: "first"}, {Text: "second"}}}
	a := New(s)
	small := func(text string) *llmv1.GenerateRequest {
		return &llmv1.GenerateRequest{Provider: "scripted", Model: "small", Messages: []*llmv1.Message{user(text)}}
	}
	tests := []struct {
		name, text, code, want string
	}{
		{name: "under the window answers the next step", text: "hi", want: "first"},
		{name: "over the window fails without consuming a step", text: strings.Repeat("x", 400), code: provider.CodeContextWindowExceeded},
		{name: "the step is still there", text: "hi again", want: "second"},
	}
	for _, tc := range tests { // sequential on purpose: one adapter, one counter
		chunks := providertest.Collect(t, t.Context(), a, small(tc.text))
		if got := providertest.FailureCode(chunks); got != tc.code {
			t.Fatalf("%s: failure %q, want %q: %s", tc.name, got, tc.code, providertest.Format(chunks))
		}
		if got := textOf(chunks); tc.code == "" && got != tc.want {
			t.Fatalf("%s: text %q, want %q", tc.name, got, tc.want)
		}
		if tc.code != "" && !strings.Contains(providertest.Finish(chunks).GetReason().GetError().GetFailure().GetMessage(), "context window") {
			t.Fatalf("%s: the failure does not say why: %s", tc.name, providertest.Format(chunks))
		}
	}
	// A model without a declared window takes anything.
	big := &llmv1.GenerateRequest{Provider: "scripted", Model: "other", Messages: []*llmv1.Message{user(strings.Repeat("x", 4000))}}
	if code := providertest.FailureCode(providertest.Collect(t, t.Context(), New(Script{Steps: []Step{{Text: "ok"}}}), big)); code != "" {
		t.Fatalf("no window declared, still failed: %s", code)
	}
}

func TestCompactionCallsAreApart(t *testing.T) {
	t.Parallel()
	a := New(Script{Sequential: true, Steps: []Step{{Text: "one"}, {Text: "two"}}})
	compaction := func() *llmv1.GenerateRequest {
		r := req(user("please fix the parser in lexer.go"), assistant(), toolResult("c", strings.Repeat("out ", 500)),
			&llmv1.Message{Role: llmv1.Role_ROLE_ASSISTANT, Content: []*llmv1.ContentBlock{text("I fixed it.")}}, user("Summarize the conversation."))
		r.Purpose = llmv1.Purpose_PURPOSE_COMPACTION
		return r
	}
	first := textOf(providertest.Collect(t, t.Context(), a, compaction()))
	want := "Scripted summary of 4 messages (1 tool results). First request: please fix the parser in lexer.go. Latest answer: I fixed it.."
	if first != want {
		t.Fatalf("summary %q, want %q", first, want)
	}
	if again := textOf(providertest.Collect(t, t.Context(), a, compaction())); again != first {
		t.Fatalf("not deterministic: %q then %q", first, again)
	}
	if got := textOf(providertest.Collect(t, t.Context(), a, req(user("go")))); got != "one" {
		t.Fatalf("a compaction call consumed a step: got %q", got)
	}
	fixed := New(Script{Summary: "fixed summary", Steps: []Step{{Text: "x"}}})
	if got := textOf(providertest.Collect(t, t.Context(), fixed, compaction())); got != "fixed summary" {
		t.Fatalf("script summary: %q", got)
	}
	// The checkpoint is not a turn: after it, the step index keeps counting.
	turn, step := position([]*llmv1.Message{user("<compacted-summary>s</compacted-summary>"), assistant(), toolResult("c", "x")})
	if turn != 0 || step != 1 {
		t.Fatalf("position after a checkpoint = (%d, %d)", turn, step)
	}
}

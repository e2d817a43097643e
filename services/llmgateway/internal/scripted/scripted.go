// Package scripted is a deterministic provider for tests and offline demos.
// Its responses come from a Script (JSON, from a file or inline) rather than
// a model, and it names itself as what it is: kind "scripted".
//
// # Which step answers
//
// By default the adapter is stateless: the step is chosen from the request
// alone, so the same request always gets the same answer. A message is
// user-authored when it has the user role and holds at least one block that
// is not a tool result nor a text starting with <system-reminder> (a
// session prefix). The step index is the number of assistant messages
// after the last user-authored message (all of them when there is none): the
// first call of a turn gets step 0, the call after its tool results step 1,
// and so on. With Turns, the turn index is the number of user-authored
// messages minus one (the last turn repeats). A step index past the end
// answers finish{error, INVALID_REQUEST} naming the script's length.
//
// With Sequential, steps are instead consumed in call order by a counter of
// the adapter instance, so a retry of the same request can get a different
// answer (a scripted RATE_LIMIT, then success).
//
// A session-title call (purpose TITLE) is answered apart from the steps:
// with Script.Title, else the first words of its last user message. A
// compaction call (purpose COMPACTION) is too, so a Sequential script is not
// consumed by it: with Script.Summary, else a deterministic digest of the
// messages it summarizes (their count, the first request, the latest
// answer), short by construction. A user message holding a
// <compacted-summary> (the agent's compaction checkpoint) is not a turn of
// its own.
//
// # The context window
//
// A model of Script.Models with a context_window enforces it as a real
// provider does: a request whose estimate (session.EstimateRequest, the
// agent's token meter heuristic, so both agree) is over the window ends with
// finish{error, CONTEXT_WINDOW_EXCEEDED} before any content, and consumes no
// step.
//
// # A step's stream
//
// Reasoning, then text, then tool calls, each streamed in small deltas
// (words for text, 16-byte pieces for arguments) with DelayMS between
// chunks; then usage; then the finish (tool-calls when the step has calls,
// else stop or the step's Finish). A step with a Failure streams its content
// first and then ends with finish{error|aborted, failure}.
package scripted

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"os"
	"strings"
	"sync/atomic"
	"time"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
)

// Script is the scripted provider's program.
type Script struct {
	// Steps answer every turn (see the package doc for the step rule).
	Steps []Step `json:"steps,omitempty"`
	// Turns, when set, gives each user turn its own steps.
	Turns [][]Step `json:"turns,omitempty"`
	// Sequential consumes steps in call order instead of by request.
	Sequential bool `json:"sequential,omitempty"`
	// Models is the advisory catalogue; default one model "scripted".
	Models []provider.Model `json:"models,omitempty"`
	// Title answers every session-title call (purpose TITLE); empty means
	// the first words of the request's last user message. Title calls never
	// consume a step.
	Title string `json:"title,omitempty"`
	// Summary answers every compaction call (purpose COMPACTION); empty
	// means a deterministic digest of the summarized messages. Compaction
	// calls never consume a step.
	Summary string `json:"summary,omitempty"`
}

// Step is one scripted model response.
type Step struct {
	Reasoning string     `json:"reasoning,omitempty"`
	Text      string     `json:"text,omitempty"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// DelayMS pauses before every chunk (simulated latency).
	DelayMS int `json:"delay_ms,omitempty"`
	// Failure ends the step with a failed finish after its content.
	Failure *Failure `json:"failure,omitempty"`
	// Finish overrides the finish reason: "stop", "max-tokens",
	// "tool-calls".
	Finish string `json:"finish,omitempty"`
	// Usage overrides the computed usage (characters / 4).
	Usage *Usage `json:"usage,omitempty"`
}

// ToolCall is one scripted call. Arguments is any JSON value: an object is
// sent as its exact text; a string is sent as its contents verbatim (so a
// script can produce invalid JSON on purpose).
type ToolCall struct {
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// Failure is a scripted provider failure.
type Failure struct {
	Code         string `json:"code"`
	Message      string `json:"message,omitempty"`
	Status       int    `json:"status,omitempty"`
	RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
}

// Usage is scripted token usage.
type Usage struct {
	Input      int64  `json:"input_tokens"`
	Output     int64  `json:"output_tokens"`
	CacheRead  *int64 `json:"cache_read_tokens,omitempty"`
	CacheWrite *int64 `json:"cache_write_tokens,omitempty"`
}

// LastToolResult in a step's text is replaced by the text of the last tool
// result in the request (trimmed to 500 bytes).
const LastToolResult = "{{last_tool_result}}"

// DemoContextWindow is the demo model's window: small, so that a chat of a
// few turns reaches the gateway's demo compaction threshold, yet roomy
// enough for a workspace's instruction files.
const DemoContextWindow = 12_000

// Demo is the built-in demo script used when no provider key is set: the
// first call of every turn answers with a little reasoning, a sentence and
// one harmless bash call; the call after the tool result summarises it.
func Demo() Script {
	return Script{
		Models: []provider.Model{{ID: "demo", Name: "Scripted demo", Description: "built-in offline demo script (no model behind it); a small window, so a long chat shows a compaction", ContextWindow: DemoContextWindow}},
		Steps: []Step{
			{
				Reasoning: "The user said something. This is the scripted demo, so I will show the tool loop with a harmless command.",
				Text:      "Hello! I am dsh's scripted demo model: no API key is set, so a built-in script is answering. Let me run a harmless command to show how tools work.",
				ToolCalls: []ToolCall{{Name: "bash", Arguments: json.RawMessage(`{"command":"echo hello from dsh && uname -s","description":"Say hello"}`)}},
				DelayMS:   15,
			},
			{
				Text:    "The tool answered:\n\n" + LastToolResult + "\n\nThat was one full turn: model, tool call, tool result, model. To talk to a real model, set DEEPSEEK_API_KEY, ANTHROPIC_API_KEY, or OPENAI_API_KEY (with OPENAI_BASE_URL for vLLM, Ollama or llama.cpp) and start dsh again.",
				DelayMS: 15,
			},
		},
	}
}

// Parse reads a script from JSON: either a Script object or a bare array of
// steps.
func Parse(b []byte) (Script, error) {
	var s Script
	trimmed := strings.TrimSpace(string(b))
	if strings.HasPrefix(trimmed, "[") {
		if err := json.Unmarshal(b, &s.Steps); err != nil {
			return Script{}, fmt.Errorf("scripted: parse steps: %w", err)
		}
	} else if err := json.Unmarshal(b, &s); err != nil {
		return Script{}, fmt.Errorf("scripted: parse script: %w", err)
	}
	if len(s.Steps) == 0 && len(s.Turns) == 0 {
		return Script{}, errors.New("scripted: the script has no steps")
	}
	for i, st := range allSteps(s) {
		for j, tc := range st.ToolCalls {
			if tc.Name == "" {
				return Script{}, fmt.Errorf("scripted: step %d tool call %d has no name", i, j)
			}
			if len(tc.Arguments) > 0 && !json.Valid(tc.Arguments) {
				return Script{}, fmt.Errorf("scripted: step %d tool call %d: arguments are not JSON", i, j)
			}
		}
		if st.Failure != nil && st.Failure.Code == "" {
			return Script{}, fmt.Errorf("scripted: step %d failure has no code", i)
		}
		switch st.Finish {
		case "", "stop", "max-tokens", "tool-calls":
		default:
			return Script{}, fmt.Errorf("scripted: step %d: unknown finish %q (want stop, max-tokens or tool-calls)", i, st.Finish)
		}
	}
	return s, nil
}

// Load reads a script from a file path, or parses src itself when it starts
// with "{" or "[" (inline JSON).
func Load(src string) (Script, error) {
	t := strings.TrimSpace(src)
	if strings.HasPrefix(t, "{") || strings.HasPrefix(t, "[") {
		return Parse([]byte(t))
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return Script{}, fmt.Errorf("scripted: read script: %w", err)
	}
	return Parse(b)
}

func allSteps(s Script) []Step {
	out := append([]Step(nil), s.Steps...)
	for _, t := range s.Turns {
		out = append(out, t...)
	}
	return out
}

// Adapter serves a Script.
type Adapter struct {
	script Script
	calls  atomic.Int64
	// Sleep waits between chunks; it must return ctx.Err() when ctx ends.
	sleep func(ctx context.Context, d time.Duration) error
}

var _ provider.Adapter = (*Adapter)(nil)

// New returns an adapter for s.
func New(s Script) *Adapter {
	if len(s.Models) == 0 {
		s.Models = []provider.Model{{ID: "scripted", Name: "Scripted", Description: "deterministic scripted responses"}}
	}
	return &Adapter{script: s, sleep: sleep}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Kind implements provider.Adapter.
func (a *Adapter) Kind() string { return "scripted" }

// Models implements provider.Adapter.
func (a *Adapter) Models() []provider.Model { return a.script.Models }

// Validate implements provider.Adapter; the scripted provider ignores
// content, so it takes images too.
func (a *Adapter) Validate(*llmv1.GenerateRequest) error { return nil }

// titleWords is how many words a default scripted title takes.
const titleWords = 6

// title answers a purpose-TITLE call: the script's Title, or the first
// words of the last user-authored message.
func (a *Adapter) title(req *llmv1.GenerateRequest) Step {
	if a.script.Title != "" {
		return Step{Text: a.script.Title}
	}
	msgs := req.GetMessages()
	for i := len(msgs) - 1; i >= 0; i-- {
		if !userAuthored(msgs[i]) {
			continue
		}
		var sb strings.Builder
		for _, b := range msgs[i].GetContent() {
			sb.WriteString(b.GetText().GetText() + " ")
		}
		words := strings.Fields(sb.String())
		if len(words) > titleWords {
			words = words[:titleWords]
		}
		if len(words) > 0 {
			return Step{Text: strings.Join(words, " ")}
		}
	}
	return Step{Text: "Untitled session"}
}

// summaryBytes caps each quoted piece of a default digest.
const summaryBytes = 200

// summary answers a purpose-COMPACTION call: the script's Summary, or a
// digest of the messages before the final instruction.
func (a *Adapter) summary(req *llmv1.GenerateRequest) Step {
	if a.script.Summary != "" {
		return Step{Text: a.script.Summary}
	}
	msgs := req.GetMessages()
	if n := len(msgs); n > 0 {
		msgs = msgs[:n-1] // the instruction
	}
	var results int
	var first, latest string
	for _, m := range msgs {
		for _, b := range m.GetContent() {
			switch {
			case b.GetToolResult() != nil:
				results++
			case m.GetRole() == llmv1.Role_ROLE_ASSISTANT && b.GetText() != nil:
				latest = b.GetText().GetText()
			case first == "" && userAuthored(m) && b.GetText() != nil:
				first = b.GetText().GetText()
			}
		}
	}
	return Step{Text: fmt.Sprintf("Scripted summary of %d messages (%d tool results). First request: %s. Latest answer: %s.",
		len(msgs), results, clip(first), clip(latest))}
}

func clip(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > summaryBytes {
		s = strings.ToValidUTF8(s[:summaryBytes], "") + "…"
	}
	if s == "" {
		return "(none)"
	}
	return s
}

// overWindow returns the CONTEXT_WINDOW_EXCEEDED failure of a request over
// its model's declared window, or nil.
func (a *Adapter) overWindow(req *llmv1.GenerateRequest) *provider.Failure {
	for _, m := range a.script.Models {
		if m.ID != req.GetModel() || m.ContextWindow <= 0 {
			continue
		}
		if n := session.EstimateRequest(req); n > m.ContextWindow {
			return &provider.Failure{Code: provider.CodeContextWindowExceeded, Status: 400, Message: fmt.Sprintf(
				"scripted: the request has about %d tokens, over the %d-token context window of model %q", n, m.ContextWindow, m.ID)}
		}
	}
	return nil
}

// pick returns the step for req.
func (a *Adapter) pick(req *llmv1.GenerateRequest) (Step, error) {
	switch req.GetPurpose() {
	case llmv1.Purpose_PURPOSE_TITLE:
		return a.title(req), nil
	case llmv1.Purpose_PURPOSE_COMPACTION:
		return a.summary(req), nil
	}
	steps := a.script.Steps
	var idx int
	if a.script.Sequential {
		idx = int(a.calls.Add(1) - 1)
		if len(steps) == 0 {
			steps = allSteps(a.script)
		}
	} else {
		turn, step := position(req.GetMessages())
		idx = step
		if len(a.script.Turns) > 0 {
			steps = a.script.Turns[min(turn, len(a.script.Turns)-1)]
		}
	}
	if idx >= len(steps) {
		return Step{}, &provider.Failure{Code: provider.CodeInvalidRequest, Message: fmt.Sprintf("scripted: no step %d in the script (it has %d)", idx, len(steps))}
	}
	return steps[idx], nil
}

// position returns the turn index (user-authored messages − 1) and the step
// index (assistant messages after the last user-authored message).
func position(msgs []*llmv1.Message) (turn, step int) {
	turn = -1
	for _, m := range msgs {
		switch {
		case userAuthored(m):
			turn++
			step = 0
		case m.GetRole() == llmv1.Role_ROLE_ASSISTANT:
			step++
		}
	}
	return max(turn, 0), step
}

// userAuthored: a user message with a block that is neither a tool result
// nor a <system-reminder> (the agent's session prefix, such as the skill
// catalog, is not a turn of its own).
func userAuthored(m *llmv1.Message) bool {
	if m.GetRole() != llmv1.Role_ROLE_USER {
		return false
	}
	for _, b := range m.GetContent() {
		t := b.GetText().GetText()
		if strings.Contains(t, "<compacted-summary>") {
			return false
		}
		if b.GetToolResult() == nil && !strings.HasPrefix(t, "<system-reminder>") {
			return true
		}
	}
	return false
}

func lastToolResult(msgs []*llmv1.Message) string {
	for i := len(msgs) - 1; i >= 0; i-- {
		c := msgs[i].GetContent()
		for j := len(c) - 1; j >= 0; j-- {
			if tr := c[j].GetToolResult(); tr != nil {
				var sb strings.Builder
				for _, b := range tr.GetContent() {
					sb.WriteString(b.GetText().GetText())
				}
				s := strings.TrimSpace(sb.String())
				if len(s) > 500 {
					s = strings.ToValidUTF8(s[:500], "") + "…"
				}
				if s == "" {
					s = "(no output)"
				}
				return s
			}
		}
	}
	return "(no tool result)"
}

// Stream implements provider.Adapter.
func (a *Adapter) Stream(ctx context.Context, req *llmv1.GenerateRequest) iter.Seq2[*llmv1.StreamChunk, error] {
	return func(yield func(*llmv1.StreamChunk, error) bool) {
		e := provider.NewEmitter(yield)
		if f := a.overWindow(req); f != nil {
			e.Fail(f)
			return
		}
		st, err := a.pick(req)
		if err != nil {
			yield(nil, err)
			return
		}
		delay := time.Duration(st.DelayMS) * time.Millisecond
		// Boundaries (provider's package doc): one now, so the gateway
		// knows this stream marks them, and one before each pause, so
		// what was said before it leaves before it.
		if !e.Boundary() {
			return
		}
		wait := func() bool {
			if delay <= 0 {
				return ctx.Err() == nil
			}
			return e.Boundary() && a.sleep(ctx, delay) == nil
		}
		aborted := func() {
			e.Fail(&provider.Failure{Code: provider.CodeAborted, Message: "the caller cancelled the request"})
		}
		out := 0
		if st.Reasoning != "" {
			i, ok := e.Open(llmv1.BlockType_BLOCK_TYPE_REASONING)
			if !ok {
				return
			}
			for _, p := range words(st.Reasoning) {
				if !wait() {
					aborted()
					return
				}
				if !e.Reasoning(i, p) {
					return
				}
			}
			out += len(st.Reasoning)
			if !e.End(i) {
				return
			}
		}
		if text := strings.ReplaceAll(st.Text, LastToolResult, lastToolResult(req.GetMessages())); text != "" {
			i, ok := e.Open(llmv1.BlockType_BLOCK_TYPE_TEXT)
			if !ok {
				return
			}
			for _, p := range words(text) {
				if !wait() {
					aborted()
					return
				}
				if !e.Text(i, p) {
					return
				}
			}
			out += len(text)
			if !e.End(i) {
				return
			}
		}
		base := 0
		for _, m := range req.GetMessages() {
			if m.GetRole() == llmv1.Role_ROLE_ASSISTANT {
				base++
			}
		}
		for k, tc := range st.ToolCalls {
			id := tc.ID
			if id == "" {
				id = fmt.Sprintf("scripted-%d-%d", base, k)
			}
			args := arguments(tc.Arguments)
			i, ok := e.OpenToolCall(id, tc.Name)
			if !ok || !e.ToolArgs(i, tc.Name, "") {
				return
			}
			for _, p := range pieces(args, 16) {
				if !wait() {
					aborted()
					return
				}
				if !e.ToolArgs(i, "", p) {
					return
				}
			}
			out += len(args) + len(tc.Name)
			if !e.End(i) {
				return
			}
		}
		if st.Failure != nil {
			f := &provider.Failure{Code: st.Failure.Code, Message: st.Failure.Message, Status: st.Failure.Status, RetryAfter: time.Duration(st.Failure.RetryAfterMS) * time.Millisecond}
			if f.Message == "" {
				f.Message = "scripted failure " + f.Code
			}
			e.Fail(f)
			return
		}
		if !e.Usage(usage(st, req, out)) {
			return
		}
		reason := provider.Stop()
		switch {
		case st.Finish == "max-tokens":
			reason = provider.MaxTokens()
		case st.Finish == "tool-calls", st.Finish == "" && len(st.ToolCalls) > 0:
			reason = provider.ToolCalls()
		}
		e.Finish(reason, nil)
	}
}

func arguments(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "{}"
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

func usage(st Step, req *llmv1.GenerateRequest, out int) *llmv1.TokenUsage {
	if u := st.Usage; u != nil {
		return &llmv1.TokenUsage{InputTokens: u.Input, OutputTokens: u.Output, CacheReadTokens: u.CacheRead, CacheWriteTokens: u.CacheWrite}
	}
	in := len(req.GetSystem())
	for _, m := range req.GetMessages() {
		for _, b := range m.GetContent() {
			in += len(b.GetText().GetText()) + len(b.GetReasoning().GetText()) + len(b.GetToolCall().GetArguments())
			for _, rb := range b.GetToolResult().GetContent() {
				in += len(rb.GetText().GetText())
			}
		}
	}
	return &llmv1.TokenUsage{InputTokens: int64(in+3) / 4, OutputTokens: int64(out+3) / 4}
}

// words splits s after each space, keeping the spaces.
func words(s string) []string {
	var out []string
	for s != "" {
		i := strings.IndexByte(s, ' ')
		if i < 0 {
			out = append(out, s)
			break
		}
		out = append(out, s[:i+1])
		s = s[i+1:]
	}
	return out
}

// pieces splits s into pieces of about n bytes on rune boundaries.
func pieces(s string, n int) []string {
	var out []string
	for len(s) > n {
		cut := n
		for cut < len(s) && !isRuneStart(s[cut]) {
			cut++
		}
		out = append(out, s[:cut])
		s = s[cut:]
	}
	if s != "" {
		out = append(out, s)
	}
	return out
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

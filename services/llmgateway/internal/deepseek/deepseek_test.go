package deepseek

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/chat"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/providertest"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/upstream"
)

const testKey = "sk-test0123456789abcdef"

var fixedNow = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func newAdapter(t *testing.T, baseURL string, idle time.Duration) provider.Adapter {
	return New(chat.Config{
		BaseURL: baseURL,
		APIKey:  testKey,
		Client: upstream.Client{
			HTTP:        &http.Client{Transport: upstream.NewTransport()},
			UserAgent:   provider.DSH("1.2.3").UserAgent(),
			IdleTimeout: idle,
			Now:         func() time.Time { return fixedNow },
		},
	})
}

func text(s string) *llmv1.ContentBlock {
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}
}

func simpleRequest() *llmv1.GenerateRequest {
	return &llmv1.GenerateRequest{Provider: "deepseek", Model: "deepseek-v4-flash", Messages: []*llmv1.Message{{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{text("hi")}}}}
}

func errBody(msg, typ string) []byte {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": "invalid_request_error"}})
	return b
}

func TestStreams(t *testing.T) {
	t.Parallel()
	sse := func(name string) []byte { return providertest.ReadFile(t, name) }
	cases := []providertest.Case{
		{Name: "text", Reply: providertest.Reply{Body: sse("text.sse"), Header: map[string]string{"x-deepseek-request-id": "ds-req-1"}}, Golden: "text"},
		{Name: "text split every 3 bytes", Reply: providertest.Reply{Body: sse("text.sse"), Chunk: 3}, Golden: "text"},
		{Name: "reasoning", Reply: providertest.Reply{Body: sse("reasoning.sse")}, Golden: "reasoning"},
		{Name: "parallel tool calls split mid-UTF-8 and mid-escape", Reply: providertest.Reply{Body: sse("tool_calls.sse"), Chunk: 7}, Golden: "tool_calls"},
		{Name: "unknown finish reason", Reply: providertest.Reply{Body: sse("content_filter.sse")}, Code: "CONTENT_FILTER", Golden: "content_filter"},
		{Name: "error mid-stream", Reply: providertest.Reply{Body: sse("error_midstream.sse"), Header: map[string]string{"x-request-id": "req-mid"}}, Code: provider.CodeServer, RequestID: "req-mid", Golden: "error_midstream"},
		{Name: "missing DONE", Reply: providertest.Reply{Body: sse("missing_done.sse")}, Code: provider.CodeStreamClosed, Golden: "missing_done"},
		{Name: "malformed JSON line", Reply: providertest.Reply{Body: sse("malformed.sse")}, Code: provider.CodeMalformedResponse, Golden: "malformed_json_line"},
		{Name: "connection reset mid-stream", Reply: providertest.Reply{Body: sse("text.sse"), ResetAfter: providertest.After(t, sse("text.sse"), "Hello")}, Code: provider.CodeTransport, Golden: "connection_reset_mid_stream"},
		{Name: "stall longer than the idle bound", Reply: providertest.Reply{Body: sse("text.sse"), StallAfter: providertest.After(t, sse("text.sse"), "Hello")}, Idle: 100 * time.Millisecond, Code: provider.CodeTimeout, Golden: "stall"},
		{Name: "HTTP 401", Reply: providertest.Reply{Status: 401, Body: errBody("Authentication Fails, Your api key: "+testKey+" is invalid", "authentication_error"), Header: map[string]string{"x-deepseek-request-id": "ds-401"}}, Code: provider.CodeAuth, Status: 401, RequestID: "ds-401", Golden: "http401"},
		{Name: "HTTP 402 insufficient balance", Reply: providertest.Reply{Status: 402, Body: errBody("Insufficient Balance", "unknown_error")}, Code: provider.CodeQuota, Status: 402, Golden: "http_402_insufficient_balance"},
		{Name: "HTTP 429 Retry-After seconds", Reply: providertest.Reply{Status: 429, Body: errBody("Rate limit reached", "rate_limit_error"), Header: map[string]string{"Retry-After": "7"}}, Code: provider.CodeRateLimit, Status: 429, RetryAfterMS: 7000, Golden: "http429"},
		{Name: "HTTP 429 Retry-After date", Reply: providertest.Reply{Status: 429, Body: errBody("Rate limit reached", "rate_limit_error"), Header: map[string]string{"Retry-After": fixedNow.Add(90 * time.Second).Format(http.TimeFormat)}}, Code: provider.CodeRateLimit, Status: 429, RetryAfterMS: 90000, Golden: "http_429_retry_after_date"},
		{Name: "HTTP 400 context overflow", Reply: providertest.Reply{Status: 400, Body: errBody("This model's maximum context length is 131072 tokens. However, you requested 140000 tokens. Please reduce the length of the messages.", "invalid_request_error")}, Code: provider.CodeContextWindowExceeded, Status: 400, Golden: "http400_overflow"},
		{Name: "HTTP 400 other", Reply: providertest.Reply{Status: 400, Body: errBody("Invalid tools schema", "invalid_request_error")}, Code: provider.CodeInvalidRequest, Status: 400, Golden: "http_400_other"},
		{Name: "HTTP 500", Reply: providertest.Reply{Status: 500, Body: []byte("upstream exploded")}, Code: provider.CodeServer, Status: 500, Golden: "http500"},
		{Name: "HTTP 404", Reply: providertest.Reply{Status: 404, Body: []byte(`{"error":{"message":"Not Found"}}`)}, Code: "HTTP_404", Status: 404, Golden: "http_404"},
	}
	providertest.RunCases(t, cases, newAdapter, simpleRequest())
}

func TestTransportFailure(t *testing.T) {
	t.Parallel()
	// Nothing listens on port 1 of the loopback interface.
	a := newAdapter(t, "http://127.0.0.1:1", 0)
	chunks := providertest.Collect(t, t.Context(), a, simpleRequest())
	if got := providertest.FailureCode(chunks); got != provider.CodeTransport {
		t.Fatalf("code = %q, want TRANSPORT\n%s", got, providertest.Format(chunks))
	}
}

func TestNoKeyInFailures(t *testing.T) {
	t.Parallel()
	up := providertest.Serve(t, providertest.Reply{Status: 401, Body: errBody("bad key "+testKey+" and sk-otherkey123456789", "authentication_error")})
	chunks := providertest.Collect(t, t.Context(), newAdapter(t, up.URL, 0), simpleRequest())
	msg := providertest.Format(chunks)
	if strings.Contains(msg, testKey) || strings.Contains(msg, "otherkey123456789") {
		t.Fatalf("key leaked into the failure: %s", msg)
	}
}

// TestRequestWire checks the serialised request (golden), the headers
// (User-Agent, bearer key, compaction marker) and the pass-back rule.
func TestRequestWire(t *testing.T) {
	t.Parallel()
	up := providertest.Serve(t, providertest.Reply{Body: providertest.ReadFile(t, "text.sse")})
	a := newAdapter(t, up.URL, 0)
	call := func(id, args string) *llmv1.ContentBlock {
		return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_ToolCall{ToolCall: &llmv1.ToolCallBlock{Id: id, Name: "bash", Arguments: args}}}
	}
	reasoning := func(s string) *llmv1.ContentBlock {
		return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Reasoning{Reasoning: &llmv1.ReasoningBlock{Text: s}}}
	}
	result := func(id, s string) *llmv1.ContentBlock {
		var content []*llmv1.ContentBlock
		if s != "" {
			content = []*llmv1.ContentBlock{text(s)}
		}
		return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_ToolResult{ToolResult: &llmv1.ToolResultBlock{ToolCallId: id, Content: content}}}
	}
	req := &llmv1.GenerateRequest{
		Provider: "deepseek", Model: "deepseek-v4-pro", System: proto.String("You are terse."),
		Temperature: proto.Float64(0.2), MaxTokens: proto.Int32(512), Stop: []string{"END"},
		Purpose: llmv1.Purpose_PURPOSE_COMPACTION,
		Tools:   []*llmv1.ToolSchema{{Name: "bash", Description: "Run a command", Parameters: `{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}`}},
		Messages: []*llmv1.Message{
			{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{text("list files")}},
			{Role: llmv1.Role_ROLE_ASSISTANT, Content: []*llmv1.ContentBlock{reasoning("need ls"), text("Running ls."), call("call_1", `{"command":"ls"}`), call("call_2", `{"command":"pwd"`)}},
			{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{result("call_1", "a\nb"), result("call_2", "")}},
			{Role: llmv1.Role_ROLE_ASSISTANT, Content: []*llmv1.ContentBlock{reasoning("no tools: not passed back"), text("Two files.")}},
			{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{text("thanks"), {Block: &llmv1.ContentBlock_Extension{Extension: &llmv1.Extension{Type: "audio", Json: "{}"}}}}},
		},
	}
	providertest.Collect(t, t.Context(), a, req)
	seen := up.Requests()
	if len(seen) != 1 {
		t.Fatalf("upstream saw %d requests, want exactly 1", len(seen))
	}
	got := seen[0]
	if got.Path != "/chat/completions" {
		t.Errorf("path = %q", got.Path)
	}
	for k, want := range map[string]string{
		"User-Agent":                 "dsh/1.2.3 (+https://github.com/dsh-dev/dsh)",
		"Authorization":              "Bearer " + testKey,
		"X-Deepseek-Harness-Compact": "1",
		"Accept":                     "text/event-stream",
		"Content-Type":               "application/json",
	} {
		if v := got.Header.Get(k); v != want {
			t.Errorf("header %s = %q, want %q", k, v, want)
		}
	}
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, got.Body, "", "  "); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "golden", "request.json")
	if os.Getenv("DSH_UPDATE_GOLDEN") == "1" {
		_ = os.MkdirAll(filepath.Dir(golden), 0o755)
		if err := os.WriteFile(golden, pretty.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bytes.TrimSpace(want), bytes.TrimSpace(pretty.Bytes())) {
		t.Errorf("request body differs from %s:\n%s", golden, pretty.String())
	}
}

func TestNoCompactionHeaderOnConversation(t *testing.T) {
	t.Parallel()
	up := providertest.Serve(t, providertest.Reply{Body: providertest.ReadFile(t, "text.sse")})
	providertest.Collect(t, t.Context(), newAdapter(t, up.URL, 0), simpleRequest())
	if v := up.Requests()[0].Header.Get("X-Deepseek-Harness-Compact"); v != "" {
		t.Errorf("compaction header on a conversation request: %q", v)
	}
}

// TestRichContentDegraded: DeepSeek takes no images, audio or binary
// documents: each becomes a placeholder naming it, tool results join their
// blocks with newlines, user-only blocks stay out, and the request is sent
// (never INVALID_ARGUMENT: a session whose history holds an image must keep
// working on this route).
func TestRichContentDegraded(t *testing.T) {
	t.Parallel()
	body := providertest.RichContentBody(t, New(chat.Config{Route: "deepseek", BaseURL: "http://127.0.0.1:1"}), "deepseek", "deepseek-v4-flash")
	if bytes.Contains(body, []byte("base64,")) {
		t.Errorf("the body carries an image or SVG it cannot: %s", body)
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	providertest.Run(t, func(t *testing.T, m providertest.Mode) providertest.Subject {
		r := providertest.Reply{Body: providertest.ReadFile(t, "text.sse")}
		if m == providertest.Stall {
			r.StallAfter = providertest.After(t, r.Body, "Hello")
		}
		up := providertest.Serve(t, r)
		return providertest.Subject{Adapter: newAdapter(t, up.URL, 0), Request: simpleRequest(), Upstream: up}
	})
}

// FuzzStream: whatever bytes the provider sends, the adapter's stream is
// grammatical, ends with one finish, and every chunk can be marshalled.
func FuzzStream(f *testing.F) {
	for _, name := range []string{"text.sse", "reasoning.sse", "tool_calls.sse", "error_midstream.sse", "missing_done.sse", "malformed.sse", "content_filter.sse"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		a := New(chat.Config{BaseURL: "http://fuzz.invalid", Client: upstream.Client{HTTP: &http.Client{Transport: providertest.StaticTransport(body)}, UserAgent: "dsh/fuzz"}})
		providertest.FuzzGrammar(t, a, simpleRequest())
	})
}

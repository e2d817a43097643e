package anthropic

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/providertest"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/upstream"
)

const testKey = "sk-ant-api03-secretsecretsecret"

var fixedNow = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func newAdapter(t *testing.T, baseURL string, idle time.Duration) provider.Adapter {
	return New(Config{BaseURL: baseURL, APIKey: testKey, Client: upstream.Client{HTTP: &http.Client{Transport: upstream.NewTransport()}, UserAgent: provider.DSH("1.0.0").UserAgent(), IdleTimeout: idle, Now: func() time.Time { return fixedNow }}})
}

func text(s string) *llmv1.ContentBlock {
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}
}

func request() *llmv1.GenerateRequest {
	return &llmv1.GenerateRequest{Provider: "anthropic", Model: "claude-sonnet-4-5", Messages: []*llmv1.Message{{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{text("hi")}}}}
}

func errBody(typ, msg string) []byte {
	b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}})
	return b
}

func TestStreams(t *testing.T) {
	t.Parallel()
	sse := func(n string) []byte { return providertest.ReadFile(t, n) }
	providertest.RunCases(t, []providertest.Case{
		{Name: "text", Reply: providertest.Reply{Body: sse("text.sse"), Header: map[string]string{"request-id": "req_011"}}, Golden: "text"},
		{Name: "thinking, redacted thinking, tool_use split mid-UTF-8 and mid-escape", Reply: providertest.Reply{Body: sse("thinking_tools.sse"), Chunk: 11}, Golden: "thinking_tools"},
		{Name: "error event mid-stream", Reply: providertest.Reply{Body: sse("error_midstream.sse"), Header: map[string]string{"request-id": "req_err"}}, Code: provider.CodeServer, RequestID: "req_err", Golden: "error_midstream"},
		{Name: "missing message_stop", Reply: providertest.Reply{Body: sse("missing_stop.sse")}, Code: provider.CodeStreamClosed, Golden: "missing_stop"},
		{Name: "malformed JSON", Reply: providertest.Reply{Body: sse("malformed.sse")}, Code: provider.CodeMalformedResponse, Golden: "malformed_json"},
		{Name: "refusal", Reply: providertest.Reply{Body: sse("refusal.sse")}, Code: "REFUSAL", Golden: "refusal"},
		{Name: "connection reset", Reply: providertest.Reply{Body: sse("text.sse"), ResetAfter: providertest.After(t, sse("text.sse"), "Hello")}, Code: provider.CodeTransport, Golden: "connection_reset"},
		{Name: "stall", Reply: providertest.Reply{Body: sse("text.sse"), StallAfter: providertest.After(t, sse("text.sse"), "Hello")}, Idle: 100 * time.Millisecond, Code: provider.CodeTimeout, Golden: "stall"},
		{Name: "HTTP 401", Reply: providertest.Reply{Status: 401, Body: errBody("authentication_error", "invalid x-api-key")}, Code: provider.CodeAuth, Status: 401, Golden: "http_401"},
		{Name: "HTTP 429 Retry-After", Reply: providertest.Reply{Status: 429, Body: errBody("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"), Header: map[string]string{"retry-after": "30", "request-id": "req_429"}}, Code: provider.CodeRateLimit, Status: 429, RetryAfterMS: 30000, RequestID: "req_429", Golden: "http_429_retry_after"},
		{Name: "HTTP 429 Retry-After date", Reply: providertest.Reply{Status: 429, Body: errBody("rate_limit_error", "slow down"), Header: map[string]string{"retry-after": fixedNow.Add(2 * time.Minute).Format(http.TimeFormat)}}, Code: provider.CodeRateLimit, Status: 429, RetryAfterMS: 120000, Golden: "http_429_retry_after_date"},
		{Name: "HTTP 400 prompt too long", Reply: providertest.Reply{Status: 400, Body: errBody("invalid_request_error", "prompt is too long: 215000 tokens > 200000 maximum")}, Code: provider.CodeContextWindowExceeded, Status: 400, Golden: "http400_overflow"},
		{Name: "HTTP 400 credit balance", Reply: providertest.Reply{Status: 400, Body: errBody("invalid_request_error", "Your credit balance is too low to access the Anthropic API.")}, Code: provider.CodeQuota, Status: 400, Golden: "http_400_credit_balance"},
		{Name: "HTTP 529 overloaded", Reply: providertest.Reply{Status: 529, Body: errBody("overloaded_error", "Overloaded")}, Code: provider.CodeServer, Status: 529, Golden: "http_529_overloaded"},
	}, newAdapter, request())
}

// TestReplayRoundTrip streams thinking, folds the finish's replay state
// into the next request's history, and checks the signatures go back in
// place, cache breakpoints are set, and tool results lead the user turn.
func TestReplayRoundTrip(t *testing.T) {
	t.Parallel()
	up := providertest.Serve(t, providertest.Reply{Body: providertest.ReadFile(t, "thinking_tools.sse")})
	a := newAdapter(t, up.URL, 0)
	chunks := providertest.Collect(t, t.Context(), a, request())
	fin := providertest.Finish(chunks)
	if fin.ReplayState == nil {
		t.Fatal("no replay state on a thinking response")
	}
	var blocks []*llmv1.ContentBlock
	for _, c := range chunks {
		if be := c.GetBlockEnd(); be != nil {
			blocks = append(blocks, be.GetBlock())
		}
	}
	result := func(id string) *llmv1.ContentBlock {
		return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_ToolResult{ToolResult: &llmv1.ToolResultBlock{ToolCallId: id, Content: []*llmv1.ContentBlock{text("sunny")}}}}
	}
	req := &llmv1.GenerateRequest{
		Provider: "anthropic", Model: "claude-sonnet-4-5", System: proto.String("Be brief."), MaxTokens: proto.Int32(1024),
		Tools: []*llmv1.ToolSchema{{Name: "get_weather", Description: "Weather", Parameters: `{"type":"object"}`}, {Name: "get_time", Parameters: `{"type":"object"}`}},
		Messages: []*llmv1.Message{
			request().Messages[0],
			{Role: llmv1.Role_ROLE_ASSISTANT, Content: blocks, Provenance: &llmv1.AssistantProvenance{Provider: "anthropic", Model: "claude-sonnet-4-5", ReplayState: fin.ReplayState}},
			{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{text("also this"), result("toolu_01A09q90qw90lq917835lq9")}},
			{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{result("toolu_02"), {Block: &llmv1.ContentBlock_Image{Image: &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Data{Data: []byte("PNG")}, MimeType: "image/png"}}}}},
		},
	}
	up2 := providertest.Serve(t, providertest.Reply{Body: providertest.ReadFile(t, "text.sse")})
	providertest.Collect(t, t.Context(), newAdapter(t, up2.URL, 0), req)
	seen := up2.Requests()[0]
	if seen.Path != "/v1/messages" || seen.Header.Get("X-Api-Key") != testKey || seen.Header.Get("Anthropic-Version") != DefaultVersion || seen.Header.Get("User-Agent") != "dsh/1.0.0 (+https://github.com/dsh-dev/dsh)" {
		t.Errorf("path/headers wrong: %s %v", seen.Path, seen.Header)
	}
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, seen.Body, "", "  "); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "golden", "request_replay.json")
	if os.Getenv("DSH_UPDATE_GOLDEN") == "1" {
		_ = os.MkdirAll(filepath.Dir(golden), 0o755)
		_ = os.WriteFile(golden, pretty.Bytes(), 0o644)
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bytes.TrimSpace(want), bytes.TrimSpace(pretty.Bytes())) {
		t.Errorf("request differs from %s:\n%s", golden, pretty.String())
	}
}

// TestRichContentDegraded: images (PNG, a URL, a sniffed PNG) stay in the
// tool result, a text document goes as a text document block and a PDF as a
// base64 one; SVG, audio and a binary document become placeholders naming
// them; user-only blocks stay out.
func TestRichContentDegraded(t *testing.T) {
	t.Parallel()
	body := providertest.RichContentBody(t, New(Config{Route: "anthropic", BaseURL: "http://127.0.0.1:1"}), "anthropic", "claude-sonnet-4-5")
	if bytes.Contains(body, []byte("PHN2Zy8+")) {
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
		return providertest.Subject{Adapter: newAdapter(t, up.URL, 0), Request: request(), Upstream: up}
	})
}

// FuzzStream: whatever bytes the provider sends, the adapter's stream is
// grammatical, ends with one finish, and every chunk can be marshalled.
func FuzzStream(f *testing.F) {
	for _, name := range []string{"text.sse", "thinking_tools.sse", "error_midstream.sse", "missing_stop.sse", "malformed.sse", "refusal.sse"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		a := New(Config{BaseURL: "http://fuzz.invalid", Client: upstream.Client{HTTP: &http.Client{Transport: providertest.StaticTransport(body)}, UserAgent: "dsh/fuzz"}})
		providertest.FuzzGrammar(t, a, request())
	})
}

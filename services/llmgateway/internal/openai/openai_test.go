package openai

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/chat"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/providertest"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/upstream"
)

func newAdapter(t *testing.T, baseURL string, idle time.Duration) provider.Adapter {
	return New(chat.Config{
		BaseURL: baseURL,
		Client:  upstream.Client{HTTP: &http.Client{Transport: upstream.NewTransport()}, UserAgent: provider.DSH("").UserAgent(), IdleTimeout: idle},
	})
}

func request() *llmv1.GenerateRequest {
	return &llmv1.GenerateRequest{Provider: "openai", Model: "gpt-4.1-mini", Messages: []*llmv1.Message{{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: "hi"}}}}}}}
}

func TestStreams(t *testing.T) {
	t.Parallel()
	sse := func(name string) []byte { return providertest.ReadFile(t, name) }
	providertest.RunCases(t, []providertest.Case{
		{Name: "usage in a trailing usage-only chunk", Reply: providertest.Reply{Body: sse("usage_trailing.sse")}, Golden: "usage_trailing"},
		{Name: "usage absent", Reply: providertest.Reply{Body: sse("usage_absent.sse")}, Golden: "usage_absent"},
		{Name: "usage in the last delta, reasoning field", Reply: providertest.Reply{Body: sse("usage_last_delta.sse"), Chunk: 5}, Golden: "usage_last_delta"},
		{Name: "parallel tool calls split mid-UTF-8 and mid-escape", Reply: providertest.Reply{Body: sse("tool_calls.sse"), Chunk: 13}, Golden: "tool_calls"},
		{Name: "error mid-stream", Reply: providertest.Reply{Body: sse("error_midstream.sse")}, Code: provider.CodeServer, Golden: "error_midstream"},
		{Name: "missing DONE", Reply: providertest.Reply{Body: sse("missing_done.sse")}, Code: provider.CodeStreamClosed, Golden: "missing_done"},
		{Name: "malformed JSON line", Reply: providertest.Reply{Body: sse("malformed.sse")}, Code: provider.CodeMalformedResponse, Golden: "malformed_json_line"},
		{Name: "connection reset", Reply: providertest.Reply{Body: sse("usage_trailing.sse"), ResetAfter: providertest.After(t, sse("usage_trailing.sse"), `"Hi"`)}, Code: provider.CodeTransport, Golden: "connection_reset"},
		{Name: "stall longer than the idle bound", Reply: providertest.Reply{Body: sse("usage_trailing.sse"), StallAfter: providertest.After(t, sse("usage_trailing.sse"), `"Hi"`)}, Idle: 100 * time.Millisecond, Code: provider.CodeTimeout, Golden: "stall_longer_than_the_idle_bound"},
		{Name: "HTTP 401", Reply: providertest.Reply{Status: 401, Body: []byte(`{"error":{"message":"Incorrect API key provided: sk-proj-********************abcd.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`)}, Code: provider.CodeAuth, Status: 401, Golden: "http401"},
		{Name: "HTTP 500", Reply: providertest.Reply{Status: 500, Body: []byte(`{"error":{"message":"internal"}}`)}, Code: provider.CodeServer, Status: 500, Golden: "http_500"},
		{Name: "HTTP 429 insufficient quota", Reply: providertest.Reply{Status: 429, Body: []byte(`{"error":{"message":"You exceeded your current quota, please check your plan and billing details.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`), Header: map[string]string{"x-request-id": "req_abc"}}, Code: provider.CodeQuota, Status: 429, RequestID: "req_abc", Golden: "http_429_insufficient_quota"},
		{Name: "HTTP 429 retry-after-ms", Reply: providertest.Reply{Status: 429, Body: []byte(`{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`), Header: map[string]string{"retry-after-ms": "1500", "Retry-After": "2"}}, Code: provider.CodeRateLimit, RetryAfterMS: 1500, Golden: "http_429_retry_after_ms"},
		{Name: "HTTP 400 context_length_exceeded", Reply: providertest.Reply{Status: 400, Body: []byte(`{"error":{"message":"Input tokens exceed the configured limit of 272000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`)}, Code: provider.CodeContextWindowExceeded, Status: 400, Golden: "http_400_context_length_exceeded"},
		{Name: "HTTP 403", Reply: providertest.Reply{Status: 403, Body: []byte(`{"error":{"message":"Project does not have access to model"}}`)}, Code: provider.CodeAuth, Status: 403, Golden: "http_403"},
		{Name: "HTTP 503", Reply: providertest.Reply{Status: 503, Body: []byte(`{"error":{"message":"The server is overloaded"}}`)}, Code: provider.CodeServer, Status: 503, Golden: "http_503"},
	}, newAdapter, request())
}

// TestRequestWire checks usage is requested, no key means no Authorization
// (local servers), and images travel as image_url parts.
func TestRequestWire(t *testing.T) {
	t.Parallel()
	up := providertest.Serve(t, providertest.Reply{Body: providertest.ReadFile(t, "usage_absent.sse")})
	req := request()
	req.Messages[0].Content = append(req.Messages[0].Content,
		&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Image{Image: &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Data{Data: []byte{0x89, 'P', 'N', 'G'}}, MimeType: "image/png"}}},
		&llmv1.ContentBlock{Block: &llmv1.ContentBlock_Image{Image: &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Url{Url: "https://example.com/cat.jpg"}}}})
	a := newAdapter(t, up.URL, 0)
	if err := a.Validate(req); err != nil {
		t.Fatal(err)
	}
	providertest.Collect(t, t.Context(), a, req)
	seen := up.Requests()[0]
	if h := seen.Header.Get("Authorization"); h != "" {
		t.Errorf("Authorization sent without a key: %q", h)
	}
	var body struct {
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		Messages []struct {
			Content []struct {
				Type     string `json:"type"`
				ImageURL struct {
					URL string `json:"url"`
				} `json:"image_url"`
			} `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(seen.Body, &body); err != nil {
		t.Fatalf("%v: %s", err, seen.Body)
	}
	if !body.StreamOptions.IncludeUsage {
		t.Error("stream_options.include_usage not set")
	}
	parts := body.Messages[0].Content
	if len(parts) != 3 || parts[1].ImageURL.URL != "data:image/png;base64,iVBORw==" || parts[2].ImageURL.URL != "https://example.com/cat.jpg" {
		t.Errorf("image parts = %+v", parts)
	}
}

// TestRichContentDegraded: images from tool results move into the user
// message that follows (tool messages are text), named in the tool
// message; what the route cannot carry (SVG, an image of unknown format,
// audio, a binary document) is described; tool results join their blocks
// with newlines; user-only blocks stay out.
func TestRichContentDegraded(t *testing.T) {
	t.Parallel()
	body := providertest.RichContentBody(t, New(chat.Config{Route: "openai", BaseURL: "http://127.0.0.1:1"}), "openai", "gpt-4.1-mini")
	var w struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &w); err != nil {
		t.Fatal(err)
	}
	var roles []string
	for _, m := range w.Messages {
		roles = append(roles, m.Role)
	}
	if got := strings.Join(roles, ","); got != "user,assistant,tool,tool,tool,tool,user" {
		t.Fatalf("roles = %s", got)
	}
	last := string(w.Messages[len(w.Messages)-1].Content)
	for _, want := range []string{"data:image/png;base64,iVBORw0KGgoAAAANSUhEUg==", "https://example.com/cat.jpg", "[image from tool call c1]", "data:image/jpeg;base64,/9j/4AAQ"} {
		if !strings.Contains(last, want) {
			t.Errorf("the user message after the tool messages lacks %q: %s", want, last)
		}
	}
	for _, leak := range []string{"for your eyes only", "progress bar", "user-only note"} {
		if strings.Contains(string(body), leak) {
			t.Errorf("body carries %q", leak)
		}
	}
}

// TestNoImagesRoute: a route configured with no_images (a text-only model)
// describes images instead of sending them, even in user messages.
func TestNoImagesRoute(t *testing.T) {
	t.Parallel()
	req := providertest.RichContentRequest("local", "qwen3")
	body, _, err := New(chat.Config{Route: "local", BaseURL: "http://127.0.0.1:1", NoImages: true}).Body(req)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(body), "image_url") || !strings.Contains(string(body), `not sent: route \"local\" does not take images`) {
		t.Errorf("body: %s", body)
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	providertest.Run(t, func(t *testing.T, m providertest.Mode) providertest.Subject {
		r := providertest.Reply{Body: providertest.ReadFile(t, "usage_trailing.sse")}
		if m == providertest.Stall {
			r.StallAfter = providertest.After(t, r.Body, `"Hi"`)
		}
		up := providertest.Serve(t, r)
		return providertest.Subject{Adapter: newAdapter(t, up.URL, 0), Request: request(), Upstream: up}
	})
}

func TestMaxTokensField(t *testing.T) {
	t.Parallel()
	req := request()
	limit := int32(77)
	req.MaxTokens = &limit
	for _, tt := range []struct{ base, want, not string }{
		{"https://api.openai.com/v1", `"max_completion_tokens":77`, `"max_tokens"`},
		{"http://127.0.0.1:8000/v1", `"max_tokens":77`, `"max_completion_tokens"`},
	} {
		body, _, err := New(chat.Config{BaseURL: tt.base}).Body(req)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(body), tt.want) || strings.Contains(string(body), tt.not) {
			t.Errorf("%s: body %s", tt.base, body)
		}
	}
}

// TestManyToolCalls: 40 tool calls whose fragments arrive interleaved (each
// index comes back after the others opened, past the translation's small
// index table) assemble each into its own block, in open order, with its
// own id and arguments.
func TestManyToolCalls(t *testing.T) {
	t.Parallel()
	const n = 40
	var body strings.Builder
	event := func(s string) {
		body.WriteString("data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[" + s + "]}}]}\n\n")
	}
	for i := range n {
		event(fmt.Sprintf(`{"index":%d,"id":"call_%d","type":"function","function":{"name":"read","arguments":"{\"n\":"}}`, i, i))
	}
	for i := n - 1; i >= 0; i-- {
		event(fmt.Sprintf(`{"index":%d,"function":{"arguments":"%d}"}}`, i, i))
	}
	body.WriteString("data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n")
	up := providertest.Serve(t, providertest.Reply{Body: []byte(body.String())})
	chunks := providertest.Collect(t, t.Context(), newAdapter(t, up.URL, 0), request())
	args := map[uint32]string{}
	ids := map[uint32]string{}
	for _, c := range chunks {
		if d := c.GetToolCallDelta(); d != nil {
			if d.GetId() != "" {
				ids[d.GetIndex()] = d.GetId()
			}
			args[d.GetIndex()] += d.GetArgumentsDelta()
		}
	}
	if len(ids) != n {
		t.Fatalf("%d blocks, want %d:\n%s", len(ids), n, providertest.Format(chunks))
	}
	for i := range uint32(n) {
		if want := fmt.Sprintf("call_%d", i); ids[i] != want {
			t.Errorf("block %d: id %q, want %q", i, ids[i], want)
		}
		if want := fmt.Sprintf(`{"n":%d}`, i); args[i] != want {
			t.Errorf("block %d: arguments %q, want %q", i, args[i], want)
		}
	}
}

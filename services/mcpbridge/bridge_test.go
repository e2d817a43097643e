package mcpbridge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/toolstream"
	"github.com/dsh-dev/dsh/services/mcpbridge"
	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/testing/protocmp"
)

const (
	stdioEnv         = "MCPBRIDGE_TEST_STDIO"
	testInstructions = "Prefer the text tool for greetings."
)

var png = []byte("\x89PNG\r\n\x1a\nfake")

// testServer is the MCP server the bridge tests talk to (in process over
// HTTP, or as a re-executed test binary over stdio).
func testServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "v1"}, &mcp.ServerOptions{Instructions: testInstructions})
	raw := func(name string, h func() *mcp.CallToolResult) {
		s.AddTool(&mcp.Tool{Name: name, Description: "test tool " + name, InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) { return h(), nil })
	}
	raw("text", func() *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "hello"}}, StructuredContent: map[string]int{"n": 1}}
	})
	raw("pid", func() *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprint(os.Getpid())}}}
	})
	raw("media", func() *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{
			&mcp.ImageContent{Data: png, MIMEType: "image/png"},
			&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "file:///a.txt", MIMEType: "text/plain", Text: "file text"}},
			&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "file:///b.png", MIMEType: "image/png", Blob: png}},
			&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "file:///c.bin", MIMEType: "application/pdf", Blob: []byte{1, 2}}},
			&mcp.ResourceLink{URI: "memo://one", Name: "one", MIMEType: "text/plain", Description: "the first memo"},
			&mcp.AudioContent{Data: []byte("RIFF"), MIMEType: "audio/wav", Annotations: &mcp.Annotations{Priority: 0.5}},
			&mcp.TextContent{Text: "for your eyes", Annotations: &mcp.Annotations{Audience: []mcp.Role{"user"}}},
			&mcp.TextContent{Text: "for both", Annotations: &mcp.Annotations{Audience: []mcp.Role{"user", "assistant"}}},
		}}
	})
	raw("only_user", func() *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "secret view", Annotations: &mcp.Annotations{Audience: []mcp.Role{"user"}}}}}
	})
	raw("env", func() *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Join(os.Environ(), "\n")}}}
	})
	s.AddTool(&mcp.Tool{Name: "strict", Description: "refuses its params", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: `"path" is required`}
		})
	s.AddTool(&mcp.Tool{Name: "log", Description: "logs", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			_ = req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "warning", Logger: "disk", Data: "disk almost full"})
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "logged"}}}, nil
		})
	s.AddResource(&mcp.Resource{URI: "memo://one", Name: "one", MIMEType: "text/plain"},
		func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, MIMEType: "text/plain", Text: "memo one says hi"}}}, nil
		})
	raw("oops", func() *mcp.CallToolResult {
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "disk full"}}}
	})
	s.AddTool(&mcp.Tool{Name: "weird.name", Description: "dots", InputSchema: json.RawMessage(`{"type":"object"}`),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "weird"}}}, nil
		})
	s.AddTool(&mcp.Tool{Name: "slow", Description: "reports progress, then waits for cancellation", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Message: "started\n", Progress: 1})
			<-ctx.Done()
			return nil, ctx.Err()
		})
	raw("crash", func() *mcp.CallToolResult { os.Exit(3); return nil })
	raw("add", func() *mcp.CallToolResult {
		raw("extra", func() *mcp.CallToolResult {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "extra"}}}
		})
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "added"}}}
	})
	raw("drop", func() *mcp.CallToolResult {
		s.RemoveTools("extra")
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "dropped"}}}
	})
	s.AddTool(&mcp.Tool{Name: "echo_args", Description: "echo", InputSchema: json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}}}`)},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(req.Params.Arguments)}}}, nil
		})
	return s
}

func TestMain(m *testing.M) {
	if os.Getenv(stdioEnv) == "1" {
		if err := testServer().Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv(muteEnv) == "1" { // a server that never answers initialize
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	if os.Getenv(httpEnv) == "1" {
		serveHTTPChild()
	}
	os.Exit(m.Run())
}

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func startBridge(t *testing.T, servers map[string]mcpbridge.ServerConfig) toolsv1.ToolHostClient {
	t.Helper()
	c, _ := startBridgeWith(t, mcpbridge.Config{Servers: mcpbridge.FileConfig{Servers: servers}}, logWriter{t})
	return c
}

// startBridgeWith serves a bridge (fast backoff unless cfg sets one),
// logging to w, and returns a client of it.
func startBridgeWith(t *testing.T, cfg mcpbridge.Config, w io.Writer) (toolsv1.ToolHostClient, *grpc.ClientConn) {
	t.Helper()
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 100*time.Millisecond
	}
	b, err := mcpbridge.New(cfg, slog.New(slog.NewTextHandler(w, nil)))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	select {
	case <-b.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("bridge not ready")
	}
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return toolsv1.NewToolHostClient(conn), conn
}

func stdioServer(t *testing.T) mcpbridge.ServerConfig {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return mcpbridge.ServerConfig{Command: exe, Env: map[string]string{stdioEnv: "1"}}
}

var toolCtx = &toolsv1.ToolContext{SessionId: "s", Cwd: "/"}

func call(t *testing.T, c toolsv1.ToolHostClient, name, args string) *toolsv1.ToolExecutionResult {
	t.Helper()
	stream, err := c.Execute(t.Context(), &toolsv1.ExecuteRequest{Execution: &toolsv1.ToolExecution{CallId: "c", Name: name, Arguments: args, Context: toolCtx}})
	if err != nil {
		t.Fatal(err)
	}
	r, _, err := toolstream.Collect(stream)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return r
}

func names(t *testing.T, c toolsv1.ToolHostClient) []string {
	t.Helper()
	resp, err := c.ListTools(t.Context(), &toolsv1.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range resp.GetTools() {
		out = append(out, d.GetSchema().GetName())
	}
	slices.Sort(out)
	return out
}

func txt(s string) *llmv1.ContentBlock {
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}
}

func img(b []byte, mime string) *llmv1.ContentBlock {
	return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Image{Image: &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Data{Data: b}, MimeType: mime}}}
}

// poll retries f until it reports true or the deadline passes.
func poll(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling an external process, not a fixed wait
	}
}

func TestBridgeTransports(t *testing.T) {
	t.Parallel()
	httpSrv := testServer()
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return httpSrv }, nil)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer s3cret" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		handler.ServeHTTP(w, r)
	}))
	t.Cleanup(web.Close)
	sseSrv := testServer()
	legacy := httptest.NewServer(mcp.NewSSEHandler(func(*http.Request) *mcp.Server { return sseSrv }, nil))
	t.Cleanup(legacy.Close)
	for _, tc := range []struct {
		name string
		cfg  mcpbridge.ServerConfig
	}{
		{"stdio", stdioServer(t)},
		{"http", mcpbridge.ServerConfig{URL: web.URL, Headers: map[string]string{"Authorization": "Bearer s3cret"}}},
		{"sse", mcpbridge.ServerConfig{Type: "sse", URL: legacy.URL}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := startBridge(t, map[string]mcpbridge.ServerConfig{"srv": tc.cfg})
			want := []string{"mcp_read_resource", "srv__add", "srv__crash", "srv__drop", "srv__echo_args", "srv__env", "srv__log", "srv__media", "srv__only_user", "srv__oops", "srv__pid", "srv__slow", "srv__strict", "srv__text", "srv__weird_name"}
			if diff := cmp.Diff(want, names(t, c)); diff != "" {
				t.Fatalf("tools (-want +got):\n%s", diff)
			}
			list, _ := c.ListTools(t.Context(), &toolsv1.ListToolsRequest{})
			for _, d := range list.GetTools() {
				wantConc := toolsv1.ConcurrencySafety_CONCURRENCY_SAFETY_UNSPECIFIED
				if n := d.GetSchema().GetName(); n == "srv__weird_name" || n == mcpbridge.ReadResourceTool {
					wantConc = toolsv1.ConcurrencySafety_CONCURRENCY_SAFETY_ALWAYS
				}
				if d.GetConcurrency() != wantConc || d.GetValidatesArguments() {
					t.Errorf("%s: concurrency %v validates %v", d.GetSchema().GetName(), d.GetConcurrency(), d.GetValidatesArguments())
				}
			}

			cases := []struct {
				tool, args string
				want       *toolsv1.ToolExecutionResult
			}{
				{"srv__text", `{}`, &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{txt("hello")}, Meta: ptr(`{"structuredContent":{"n":1}}`)}},
				{"srv__weird_name", `{}`, &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{txt("weird")}}},
				{"srv__echo_args", `{"n":12345678901234567890}`, &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{txt(`{"n":12345678901234567890}`)}}},
				{"srv__media", `{}`, &toolsv1.ToolExecutionResult{Content: mediaModel, View: &toolsv1.ToolResultView{Card: &toolsv1.ToolResultView_Generic{Generic: &toolsv1.GenericResultView{
					Content: slices.Insert(slices.Clone(mediaModel), 6, userOnly("for your eyes"))}}}}},
				{"srv__only_user", `{}`, &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{txt("(the tool's output was shown to the user only)")},
					View: &toolsv1.ToolResultView{Card: &toolsv1.ToolResultView_Generic{Generic: &toolsv1.GenericResultView{Content: []*llmv1.ContentBlock{userOnly("secret view")}}}}}},
				{"srv__strict", `{}`, &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{txt(`Error: invalid arguments: "path" is required`)}, IsError: true,
					Error: &toolsv1.ToolErrorInfo{Name: "ToolArgsError", Code: "INVALID_ARGS"}}},
				// The model follows the link through the bridge.
				{mcpbridge.ReadResourceTool, `{"uri":"memo://one"}`, &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{
					{Block: &llmv1.ContentBlock_Document{Document: &llmv1.DocumentBlock{Uri: "memo://one", MimeType: "text/plain", Content: &llmv1.DocumentBlock_Text{Text: "memo one says hi"}}}}}}},
				{mcpbridge.ReadResourceTool, `{"uri":"memo://nope"}`, &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{txt(`Error: invalid arguments: "uri" "memo://nope" on server srv: Resource not found`)}, IsError: true,
					Error: &toolsv1.ToolErrorInfo{Name: "ToolArgsError", Code: "INVALID_ARGS"}}},
				{mcpbridge.ReadResourceTool, `{"uri":"memo://one","server":"other"}`, &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{txt(`Error: invalid arguments: "server" must be one of [srv]`)}, IsError: true,
					Error: &toolsv1.ToolErrorInfo{Name: "ToolArgsError", Code: "INVALID_ARGS"}}},
				{"srv__oops", `{}`, &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{txt("Error: disk full")}, IsError: true}},
				{"srv__text", `[1]`, &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{txt(`Error: invalid arguments: "arguments" must be an object`)}, IsError: true,
					Error: &toolsv1.ToolErrorInfo{Name: "ToolArgsError", Code: "INVALID_ARGS"}}},
			}
			for _, k := range cases {
				got := call(t, c, k.tool, k.args)
				if diff := cmp.Diff(k.want, got, protocmp.Transform()); diff != "" {
					t.Errorf("%s %s (-want +got):\n%s", k.tool, k.args, diff)
				}
			}

			// tools/list_changed reaches WatchTools, both ways.
			w, err := c.WatchTools(t.Context(), &toolsv1.WatchToolsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			has := func(m *toolsv1.WatchToolsResponse) bool {
				return slices.ContainsFunc(m.GetTools(), func(d *toolsv1.ToolDescriptor) bool { return d.GetSchema().GetName() == "srv__extra" })
			}
			waitFor := func(want bool) {
				for {
					m, err := w.Recv()
					if err != nil {
						t.Fatalf("watch: %v", err)
					}
					if has(m) == want {
						return
					}
				}
			}
			waitFor(false)
			call(t, c, "srv__add", `{}`)
			waitFor(true)
			if got := call(t, c, "srv__extra", `{}`); got.GetContent()[0].GetText().GetText() != "extra" {
				t.Errorf("srv__extra = %v", got)
			}
			call(t, c, "srv__drop", `{}`)
			waitFor(false)
		})
	}
}

func TestBridgeRestartsCrashedServer(t *testing.T) {
	t.Parallel()
	c := startBridge(t, map[string]mcpbridge.ServerConfig{"srv": stdioServer(t)})
	pid := call(t, c, "srv__pid", `{}`).GetContent()[0].GetText().GetText()
	r := call(t, c, "srv__crash", `{}`)
	if !r.GetIsError() || !strings.HasPrefix(r.GetContent()[0].GetText().GetText(), "Error: ") {
		t.Fatalf("crash call = %v, want an error result", r)
	}
	poll(t, "a restarted server", func() bool {
		r := call(t, c, "srv__pid", `{}`)
		if r.GetIsError() {
			if code := r.GetError().GetCode(); code != mcpbridge.CodeUnavailable && code != mcpbridge.CodeProtocol {
				t.Fatalf("call during restart: code %q, want %s or %s", code, mcpbridge.CodeUnavailable, mcpbridge.CodeProtocol)
			}
			return false
		}
		newPid := r.GetContent()[0].GetText().GetText()
		if newPid == pid {
			t.Fatalf("pid unchanged after crash: %s", pid)
		}
		return true
	})
}

func TestBridgeUnreachableServer(t *testing.T) {
	t.Parallel()
	c := startBridge(t, map[string]mcpbridge.ServerConfig{
		"gone": {Command: "/nonexistent/mcp-server"},
		"ok":   stdioServer(t),
	})
	got := names(t, c)
	if slices.ContainsFunc(got, func(n string) bool { return strings.HasPrefix(n, "gone__") }) || !slices.Contains(got, "ok__text") {
		t.Fatalf("tools = %v, want only ok__*", got)
	}
	if r := call(t, c, "gone__text", `{}`); r.GetError().GetCode() != "UNKNOWN_TOOL" {
		t.Errorf("gone__text = %v, want UNKNOWN_TOOL", r)
	}
}

func ptr[T any](v T) *T { return &v }

func userOnly(s string) *llmv1.ContentBlock {
	b := txt(s)
	b.Annotations = &llmv1.ContentAnnotations{Audience: []string{"user"}}
	return b
}

// mediaModel is what the model gets of srv__media: every block but the
// one for the user only, annotations kept.
var mediaModel = []*llmv1.ContentBlock{
	img(png, "image/png"),
	{Block: &llmv1.ContentBlock_Document{Document: &llmv1.DocumentBlock{Uri: "file:///a.txt", MimeType: "text/plain", Content: &llmv1.DocumentBlock_Text{Text: "file text"}}}},
	img(png, "image/png"),
	{Block: &llmv1.ContentBlock_Document{Document: &llmv1.DocumentBlock{Uri: "file:///c.bin", MimeType: "application/pdf", Content: &llmv1.DocumentBlock_Data{Data: []byte{1, 2}}}}},
	{Block: &llmv1.ContentBlock_ResourceLink{ResourceLink: &llmv1.ResourceLinkBlock{Uri: "memo://one", Name: "one", MimeType: "text/plain", Description: "the first memo"}}},
	{Block: &llmv1.ContentBlock_Audio{Audio: &llmv1.AudioBlock{Data: []byte("RIFF"), MimeType: "audio/wav"}}, Annotations: &llmv1.ContentAnnotations{Priority: ptr(0.5)}},
	{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: "for both"}}, Annotations: &llmv1.ContentAnnotations{Audience: []string{"user", "assistant"}}},
}

func TestParseConfig(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, json, wantErr string
	}{
		{"ok", `{"servers":{"fs":{"command":"npx","args":["-y","x"],"env":{"A":"1"},"cwd":"/"},"web-1":{"url":"http://x/mcp","headers":{"A":"b"}}}}`, ""},
		{"no servers", `{"servers":{}}`, "no servers"},
		{"both", `{"servers":{"a":{"command":"x","url":"http://x"}}}`, "exactly one of command or url"},
		{"neither", `{"servers":{"a":{}}}`, "exactly one of command or url"},
		{"double underscore", `{"servers":{"a__b":{"command":"x"}}}`, "server name"},
		{"bad char", `{"servers":{"a.b":{"command":"x"}}}`, "server name"},
		{"headers without url", `{"servers":{"a":{"command":"x","headers":{"a":"b"}}}}`, "headers need a url"},
		{"args without command", `{"servers":{"a":{"url":"http://x","args":["y"]}}}`, "need a command"},
		{"unknown field", `{"servers":{"a":{"command":"x","comand":"y"}}}`, "unknown field"},
		{"not json", `{`, "config"},
		{"typo at top level", `{"sever":{"a":{"command":"x"}}}`, `unknown top-level key "sever"`},
		{"both keys define a server", `{"servers":{"a":{"command":"x"}},"mcpServers":{"a":{"command":"y"}}}`, "defined in both"},
		{"vscode type mismatch", `{"servers":{"a":{"type":"stdio","url":"http://x"}}}`, "type stdio needs a command"},
		{"http type with a command", `{"servers":{"a":{"type":"http","command":"x"}}}`, "type http needs a url"},
		{"unknown type", `{"servers":{"a":{"type":"ws","url":"ws://x"}}}`, `type "ws" is not one of`},
		{"vscode input", `{"servers":{"a":{"command":"x","env":{"K":"${input:key}"}}},"inputs":[{"id":"key"}]}`, "VS Code input"},
		{"bad env name", `{"servers":{"a":{"command":"x","passEnv":["A=B"]}}}`, "not an environment variable name"},
		{"all disabled", `{"mcpServers":{"a":{"command":"x","disabled":true}}}`, "no servers"},
		{"foreign unknown server field", `{"mcpServers":{"a":{"command":"x","comand":"y"}}}`, "unknown field"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := mcpbridge.ParseConfig([]byte(c.json))
			if c.wantErr == "" {
				if err != nil {
					t.Fatalf("ParseConfig: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("err = %v, want %q", err, c.wantErr)
			}
		})
	}
}

func TestToolName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"read_file": "fs__read_file", "a.b/c d": "fs__a_b_c_d", "ok-1": "fs__ok-1"} {
		if got := mcpbridge.ToolName("fs", in); got != want {
			t.Errorf("ToolName(fs, %q) = %q, want %q", in, got, want)
		}
	}
}

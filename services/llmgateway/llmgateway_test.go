package llmgateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/internal/llmstream"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/providertest"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/scripted"
)

const textSSE = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
	"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n" +
	"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n" +
	"data: [DONE]\n\n"

// startGateway serves cfg on a loopback port and returns a client.
func startGateway(t testing.TB, cfg Config) llmv1.LlmGatewayClient {
	t.Helper()
	return startPrefixGateway(t, cfg).c
}

func userText(s string) *llmv1.Message {
	return &llmv1.Message{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}}}
}

func recvAll(t testing.TB, s interface {
	Recv() (*llmv1.GenerateResponse, error)
}) ([]*llmv1.StreamChunk, error) {
	var out []*llmv1.StreamChunk
	for {
		r, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = appendChunks(out, r)
	}
}

// generate runs req to its end and checks the stream grammar.
func generate(t testing.TB, c llmv1.LlmGatewayClient, req *llmv1.GenerateRequest) []*llmv1.StreamChunk {
	t.Helper()
	s, err := c.Generate(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := recvAll(t, s)
	if err != nil {
		t.Fatal(err)
	}
	if err := llmstream.CheckStream(chunks); err != nil {
		t.Fatal(err)
	}
	return chunks
}

func TestGenerateOverGRPC(t *testing.T) {
	t.Parallel()
	up := providertest.Serve(t, providertest.Reply{Body: []byte(textSSE)})
	stall := providertest.Serve(t, providertest.Reply{Body: []byte(textSSE), StallAfter: strings.Index(textSSE, "world") + 60})
	c := startGateway(t, Config{Routes: []RouteConfig{
		{Name: "local", Kind: KindOpenAI, BaseURL: up.URL, Models: []provider.Model{{ID: "m", ContextWindow: 4096}}},
		{Name: "slow", Kind: KindOpenAI, BaseURL: stall.URL},
		{Name: "ds", Kind: KindDeepSeek, BaseURL: up.URL, APIKey: "sk-secretsecretsecret"},
		{Name: "scripted", Kind: KindScripted},
	}})

	t.Run("stream", func(t *testing.T) {
		t.Parallel()
		chunks := generate(t, c, &llmv1.GenerateRequest{Provider: "local", Model: "m", Messages: []*llmv1.Message{userText("hi")}})
		var a llmstream.Assembler
		for _, ch := range chunks {
			a.Push(ch)
		}
		m, _ := a.Message()
		if got := m.GetContent()[0].GetText().GetText(); got != "Hello world" {
			t.Errorf("text = %q", got)
		}
	})

	t.Run("large request", func(t *testing.T) {
		t.Parallel()
		big := userText(strings.Repeat("x", 6<<20))
		s, err := c.Generate(t.Context(), &llmv1.GenerateRequest{Provider: "scripted", Model: "demo", Messages: []*llmv1.Message{big}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := recvAll(t, s); err != nil {
			t.Fatalf("a 6 MiB conversation was refused: %v", err)
		}
	})

	t.Run("scripted demo", func(t *testing.T) {
		t.Parallel()
		s, err := c.Generate(t.Context(), &llmv1.GenerateRequest{Provider: "scripted", Model: "demo", Messages: []*llmv1.Message{userText("hi")}})
		if err != nil {
			t.Fatal(err)
		}
		chunks, err := recvAll(t, s)
		if err != nil || llmstream.CheckStream(chunks) != nil || providertest.Finish(chunks).GetReason().GetToolCalls() == nil {
			t.Fatalf("demo stream: %v\n%s", err, providertest.Format(chunks))
		}
	})

	t.Run("cancel mid-stream cancels upstream", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(t.Context())
		s, err := c.Generate(ctx, &llmv1.GenerateRequest{Provider: "slow", Model: "m", Messages: []*llmv1.Message{userText("hi")}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
		cancel()
		select {
		case <-stall.Cancelled():
		case <-time.After(5 * time.Second):
			t.Fatal("the upstream request was not cancelled")
		}
		if _, err := recvAll(t, s); status.Code(err) != codes.Canceled {
			t.Errorf("after cancel: %v", err)
		}
	})

	t.Run("bad requests", func(t *testing.T) {
		t.Parallel()
		img := &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Image{Image: &llmv1.ImageBlock{Source: &llmv1.ImageBlock_Url{Url: "https://x/y.png"}}}}
		tests := []struct {
			name string
			req  *llmv1.GenerateRequest
			code codes.Code
			msg  string
		}{
			{"no provider", &llmv1.GenerateRequest{Model: "m", Messages: []*llmv1.Message{userText("x")}}, codes.InvalidArgument, "provider"},
			{"unknown provider", &llmv1.GenerateRequest{Provider: "nope", Model: "m", Messages: []*llmv1.Message{userText("x")}}, codes.NotFound, `"nope"`},
			{"no model", &llmv1.GenerateRequest{Provider: "local", Messages: []*llmv1.Message{userText("x")}}, codes.InvalidArgument, "model"},
			{"no messages", &llmv1.GenerateRequest{Provider: "local", Model: "m"}, codes.InvalidArgument, "messages"},
			{"image in an assistant message", &llmv1.GenerateRequest{Provider: "ds", Model: "m", Messages: []*llmv1.Message{userText("x"), {Role: llmv1.Role_ROLE_ASSISTANT, Content: []*llmv1.ContentBlock{img}}}}, codes.InvalidArgument, "messages[1].content[0]"},
			{"bad tool schema", &llmv1.GenerateRequest{Provider: "local", Model: "m", Messages: []*llmv1.Message{userText("x")}, Tools: []*llmv1.ToolSchema{{Name: "t", Parameters: "[1]"}}}, codes.InvalidArgument, "tools[0].parameters"},
		}
		for _, tt := range tests {
			s, err := c.Generate(t.Context(), tt.req)
			if err == nil {
				_, err = recvAll(t, s)
			}
			if status.Code(err) != tt.code || !strings.Contains(status.Convert(err).Message(), tt.msg) {
				t.Errorf("%s: err = %v, want %s mentioning %s", tt.name, err, tt.code, tt.msg)
			}
		}
	})

	t.Run("content a route cannot carry is degraded, never refused", func(t *testing.T) {
		t.Parallel()
		for _, route := range []string{"ds", "local"} {
			s, err := c.Generate(t.Context(), providertest.RichContentRequest(route, "m"))
			if err == nil {
				var chunks []*llmv1.StreamChunk
				chunks, err = recvAll(t, s)
				if f := providertest.Finish(chunks); err == nil && f.GetReason().GetStop() == nil {
					t.Errorf("%s: finish %v", route, f)
				}
			}
			if err != nil {
				t.Errorf("%s: %v", route, err)
			}
		}
	})

	t.Run("catalogue", func(t *testing.T) {
		t.Parallel()
		lp, err := c.ListProviders(t.Context(), &llmv1.ListProvidersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, p := range lp.GetProviders() {
			ids = append(ids, p.GetId()+":"+p.GetKind())
		}
		if diff := cmp.Diff([]string{"local:openai", "slow:openai", "ds:deepseek", "scripted:scripted"}, ids); diff != "" {
			t.Errorf("providers (-want +got):\n%s", diff)
		}
		lm, err := c.ListModels(t.Context(), &llmv1.ListModelsRequest{Provider: "ds"})
		if err != nil || len(lm.GetModels()) != 2 || lm.GetModels()[0].GetContextWindow() != 128_000 {
			t.Errorf("ListModels(ds) = %v, %v", lm, err)
		}
		mc, err := c.GetModelContext(t.Context(), &llmv1.GetModelContextRequest{Provider: "local", Model: "m"})
		if err != nil || mc.GetContext().GetContextWindow() != 4096 {
			t.Errorf("GetModelContext(local, m) = %v, %v", mc, err)
		}
		mc, err = c.GetModelContext(t.Context(), &llmv1.GetModelContextRequest{Provider: "local", Model: "unlisted"})
		if err != nil || mc.GetContext() != nil {
			t.Errorf("unknown model context = %v, %v", mc, err)
		}
		if _, err := c.ListModels(t.Context(), &llmv1.ListModelsRequest{Provider: "x"}); status.Code(err) != codes.NotFound {
			t.Errorf("ListModels(x) = %v", err)
		}
	})
	// Nothing of a rejected request reaches the upstream (checked after the
	// parallel subtests finished).
	t.Cleanup(func() {
		for _, r := range up.Requests() {
			if strings.Contains(string(r.Body), "https://x/y.png") || strings.Contains(string(r.Body), `"[1]"`) {
				t.Errorf("a rejected request reached the upstream: %s", r.Body)
			}
		}
	})
}

func TestReplayStateStripping(t *testing.T) {
	t.Parallel()
	shared := scripted.New(scripted.Script{Steps: []scripted.Step{{Text: "x"}}})
	other := scripted.New(scripted.Script{Steps: []scripted.Step{{Text: "y"}}})
	s, err := NewWithAdapters(nil, map[string]provider.Adapter{"a1": shared, "a2": shared, "b": other}, "a1", "a2", "b")
	if err != nil {
		t.Fatal(err)
	}
	hist := func(route string) *llmv1.Message {
		return &llmv1.Message{Role: llmv1.Role_ROLE_ASSISTANT, Provenance: &llmv1.AssistantProvenance{Provider: route, Model: "m", ReplayState: proto.String(`{"v":1}`)}}
	}
	req := &llmv1.GenerateRequest{Provider: "a1", Model: "m", Messages: []*llmv1.Message{userText("x"), hist("a2"), hist("b"), hist("gone"), hist("a1")}}
	before := proto.Clone(req)
	_, got, err := s.prepare(req)
	if err != nil {
		t.Fatal(err)
	}
	var kept []bool
	for _, m := range got.GetMessages()[1:] {
		kept = append(kept, m.GetProvenance().ReplayState != nil)
	}
	if diff := cmp.Diff([]bool{true, false, false, true}, kept); diff != "" {
		t.Errorf("replay state kept (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(before, req, protocmp.Transform()); diff != "" {
		t.Errorf("prepare mutated the caller's request:\n%s", diff)
	}
}

// configFromEnv is ConfigFromEnv of env, which must parse.
func configFromEnv(t *testing.T, env map[string]string) Config {
	t.Helper()
	cfg, err := ConfigFromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestConfigFromEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		env      map[string]string
		want     []string
		wantIdle time.Duration
	}{
		{"nothing set: scripted only", nil, []string{"scripted:scripted"}, 0},
		{"all", map[string]string{"DEEPSEEK_API_KEY": "k", "ANTHROPIC_API_KEY": "k", "OPENAI_API_KEY": "k"}, []string{"deepseek:deepseek", "anthropic:anthropic", "openai:openai", "scripted:scripted"}, 0},
		{"openai base url alone (local server)", map[string]string{"OPENAI_BASE_URL": "http://127.0.0.1:11434/v1"}, []string{"openai:openai", "scripted:scripted"}, 0},
		{"base url without key does not register deepseek", map[string]string{"DEEPSEEK_BASE_URL": "http://x"}, []string{"scripted:scripted"}, 0},
		{"idle timeout empty", map[string]string{"DSH_LLM_IDLE_TIMEOUT": ""}, []string{"scripted:scripted"}, 0},
		{"idle timeout", map[string]string{"DSH_LLM_IDLE_TIMEOUT": "90s"}, []string{"scripted:scripted"}, 90 * time.Second},
		{"idle timeout in bare seconds", map[string]string{"DSH_LLM_IDLE_TIMEOUT": "90"}, []string{"scripted:scripted"}, 90 * time.Second},
		{"idle timeout zero is the default", map[string]string{"DSH_LLM_IDLE_TIMEOUT": "0"}, []string{"scripted:scripted"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := configFromEnv(t, tt.env)
			if cfg.IdleTimeout != tt.wantIdle {
				t.Errorf("IdleTimeout %v, want %v", cfg.IdleTimeout, tt.wantIdle)
			}
			var got []string
			for _, r := range cfg.Routes {
				got = append(got, r.Name+":"+r.Kind)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("routes (-want +got):\n%s", diff)
			}
			if _, err := New(cfg, nil); err != nil {
				t.Errorf("New: %v", err)
			}
		})
	}
	// A DSH_LLM_IDLE_TIMEOUT that is not a duration is an error naming it,
	// not the default in silence.
	if _, err := ConfigFromEnv(func(k string) string { return map[string]string{"DSH_LLM_IDLE_TIMEOUT": "5 minutes"}[k] }); err == nil ||
		!strings.HasPrefix(err.Error(), `DSH_LLM_IDLE_TIMEOUT="5 minutes": not a duration`) {
		t.Errorf("ConfigFromEnv with DSH_LLM_IDLE_TIMEOUT=\"5 minutes\": %v, want an error naming it", err)
	}
}

func TestLoadConfigFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "gw.json")
	if err := os.WriteFile(path, []byte(`{"idle_timeout":"30s","routes":[
		{"name":"vllm","kind":"openai","base_url":"http://127.0.0.1:8000/v1","models":[{"id":"qwen","context_window":32768}]},
		{"name":"ollama","kind":"openai","base_url":"http://127.0.0.1:11434/v1","api_key_env":"OLLAMA_KEY"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"OLLAMA_KEY": "secret"}
	cfg, err := LoadConfigFile(path, configFromEnv(t, nil), func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range cfg.Routes {
		got = append(got, r.Name)
	}
	if diff := cmp.Diff([]string{"vllm", "ollama", "scripted"}, got); diff != "" {
		t.Errorf("routes (-want +got):\n%s", diff)
	}
	if cfg.IdleTimeout != 30*time.Second || cfg.Routes[1].APIKey != "secret" {
		t.Errorf("idle %v, key %q", cfg.IdleTimeout, cfg.Routes[1].APIKey)
	}
	if err := os.WriteFile(path, []byte(`{"routez":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfigFile(path, Config{}, os.Getenv); err == nil {
		t.Error("unknown field accepted")
	}
	if _, err := New(Config{Routes: []RouteConfig{{Name: "x", Kind: "bogus"}}}, nil); err == nil {
		t.Error("unknown kind accepted")
	}
	if _, err := New(Config{Routes: []RouteConfig{{Name: "x", Kind: KindScripted}, {Name: "x", Kind: KindScripted}}}, nil); err == nil {
		t.Error("duplicate route accepted")
	}
}

// TestKeysNeverLogged runs failing and succeeding calls with a provider
// that echoes the key, and checks neither the logs nor the failures carry
// it.
func TestKeysNeverLogged(t *testing.T) {
	t.Parallel()
	const key = "sk-live-0123456789abcdefSECRET"
	up := providertest.Serve(t, providertest.Reply{Status: 401, Body: []byte(`{"error":{"message":"Incorrect API key provided: ` + key + `","type":"invalid_request_error"}}`)})
	var logs strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	svc, err := New(Config{Routes: []RouteConfig{{Name: "ds", Kind: KindDeepSeek, BaseURL: up.URL, APIKey: key}, {Name: "an", Kind: KindAnthropic, BaseURL: up.URL, APIKey: key}}}, logger)
	if err != nil {
		t.Fatal(err)
	}
	var failures strings.Builder
	for _, route := range []string{"ds", "an"} {
		r, req, err := svc.prepare(&llmv1.GenerateRequest{Provider: route, Model: "m", Messages: []*llmv1.Message{userText("hi")}})
		if err != nil {
			t.Fatal(err)
		}
		for c := range svc.stream(t.Context(), r, req) {
			failures.WriteString(c.String())
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(logs.String(), key) || strings.Contains(failures.String(), key) || strings.Contains(failures.String(), "SECRET") {
		t.Fatalf("key leaked:\nlogs: %s\nfailures: %s", logs.String(), failures.String())
	}
	if !strings.Contains(failures.String(), "AUTH") {
		t.Fatalf("expected AUTH failures, got %s", failures.String())
	}
	for _, r := range up.Requests() {
		if r.Header.Get("Authorization") != "Bearer "+key && r.Header.Get("X-Api-Key") != key {
			t.Errorf("key not sent on %s", r.Path)
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestListModelsAsksTheServer: an OpenAI-compatible route with a base URL and
// no model lists what its server's GET /models answers, and says so (with
// UNAVAILABLE) when the server cannot tell, instead of an empty list.
func TestListModelsAsksTheServer(t *testing.T) {
	var gotAuth atomic.Value
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth.Store(r.Header.Get("Authorization"))
		switch r.URL.Path {
		case "/good/models":
			io.WriteString(w, `{"object":"list","data":[{"id":"qwen2.5-coder","object":"model"},{"id":"llama3.1:8b","object":"model"}]}`)
		case "/garbage/models":
			io.WriteString(w, `<html>`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer up.Close()
	tests := []struct {
		base     string
		want     []string
		wantCode codes.Code
		wantMsg  string
	}{
		{base: up.URL + "/good", want: []string{"qwen2.5-coder", "llama3.1:8b"}},
		{base: up.URL + "/missing", wantCode: codes.Unavailable, wantMsg: "HTTP 404"},
		{base: up.URL + "/garbage", wantCode: codes.Unavailable, wantMsg: "not an OpenAI model list"},
	}
	for _, tc := range tests {
		t.Run(tc.base, func(t *testing.T) {
			c := startGateway(t, configFromEnv(t, map[string]string{"OPENAI_BASE_URL": tc.base, "OPENAI_API_KEY": "k-secret"}))
			resp, err := c.ListModels(t.Context(), &llmv1.ListModelsRequest{Provider: "openai"})
			if tc.wantCode != codes.OK {
				if status.Code(err) != tc.wantCode || !strings.Contains(err.Error(), tc.wantMsg) || !strings.Contains(err.Error(), "OPENAI_MODEL") {
					t.Fatalf("got %v, want %v mentioning %q and OPENAI_MODEL", err, tc.wantCode, tc.wantMsg)
				}
				if strings.Contains(err.Error(), "k-secret") {
					t.Fatal("the key leaked into the error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, m := range resp.GetModels() {
				ids = append(ids, m.GetId())
			}
			if !slices.Equal(ids, tc.want) {
				t.Fatalf("models %v, want %v", ids, tc.want)
			}
			if gotAuth.Load() != "Bearer k-secret" {
				t.Fatalf("authorization %v", gotAuth.Load())
			}
		})
	}
}

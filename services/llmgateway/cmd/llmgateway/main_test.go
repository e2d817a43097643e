package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/reflection/grpc_reflection_v1"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/internal/grpcserver"
)

// TestBinary runs the command as a newcomer would with no keys set: the
// scripted route serves the demo, and reflection lists the service (what
// grpcurl needs).
func TestBinary(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	addrc := make(chan string, 1)
	errc := make(chan error, 1)
	env := map[string]string{"OTEL_SDK_DISABLED": "true"}
	go func() {
		errc <- run(ctx, []string{"--listen", "127.0.0.1:0"}, func(k string) string { return env[k] }, io.Discard, func(a string) { addrc <- a })
	}()
	var addr string
	select {
	case addr = <-addrc:
	case err := <-errc:
		t.Fatalf("run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("server did not start")
	}
	conn, err := grpcserver.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	rctx, rcancel := context.WithCancel(t.Context())
	defer rcancel()
	rc, err := grpc_reflection_v1.NewServerReflectionClient(conn).ServerReflectionInfo(rctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Send(&grpc_reflection_v1.ServerReflectionRequest{MessageRequest: &grpc_reflection_v1.ServerReflectionRequest_ListServices{ListServices: "*"}}); err != nil {
		t.Fatal(err)
	}
	resp, err := rc.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	if !strings.Contains(strings.Join(names, ","), "dsh.llm.v1.LlmGateway") {
		t.Errorf("reflection services = %v", names)
	}
	rcancel()

	c := llmv1.NewLlmGatewayClient(conn)
	lp, err := c.ListProviders(t.Context(), &llmv1.ListProvidersRequest{})
	if err != nil || len(lp.GetProviders()) != 1 || lp.GetProviders()[0].GetKind() != "scripted" {
		t.Fatalf("providers = %v, %v", lp, err)
	}
	s, err := c.Generate(t.Context(), &llmv1.GenerateRequest{Provider: "scripted", Model: "demo", Messages: []*llmv1.Message{{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: "hi"}}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	var last *llmv1.StreamChunk
	for {
		r, err := s.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		last = r.GetChunk()
	}
	if last.GetFinish().GetReason().GetToolCalls() == nil {
		t.Errorf("demo did not end with tool-calls: %v", last)
	}
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("run returned %v after shutdown", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("server did not shut down")
	}
}

// syncWriter collects a server's log.
type syncWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.WriteString(string(p))
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestRequiredProviders is the prod overlay's guard (issue 21): with
// --require-provider a gateway whose key Secret is missing refuses to start
// (the pod never gets ready) with a line naming the provider and its
// variable; with the key it serves; --scripted=false drops the demo route.
func TestRequiredProviders(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		args       []string
		env        map[string]string
		wantErr    string // "" = starts
		wantRoutes string
	}{
		{"missing key", []string{"--require-provider", "deepseek", "--scripted=false"}, nil, "deepseek (set DEEPSEEK_API_KEY", ""},
		{"one of two missing", []string{"--require-provider", "deepseek,anthropic"}, map[string]string{"DEEPSEEK_API_KEY": "k"}, "not configured: anthropic (set ANTHROPIC_API_KEY", ""},
		{"missing key from env", nil, map[string]string{"DSH_REQUIRE_PROVIDER": "deepseek"}, "deepseek (set DEEPSEEK_API_KEY", ""},
		{"scripted switched off cannot be required", []string{"--require-provider", "scripted", "--scripted=false"}, nil, "not configured: scripted", ""},
		{"key present, scripted off", []string{"--require-provider", "deepseek", "--scripted=false"}, map[string]string{"DEEPSEEK_API_KEY": "k"}, "", "routes=[deepseek]"},
		{"scripted off by env", nil, map[string]string{"DEEPSEEK_API_KEY": "k", "DSH_SCRIPTED": "false"}, "", "routes=[deepseek]"},
		{"scripted off by env, as 0", nil, map[string]string{"DEEPSEEK_API_KEY": "k", "DSH_SCRIPTED": "0"}, "", "routes=[deepseek]"},
		{"scripted on by env", nil, map[string]string{"DEEPSEEK_API_KEY": "k", "DSH_SCRIPTED": "true"}, "", `routes="[deepseek scripted]"`},
		{"default keeps scripted", []string{"--require-provider", "scripted"}, nil, "", "routes=[scripted]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			env := map[string]string{"OTEL_SDK_DISABLED": "true"}
			for k, v := range tc.env {
				env[k] = v
			}
			var log syncWriter
			ready := make(chan string, 1)
			errc := make(chan error, 1)
			go func() {
				errc <- run(ctx, append([]string{"--listen", "127.0.0.1:0"}, tc.args...), func(k string) string { return env[k] }, &log, func(a string) { ready <- a })
			}()
			select {
			case err := <-errc:
				if tc.wantErr == "" || err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("run = %v, want an error with %q", err, tc.wantErr)
				}
				if !strings.Contains(log.String(), "level=ERROR") || !strings.Contains(log.String(), tc.wantErr) {
					t.Fatalf("no ERROR line naming it:\n%s", log.String())
				}
			case <-ready:
				if tc.wantErr != "" {
					t.Fatalf("started; want it to refuse with %q", tc.wantErr)
				}
				if !strings.Contains(log.String(), tc.wantRoutes) {
					t.Fatalf("log lacks %q:\n%s", tc.wantRoutes, log.String())
				}
				cancel()
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("neither started nor failed")
			}
		})
	}
}

// TestMalformedVariables: a variable that configures the gateway but does
// not parse stops it before it serves, with one line naming the variable,
// its value and the form expected, even when the flag it defaults is
// given; unset, empty and well-formed values are taken (those rows stop at
// the --require-provider check, after the variables').
func TestMalformedVariables(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		env     map[string]string
		args    []string
		wantErr string
	}{
		{"unset", nil, nil, "not configured: deepseek"},
		{"empty", map[string]string{"DSH_LLM_PREFIX_CACHE_MIB": "", "DSH_LLM_PREFIX_CACHE_TENANT_MIB": "", "DSH_SCRIPTED": "", "DSH_LLM_IDLE_TIMEOUT": "", "DSH_MAX_CONNECTION_AGE": ""}, nil, "not configured: deepseek"},
		{"well-formed", map[string]string{"DSH_LLM_PREFIX_CACHE_MIB": "64", "DSH_LLM_PREFIX_CACHE_TENANT_MIB": "0", "DSH_SCRIPTED": "off", "DSH_LLM_IDLE_TIMEOUT": "300", "DSH_MAX_CONNECTION_AGE": "1m"}, nil, "not configured: deepseek"},
		{"size", map[string]string{"DSH_LLM_PREFIX_CACHE_MIB": "64MiB"}, nil, `DSH_LLM_PREFIX_CACHE_MIB="64MiB": not a decimal integer; unset means 128`},
		{"size under its flag", map[string]string{"DSH_LLM_PREFIX_CACHE_TENANT_MIB": "half"}, []string{"--prefix-cache-tenant-mib", "8"}, `DSH_LLM_PREFIX_CACHE_TENANT_MIB="half": not a decimal integer`},
		{"boolean", map[string]string{"DSH_SCRIPTED": "nope"}, nil, `DSH_SCRIPTED="nope": not a boolean (true or false; also 1 or 0, yes or no, on or off); unset means true`},
		{"duration of ConfigFromEnv", map[string]string{"DSH_LLM_IDLE_TIMEOUT": "5 minutes"}, nil, `DSH_LLM_IDLE_TIMEOUT="5 minutes": not a duration`},
		{"duration under its flag", map[string]string{"DSH_LLM_IDLE_TIMEOUT": "5 minutes"}, []string{"--idle-timeout", "1m"}, `DSH_LLM_IDLE_TIMEOUT="5 minutes": not a duration`},
		{"transport duration", map[string]string{"DSH_MAX_CONNECTION_AGE": "soon"}, nil, `DSH_MAX_CONNECTION_AGE="soon": not a duration`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"OTEL_SDK_DISABLED": "true"}
			for k, v := range tc.env {
				env[k] = v
			}
			args := append([]string{"--listen", "127.0.0.1:0", "--require-provider", "deepseek"}, tc.args...)
			err := run(t.Context(), args, func(k string) string { return env[k] }, io.Discard, func(string) { t.Error("started") })
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("run = %v, want one line with %q", err, tc.wantErr)
			}
		})
	}
}

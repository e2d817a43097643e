package main

import (
	"context"
	"errors"
	"io"
	"strings"
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

package gateway

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/internal/llmstream"
	"github.com/dsh-dev/dsh/services/llmgateway"
)

const answerSSE = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"ok\"}}]}\n\n" +
	"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n" +
	"data: [DONE]\n\n"

// upstream is a fake chat-completions provider that keeps every body.
type upstream struct {
	URL    string
	mu     sync.Mutex
	bodies [][]byte
}

func serveUpstream(t *testing.T) *upstream {
	u := &upstream{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.bodies = append(u.bodies, b)
		u.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, answerSSE)
	}))
	t.Cleanup(srv.Close)
	u.URL = srv.URL
	return u
}

func (u *upstream) seen() [][]byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([][]byte(nil), u.bodies...)
}

// serveGateway starts a real gateway (routes "p" and "whole" on up) and
// returns its address.
func serveGateway(t *testing.T, up string) string {
	svc, err := llmgateway.New(llmgateway.Config{Routes: []llmgateway.RouteConfig{
		{Name: "p", Kind: llmgateway.KindOpenAI, BaseURL: up}, {Name: "whole", Kind: llmgateway.KindOpenAI, BaseURL: up}}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpcserver.New(grpcserver.Config{Options: llmgateway.ServerOptions()})
	svc.Register(srv.Server)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx, lis); close(done) }()
	t.Cleanup(func() { cancel(); <-done; svc.Close() })
	return lis.Addr().String()
}

func steps(n int) []*llmv1.Message {
	text := func(s string) *llmv1.ContentBlock {
		return &llmv1.ContentBlock{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: s}}}
	}
	ms := []*llmv1.Message{{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{text("go")}}}
	for i := range n {
		id := fmt.Sprint("call_", i)
		ms = append(ms,
			&llmv1.Message{Role: llmv1.Role_ROLE_ASSISTANT, Content: []*llmv1.ContentBlock{
				{Block: &llmv1.ContentBlock_ToolCall{ToolCall: &llmv1.ToolCallBlock{Id: id, Name: "read", Arguments: `{"file_path":"a"}`}}}}},
			&llmv1.Message{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{
				{Block: &llmv1.ContentBlock_ToolResult{ToolResult: &llmv1.ToolResultBlock{ToolCallId: id, Content: []*llmv1.ContentBlock{text(strings.Repeat("notes ", 100))}}}}}})
	}
	return ms
}

// collect runs one Generate through c and returns its chunks (each must
// come once: one finish, the stream grammar holds).
func collect(t *testing.T, c *Client, req *llmv1.GenerateRequest) []*llmv1.StreamChunk {
	t.Helper()
	var out []*llmv1.StreamChunk
	for ch, err := range c.Generate(t.Context(), req) {
		if err != nil {
			t.Fatalf("generate: %v", err)
		}
		out = append(out, ch)
	}
	if err := llmstream.CheckStream(out); err != nil {
		t.Fatalf("stream: %v", err)
	}
	return out
}

// TestPrefixConversation drives a session's steps through the real client
// and gateway: each step after the first sends only the new messages; the
// provider receives, step by step, exactly the bytes of the whole request;
// when the gateway is replaced mid-session (a restart: the new one holds
// nothing) the step is sent whole once, transparently — the caller sees
// one attempt's chunks, the provider one request — and the next steps are
// incremental again.
func TestPrefixConversation(t *testing.T) {
	t.Parallel()
	up := serveUpstream(t)
	first, second := serveGateway(t, up.URL), serveGateway(t, up.URL)
	r := manual.NewBuilderWithScheme("prefixtest")
	r.InitialState(resolver.State{Addresses: []resolver.Address{{Addr: first}}})
	conn, err := grpcserver.Dial(r.Scheme()+":///gateway", grpc.WithResolvers(r))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	c := New(conn)
	whole := New(conn) // a client of its own: no session state shared
	conv := steps(8)
	sys := "system"
	tools := []*llmv1.ToolSchema{{Name: "read", Parameters: `{"type":"object"}`}}
	referred := int64(0)
	for step := range 8 {
		if step == 4 {
			// The gateway restarts: the session's connection now reaches
			// a gateway that holds nothing.
			r.UpdateState(resolver.State{Addresses: []resolver.Address{{Addr: second}}})
		}
		msgs := conv[:1+2*step]
		before := len(up.seen())
		chunks := collect(t, c, &llmv1.GenerateRequest{Provider: "p", Model: "m", System: &sys, Tools: tools, Messages: msgs,
			SessionId: "s1", Tenant: "t", RememberPrefix: true})
		got := up.seen()[before:]
		if len(got) != 1 {
			t.Fatalf("step %d: the provider saw %d requests, want 1 (no double billing)", step, len(got))
		}
		if n := len(chunks); n == 0 || chunks[n-1].GetFinish() == nil {
			t.Fatalf("step %d: %d chunks without a finish", step, n)
		}
		// The same request, whole, on another route of the same gateway.
		collect(t, whole, &llmv1.GenerateRequest{Provider: "whole", Model: "m", System: &sys, Tools: tools, Messages: msgs})
		want := up.seen()[before+1]
		if !bytes.Equal(got[0], want) {
			t.Fatalf("step %d: the provider's body differs from the whole request's:\n%s\n%s", step, got[0], want)
		}
		now := c.ReferredBytes()
		switch {
		case step == 0 || step == 4:
			// The first step, and the resend after the restart: whole.
			if now != referred && step == 0 {
				t.Errorf("step %d referred %d bytes", step, now-referred)
			}
		case now <= referred:
			t.Errorf("step %d sent the whole conversation (referred %d bytes so far)", step, now)
		}
		referred = now
	}
	if m := c.PrefixMisses(); m != 1 {
		t.Errorf("misses = %d, want 1 (the restart)", m)
	}
	if m := whole.PrefixMisses(); m != 0 || whole.ReferredBytes() != 0 {
		t.Errorf("a request not asking to be remembered was sent by reference")
	}
}

// TestPrefixOneOffs: a title or compaction call (not remembered) is sent
// whole and leaves the session's reference alone: the next step still
// names the conversation's last step.
func TestPrefixOneOffs(t *testing.T) {
	t.Parallel()
	up := serveUpstream(t)
	conn, err := grpcserver.Dial(serveGateway(t, up.URL))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	c := New(conn)
	conv := steps(3)
	step := func(n int) {
		collect(t, c, &llmv1.GenerateRequest{Provider: "p", Model: "m", Messages: conv[:n], SessionId: "s", Tenant: "t", RememberPrefix: true})
	}
	step(1)
	step(3)
	r0 := c.ReferredBytes()
	// A title call of the same session: its own messages, whole.
	collect(t, c, &llmv1.GenerateRequest{Provider: "p", Model: "m", Messages: conv[:1], SessionId: "s", Purpose: llmv1.Purpose_PURPOSE_TITLE})
	if c.ReferredBytes() != r0 {
		t.Error("a title call was sent by reference")
	}
	step(5)
	if c.ReferredBytes() <= r0 || c.PrefixMisses() != 0 {
		t.Errorf("the step after a title call: referred %d (before %d), misses %d", c.ReferredBytes(), r0, c.PrefixMisses())
	}
}

package llmgateway

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/internal/grpcserver"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/prefix"
	"github.com/dsh-dev/dsh/services/llmgateway/internal/providertest"
)

// prefixGateway is a gateway served on a loopback port with its service.
type prefixGateway struct {
	svc *Service
	c   llmv1.LlmGatewayClient
}

func startPrefixGateway(t testing.TB, cfg Config) prefixGateway {
	t.Helper()
	svc, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpcserver.New(grpcserver.Config{Options: ServerOptions()})
	svc.Register(srv.Server)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx, lis); close(done) }()
	conn, err := grpcserver.Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(); cancel(); <-done; svc.Close() })
	return prefixGateway{svc: svc, c: llmv1.NewLlmGatewayClient(conn)}
}

// send runs req to its end; it returns the remembered id (the header) and
// the error the stream ended with, if any, and fails on any chunk that
// arrived before an error.
func (g prefixGateway) send(t *testing.T, req *llmv1.GenerateRequest) (string, error) {
	t.Helper()
	var hdr metadata.MD
	s, err := g.c.Generate(t.Context(), req, grpc.Header(&hdr))
	if err != nil {
		return "", err
	}
	chunks, err := recvAll(t, s)
	if err != nil && len(chunks) > 0 {
		t.Fatalf("%d chunks before the error %v", len(chunks), err)
	}
	if v := hdr.Get(PrefixHeader); len(v) == 1 {
		return v[0], err
	}
	return "", err
}

// conversation is a tool-using conversation of n steps: the user's prompt,
// then per step the assistant's tool call and its result.
func conversation(steps int) []*llmv1.Message {
	ms := []*llmv1.Message{userText("read the notes")}
	for i := range steps {
		id := fmt.Sprintf("call_%d", i)
		ms = append(ms,
			&llmv1.Message{Role: llmv1.Role_ROLE_ASSISTANT, Content: []*llmv1.ContentBlock{
				{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: "Step <" + id + ">."}}},
				{Block: &llmv1.ContentBlock_ToolCall{ToolCall: &llmv1.ToolCallBlock{Id: id, Name: "read", Arguments: `{"file_path":"notes.txt"}`}}}}},
			&llmv1.Message{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{
				{Block: &llmv1.ContentBlock_ToolResult{ToolResult: &llmv1.ToolResultBlock{ToolCallId: id, Content: []*llmv1.ContentBlock{
					{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: strings.Repeat("line of the notes & <more>\n", 20+i)}}}}}}}}})
	}
	return ms
}

func prefixMissInfo(err error) bool {
	st, _ := status.FromError(err)
	if st.Code() != codes.FailedPrecondition {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == ReasonPrefixNotCached && info.GetDomain() == ErrorDomain {
			return true
		}
	}
	return false
}

// TestPrefixBodiesByteIdentical walks a conversation step by step, each
// step naming the previous one, and checks that the provider receives the
// very bytes the whole request gives (sent whole to a second route on the
// same upstream), for chat-completions routes with and without a system
// prompt and with a route switch in the middle.
func TestPrefixBodiesByteIdentical(t *testing.T) {
	t.Parallel()
	up := providertest.Serve(t, providertest.Reply{Body: []byte(textSSE)})
	g := startPrefixGateway(t, Config{Routes: []RouteConfig{
		{Name: "a", Kind: KindOpenAI, BaseURL: up.URL},
		{Name: "b", Kind: KindDeepSeek, BaseURL: up.URL, APIKey: "sk-testtesttesttest"},
		{Name: "whole", Kind: KindOpenAI, BaseURL: up.URL},
		{Name: "whole-ds", Kind: KindDeepSeek, BaseURL: up.URL, APIKey: "sk-testtesttesttest"},
	}})
	sys := "You are terse. <b>&</b>"
	tools := []*llmv1.ToolSchema{{Name: "read", Description: "reads", Parameters: `{"type":"object","properties":{"file_path":{"type":"string"}}}`}}
	for _, tc := range []struct {
		name   string
		system *string
		routes []string // the route of each step
	}{
		{"system", &sys, []string{"a", "a", "a", "a", "a", "a"}},
		{"no system", nil, []string{"a", "a", "a"}},
		{"route switch", &sys, []string{"a", "a", "b", "b", "a"}},
		{"same head", &sys, []string{"a", "a", "a", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conv := conversation(len(tc.routes))
			id, held := "", 0
			for step, route := range tc.routes {
				n := 1 + 2*step
				req := &llmv1.GenerateRequest{Provider: route, Model: "m", System: tc.system, Tools: tools, Messages: conv[held:n],
					SessionId: "s", Tenant: "t-" + tc.name, RememberPrefix: true}
				if id != "" {
					req.Prefix = &llmv1.PrefixRef{Id: id, Count: uint32(held)}
					req.Messages, req.Continued = nil, req.Messages
					if tc.name == "same head" {
						req.Prefix.SameSystem, req.Prefix.SameTools, req.System, req.Tools = true, true, nil, nil
					}
				}
				before := len(up.Requests())
				var err error
				if id, err = g.send(t, req); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				if id == "" {
					t.Fatalf("step %d: no %s header", step, PrefixHeader)
				}
				held = n
				whole := "whole"
				if route == "b" {
					whole = "whole-ds"
				}
				if _, err := g.send(t, &llmv1.GenerateRequest{Provider: whole, Model: "m", System: tc.system, Tools: tools, Messages: conv[:n]}); err != nil {
					t.Fatal(err)
				}
				seen := up.Requests()[before:]
				if len(seen) != 2 {
					t.Fatalf("step %d: upstream saw %d requests, want 2", step, len(seen))
				}
				if !bytes.Equal(seen[0].Body, seen[1].Body) {
					t.Fatalf("step %d: the body of the continued request differs from the whole request's:\n%s\n%s", step, seen[0].Body, seen[1].Body)
				}
			}
			if st, _ := g.svc.PrefixStats(); st.Hits < int64(len(tc.routes)-1) {
				t.Errorf("hits = %d, want >= %d", st.Hits, len(tc.routes)-1)
			}
		})
	}
}

// TestPrefixReferenceRefused tries, like an attacker or an unlucky
// replica, to use a conversation the gateway must not resolve: every one
// is FAILED_PRECONDITION PREFIX_NOT_CACHED, answered before any chunk and
// before anything reaches the provider.
func TestPrefixReferenceRefused(t *testing.T) {
	t.Parallel()
	up := providertest.Serve(t, providertest.Reply{Body: []byte(textSSE)})
	cfg := Config{Routes: []RouteConfig{{Name: "a", Kind: KindOpenAI, BaseURL: up.URL}}}
	g := startPrefixGateway(t, cfg)
	conv := conversation(3)
	req := func(tenant string, msgs []*llmv1.Message) *llmv1.GenerateRequest {
		return &llmv1.GenerateRequest{Provider: "a", Model: "m", Messages: msgs, SessionId: "s", Tenant: tenant, RememberPrefix: true}
	}
	victim, err := g.send(t, req("victim", conv[:3]))
	if err != nil || victim == "" {
		t.Fatalf("remember: id %q, %v", victim, err)
	}
	// A second gateway (a restart, another replica) and one that keeps
	// almost nothing (eviction).
	restarted := startPrefixGateway(t, cfg)
	tiny := startPrefixGateway(t, Config{Routes: cfg.Routes, PrefixCacheBytes: 1024})
	tinyID, err := tiny.send(t, req("victim", conv[:3]))
	if err != nil || tinyID == "" {
		t.Fatalf("tiny gateway: id %q, %v", tinyID, err)
	}
	if _, err := tiny.send(t, req("other", conv[:3])); err != nil { // the same size again: the victim's is evicted
		t.Fatal(err)
	}
	off := startPrefixGateway(t, Config{Routes: cfg.Routes, PrefixCacheBytes: -1})
	for _, tc := range []struct {
		name   string
		g      prefixGateway
		tenant string
		ref    *llmv1.PrefixRef
	}{
		{"another tenant", g, "attacker", &llmv1.PrefixRef{Id: victim, Count: 3}},
		{"another tenant, same tools", g, "attacker", &llmv1.PrefixRef{Id: victim, Count: 3, SameTools: true}},
		{"no tenant", g, "", &llmv1.PrefixRef{Id: victim, Count: 3}},
		{"tenant with a NUL", g, "victim\x00", &llmv1.PrefixRef{Id: victim, Count: 3}},
		{"wrong count", g, "victim", &llmv1.PrefixRef{Id: victim, Count: 2}},
		{"unknown id", g, "victim", &llmv1.PrefixRef{Id: strings.Repeat("ab", 32), Count: 3}},
		{"short id", g, "victim", &llmv1.PrefixRef{Id: victim[:10], Count: 3}},
		{"not hex", g, "victim", &llmv1.PrefixRef{Id: strings.Repeat("zz", 32), Count: 3}},
		{"restarted gateway", restarted, "victim", &llmv1.PrefixRef{Id: victim, Count: 3}},
		{"evicted", tiny, "victim", &llmv1.PrefixRef{Id: tinyID, Count: 3}},
		{"cache off", off, "victim", &llmv1.PrefixRef{Id: victim, Count: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(up.Requests())
			r := req(tc.tenant, nil)
			r.Prefix, r.Continued = tc.ref, conv[3:5]
			_, err := tc.g.send(t, r)
			if !prefixMissInfo(err) {
				t.Fatalf("err = %v, want FAILED_PRECONDITION with reason %s", err, ReasonPrefixNotCached)
			}
			if strings.Contains(status.Convert(err).Message(), "tenant") {
				t.Errorf("the miss says why (an existence oracle): %q", status.Convert(err).Message())
			}
			if n := len(up.Requests()) - before; n != 0 {
				t.Errorf("the provider saw %d requests for a refused reference", n)
			}
		})
	}
	// The victim's own reference still resolves.
	r := req("victim", nil)
	r.Prefix, r.Continued = &llmv1.PrefixRef{Id: victim, Count: 3}, conv[3:5]
	if _, err := g.send(t, r); err != nil {
		t.Fatalf("the owner's reference: %v", err)
	}
	if got := up.Requests(); !bytes.Contains(got[len(got)-1].Body, []byte(`"tool_call_id":"call_1"`)) {
		t.Errorf("the resolved request lacks the referenced messages: %s", got[len(got)-1].Body)
	}
}

// TestPrefixBounds: an assembled conversation over the request limit is
// refused like an oversized request; a referenced empty tail (the retry
// of a step) is a whole request; a reference is still validated.
func TestPrefixBounds(t *testing.T) {
	t.Parallel()
	up := providertest.Serve(t, providertest.Reply{Body: []byte(textSSE)})
	g := startPrefixGateway(t, Config{Routes: []RouteConfig{{Name: "a", Kind: KindOpenAI, BaseURL: up.URL}}})
	big := userText(strings.Repeat("x", MaxRequestBytes/2+1))
	id, err := g.send(t, &llmv1.GenerateRequest{Provider: "a", Model: "m", Messages: []*llmv1.Message{big}, Tenant: "t", RememberPrefix: true})
	if err != nil || id == "" {
		t.Fatalf("id %q, %v", id, err)
	}
	// The retry of the same step: nothing new.
	id2, err := g.send(t, &llmv1.GenerateRequest{Provider: "a", Model: "m", Tenant: "t", RememberPrefix: true, Prefix: &llmv1.PrefixRef{Id: id, Count: 1}})
	if err != nil || id2 != id {
		t.Fatalf("retry: id %q (want %q), %v", id2, id, err)
	}
	// Two messages of half the limit are more than one request may carry.
	n := len(up.Requests())
	_, err = g.send(t, &llmv1.GenerateRequest{Provider: "a", Model: "m", Continued: []*llmv1.Message{big}, Tenant: "t", Prefix: &llmv1.PrefixRef{Id: id, Count: 1}})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "larger than max") {
		t.Errorf("oversized conversation: %v", err)
	}
	// Tools or a system prompt beside "the same as before" are refused.
	_, err = g.send(t, &llmv1.GenerateRequest{Provider: "a", Model: "m", Tenant: "t", Tools: []*llmv1.ToolSchema{{Name: "x"}},
		Prefix: &llmv1.PrefixRef{Id: id, Count: 1, SameTools: true}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "same_tools") {
		t.Errorf("tools with same_tools: %v", err)
	}
	sys := ""
	_, err = g.send(t, &llmv1.GenerateRequest{Provider: "a", Model: "m", Tenant: "t", System: &sys,
		Prefix: &llmv1.PrefixRef{Id: id, Count: 1, SameSystem: true}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "same_system") {
		t.Errorf("system with same_system: %v", err)
	}
	// A new message without a role is refused as in a whole request.
	_, err = g.send(t, &llmv1.GenerateRequest{Provider: "a", Model: "m", Continued: []*llmv1.Message{{}}, Tenant: "t", Prefix: &llmv1.PrefixRef{Id: id, Count: 1}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "messages[1].role") {
		t.Errorf("invalid new message: %v", err)
	}
	// The new messages of a referenced request go in continued, never in
	// messages (a gateway that predates prefix would take them for the
	// whole conversation), and continued needs a reference.
	_, err = g.send(t, &llmv1.GenerateRequest{Provider: "a", Model: "m", Messages: []*llmv1.Message{userText("x")}, Tenant: "t", Prefix: &llmv1.PrefixRef{Id: id, Count: 1}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "messages: must be empty when prefix is set") {
		t.Errorf("messages with prefix: %v", err)
	}
	_, err = g.send(t, &llmv1.GenerateRequest{Provider: "a", Model: "m", Continued: []*llmv1.Message{userText("x")}, Tenant: "t"})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "continued") {
		t.Errorf("continued without prefix: %v", err)
	}
	if len(up.Requests()) != n {
		t.Errorf("refused requests reached the provider")
	}
}

// TestPrefixOldGatewayRefuses: a gateway that predates prefix validates a
// request with prepare alone (no resolve: it ignores prefix and
// continued). A referenced request then has no messages and is refused
// INVALID_ARGUMENT before anything goes upstream, never answered as a
// conversation of only its tail.
func TestPrefixOldGatewayRefuses(t *testing.T) {
	t.Parallel()
	svc, err := New(Config{Routes: []RouteConfig{{Name: "a", Kind: KindOpenAI, BaseURL: "http://127.0.0.1:1"}}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	sys := "s"
	_, _, err = svc.prepare(&llmv1.GenerateRequest{Provider: "a", Model: "m", Tenant: "t", RememberPrefix: true, Continued: conversation(2)[1:],
		Prefix: &llmv1.PrefixRef{Id: strings.Repeat("ab", 32), Count: 1, SameSystem: true}, System: &sys})
	if status.Code(toStatus(svc.log, "Generate", err)) != codes.InvalidArgument || !strings.Contains(err.Error(), "messages") {
		t.Fatalf("a referenced request validated without resolving its reference: %v, want INVALID_ARGUMENT on messages", err)
	}
}

// TestPrefixSizeCountsCurrentHead: the assembled-size bound counts the
// system prompt and tools the request uses: a request that replaces the
// remembered conversation's large tools with small ones is measured
// without them, and one that keeps them (same_tools) with them.
func TestPrefixSizeCountsCurrentHead(t *testing.T) {
	t.Parallel()
	svc, err := New(Config{Routes: []RouteConfig{{Name: "a", Kind: KindOpenAI, BaseURL: "http://127.0.0.1:1"}}, PrefixCacheBytes: 2 * MaxRequestBytes}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	bigTools := []*llmv1.ToolSchema{{Name: "big", Description: strings.Repeat("d", MaxRequestBytes/2)}}
	first := []*llmv1.Message{userText("go")}
	e, err := svc.prefixes.Put("t", nil, prefix.Request{Messages: first, Added: first, Tools: bigTools})
	if err != nil || e == nil {
		t.Fatalf("put: %v %v", e, err)
	}
	tail := []*llmv1.Message{userText(strings.Repeat("x", MaxRequestBytes/2+1024))}
	for _, tc := range []struct {
		name      string
		sameTools bool
		tools     []*llmv1.ToolSchema
		ok        bool
	}{
		{"new small tools", false, []*llmv1.ToolSchema{{Name: "small"}}, true},
		{"the same large tools", true, nil, false},
	} {
		req := &llmv1.GenerateRequest{Provider: "a", Model: "m", Tenant: "t", Tools: tc.tools, Continued: tail,
			Prefix: &llmv1.PrefixRef{Id: e.ID(), Count: 1, SameTools: tc.sameTools}}
		_, _, err := svc.resolve(req)
		if (err == nil) != tc.ok || (err != nil && status.Code(err) != codes.ResourceExhausted) {
			t.Errorf("%s: %v, want ok %v (else RESOURCE_EXHAUSTED)", tc.name, err, tc.ok)
		}
	}
}

package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/protobuf/proto"

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
func serveGateway(t *testing.T, up string) string { return serveGatewayCache(t, up, 0) }

// dialGateway is a Client of the gateway at addr, closed with the test.
func dialGateway(t testing.TB, addr string) *Client {
	t.Helper()
	conn, err := grpcserver.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return New(conn)
}

// serveGatewayCache is serveGateway with the gateway's prefix cache bound
// (0: the default, < 0: off).
func serveGatewayCache(t *testing.T, up string, cacheBytes int64) string {
	svc, err := llmgateway.New(llmgateway.Config{PrefixCacheBytes: cacheBytes, Routes: []llmgateway.RouteConfig{
		{Name: "p", Kind: llmgateway.KindOpenAI, BaseURL: up}, {Name: "whole", Kind: llmgateway.KindOpenAI, BaseURL: up}}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpcserver.New(grpcserver.Config{Options: llmgateway.ServerOptions()})
	svc.Register(srv.Server)
	return serveOn(t, srv, svc.Close)
}

// serveOn serves srv on a loopback port until the test ends (then calls
// closeFn) and returns its address.
func serveOn(t *testing.T, srv *grpcserver.Server, closeFn func()) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Serve(ctx, lis); close(done) }()
	t.Cleanup(func() { cancel(); <-done; closeFn() })
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
		// The same request, whole, on another route of the same gateway
		// (a session's request that does not ask to be remembered).
		collect(t, whole, &llmv1.GenerateRequest{Provider: "whole", Model: "m", System: &sys, Tools: tools, Messages: msgs, SessionId: "s1", Tenant: "t"})
		want := up.seen()[before+1]
		if !bytes.Equal(got[0], want) {
			t.Fatalf("step %d: the provider's body differs from the whole request's:\n%s\n%s", step, got[0], want)
		}
		now := c.ReferredBytes()
		switch {
		case step == 0:
			if now != 0 {
				t.Errorf("step 0 referred %d bytes", now)
			}
		case step == 4:
			// The step after the restart named a conversation the new
			// gateway does not hold: a miss, then the whole request
			// (checked above: one provider request, the whole body).
			if m := c.PrefixMisses(); m != 1 {
				t.Errorf("step 4: misses = %d, want 1 (the restart)", m)
			}
		case now <= referred:
			t.Errorf("step %d sent the whole conversation (referred %d bytes so far)", step, now)
		default:
			// What the reference saved is exactly the previous step's
			// messages and the tools, as they would have been encoded.
			want := int64(len(c.codec.tools.buf))
			for _, m := range conv[:1+2*(step-1)] {
				want += int64(fieldSize(messagesField, proto.Size(m)))
			}
			if now-referred != want {
				t.Errorf("step %d referred %d bytes, want %d", step, now-referred, want)
			}
		}
		referred = now
		// The gateway holds this step: the client keeps no encoded copy
		// of the history for the session (the next step refers to it).
		c.codec.mu.Lock()
		se := c.codec.sessions["s1"]
		c.codec.mu.Unlock()
		se.mu.Lock()
		if len(se.buf) != 0 || len(se.msgs) != 0 || se.ref == "" {
			t.Errorf("step %d: held as %q, still caching %d messages in %d bytes", step, se.ref, len(se.msgs), len(se.buf))
		}
		se.mu.Unlock()
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
	c := dialGateway(t, serveGateway(t, serveUpstream(t).URL))
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

// TestPrefixOneOffDropsEncoding: a one-off of a session whose conversation
// the gateway holds (here a compaction call: the history plus an
// instruction, no RememberPrefix) is encoded whole, and the session keeps
// no encoded copy of it after: the next step refers to the held
// conversation, so an idle session after an end-of-turn compaction holds no
// encoded history.
func TestPrefixOneOffDropsEncoding(t *testing.T) {
	t.Parallel()
	c := dialGateway(t, serveGateway(t, serveUpstream(t).URL))
	conv := steps(3)
	cached := func() (ref string, msgs, n int) {
		c.codec.mu.Lock()
		se := c.codec.sessions["s"]
		c.codec.mu.Unlock()
		se.mu.Lock()
		defer se.mu.Unlock()
		return se.ref, len(se.msgs), len(se.buf)
	}
	collect(t, c, &llmv1.GenerateRequest{Provider: "p", Model: "m", Messages: conv[:3], SessionId: "s", Tenant: "t", RememberPrefix: true})
	if ref, _, _ := cached(); ref == "" {
		t.Fatal("the gateway did not hold the step")
	}
	compact := &llmv1.GenerateRequest{Provider: "p", Model: "m", SessionId: "s", Tenant: "t", Purpose: llmv1.Purpose_PURPOSE_COMPACTION,
		Messages: append(slices.Clip(conv[:3]), &llmv1.Message{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{
			{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: "summarise"}}}}})}
	r0 := c.ReferredBytes()
	collect(t, c, compact)
	if c.ReferredBytes() != r0 {
		t.Error("a compaction call was sent by reference")
	}
	if ref, msgs, n := cached(); ref == "" || msgs != 0 || n != 0 {
		t.Errorf("after the compaction call: ref %q, %d cached bytes of %d messages; want the reference and no cache", ref, n, msgs)
	}
	// The bytes sent are the whole request's (marshalRoundTrip decodes them
	// after the cache they came from was dropped).
	bs := marshalRoundTrip(t, c.codec, compact)
	if got, want := bs.Materialize(), proto.Size(asSent(compact)); len(got) != want {
		t.Errorf("the compaction call went out in %d bytes, want %d (the whole request)", len(got), want)
	}
	if _, msgs, n := cached(); msgs != 0 || n != 0 {
		t.Errorf("after the compaction call's encoding: %d cached bytes of %d messages", n, msgs)
	}
}

// mixedGateway stands for the replicas of a gateway in a rolling upgrade:
// while old is set it behaves like a gateway that predates remembered
// conversations (it drops GenerateRequest fields 11–14, which such a
// gateway does not know, before a real gateway validates and serves the
// rest); otherwise it forwards the request as it is. It records what it
// received.
type mixedGateway struct {
	llmv1.UnimplementedLlmGatewayServer
	gw  llmv1.LlmGatewayClient
	old atomic.Bool
	mu  sync.Mutex
	got []*llmv1.GenerateRequest
}

func (g *mixedGateway) Generate(req *llmv1.GenerateRequest, stream grpc.ServerStreamingServer[llmv1.GenerateResponse]) error {
	g.mu.Lock()
	g.got = append(g.got, proto.CloneOf(req))
	g.mu.Unlock()
	if g.old.Load() {
		req.Prefix, req.RememberPrefix, req.Tenant, req.Continued = nil, false, "", nil
	}
	s, err := g.gw.Generate(stream.Context(), req)
	if err != nil {
		return err
	}
	for first := true; ; first = false {
		resp, err := s.Recv()
		if first {
			if md, _ := s.Header(); len(md) > 0 {
				if err := stream.SendHeader(md); err != nil {
					return err
				}
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// received returns the requests received since the n-th.
func (g *mixedGateway) received(n int) []*llmv1.GenerateRequest {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.got[n:])
}

func dialMixed(t *testing.T, gw string) (*mixedGateway, *grpc.ClientConn) {
	t.Helper()
	back, err := grpcserver.Dial(gw)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = back.Close() })
	m := &mixedGateway{gw: llmv1.NewLlmGatewayClient(back)}
	srv := grpcserver.New(grpcserver.Config{})
	llmv1.RegisterLlmGatewayServer(srv.Server, m)
	conn, err := grpcserver.Dial(serveOn(t, srv, func() {}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return m, conn
}

// TestPrefixOldGateway: in a rolling upgrade a session's step can reach a
// replica that predates remembered conversations, holding a reference an
// upgraded one gave. That replica must never take the new messages for the
// whole conversation (the provider would answer a truncated one, without
// its system prompt and tools): it sees a request without messages and
// refuses it INVALID_ARGUMENT before anything goes upstream; the client
// sends the step whole once — the provider gets exactly the whole
// request's body, once — and sends whole for a while, without a refusal
// per step; afterwards it references again.
func TestPrefixOldGateway(t *testing.T) {
	t.Parallel()
	up := serveUpstream(t)
	mixed, conn := dialMixed(t, serveGateway(t, up.URL))
	c := New(conn)
	clock := time.Unix(1_000_000, 0)
	c.now = func() time.Time { return clock }
	whole := New(conn)
	conv := steps(6)
	sys := "system"
	tools := []*llmv1.ToolSchema{{Name: "read", Parameters: `{"type":"object"}`}}
	for step := range 6 {
		switch step {
		case 1:
			mixed.old.Store(true) // the next replica is an old one
		case 3:
			mixed.old.Store(false)
			clock = clock.Add(refusedBackoff)
		}
		msgs := conv[:1+2*step]
		before, calls := len(up.seen()), len(mixed.received(0))
		collect(t, c, &llmv1.GenerateRequest{Provider: "p", Model: "m", System: &sys, Tools: tools, Messages: msgs,
			SessionId: "s1", Tenant: "t", RememberPrefix: true})
		sent := mixed.received(calls)
		got := up.seen()[before:]
		if len(got) != 1 {
			t.Fatalf("step %d: the provider saw %d requests, want 1", step, len(got))
		}
		collect(t, whole, &llmv1.GenerateRequest{Provider: "whole", Model: "m", System: &sys, Tools: tools, Messages: msgs, SessionId: "s1", Tenant: "t"})
		if want := up.seen()[before+1]; !bytes.Equal(got[0], want) {
			t.Fatalf("step %d: the provider's body differs from the whole request's (a truncated conversation?):\n%s\n%s", step, got[0], want)
		}
		for i, r := range sent {
			if r.GetPrefix() == nil && len(r.GetMessages()) != len(msgs) {
				t.Fatalf("step %d call %d: %d messages sent as a whole conversation of %d", step, i, len(r.GetMessages()), len(msgs))
			}
			if r.GetPrefix() != nil && len(r.GetMessages()) != 0 {
				t.Fatalf("step %d call %d: a reference with %d messages (an old gateway would take them for the whole)", step, i, len(r.GetMessages()))
			}
		}
		referenced := len(sent) > 0 && sent[0].GetPrefix() != nil
		want := map[int][2]any{ // step: calls, first call referenced
			0: {1, false}, // the first step
			1: {2, true},  // the old replica refuses the reference; the step goes whole
			2: {1, false}, // whole for a while, without a refusal
			3: {1, false}, // upgraded, after the while: nothing is held yet
			4: {1, true},  // referenced again
			5: {1, true},
		}[step]
		if len(sent) != want[0].(int) || referenced != want[1].(bool) {
			t.Errorf("step %d: %d calls, first referenced %v; want %d, %v", step, len(sent), referenced, want[0], want[1])
		}
	}
	if m := c.PrefixMisses(); m != 1 {
		t.Errorf("misses = %d, want 1 (the old replica)", m)
	}
}

// TestPrefixCacheOff: a gateway that never names a remembered conversation
// (its cache off) never gets a reference: every step goes whole, and the
// provider receives exactly the whole request's body.
func TestPrefixCacheOff(t *testing.T) {
	t.Parallel()
	up := serveUpstream(t)
	mixed, conn := dialMixed(t, serveGatewayCache(t, up.URL, -1))
	c, whole := New(conn), New(conn)
	conv := steps(4)
	for step := range 4 {
		msgs := conv[:1+2*step]
		before := len(up.seen())
		collect(t, c, &llmv1.GenerateRequest{Provider: "p", Model: "m", Messages: msgs, SessionId: "s1", Tenant: "t", RememberPrefix: true})
		collect(t, whole, &llmv1.GenerateRequest{Provider: "whole", Model: "m", Messages: msgs, SessionId: "s1", Tenant: "t"})
		got := up.seen()[before:]
		if len(got) != 2 || !bytes.Equal(got[0], got[1]) {
			t.Fatalf("step %d: %d provider requests, or the body differs from the whole request's", step, len(got))
		}
	}
	for i, r := range mixed.received(0) {
		if r.GetPrefix() != nil || len(r.GetContinued()) > 0 {
			t.Errorf("call %d went out as a reference to a gateway that never named one", i)
		}
	}
	if c.ReferredBytes() != 0 || c.PrefixMisses() != 0 {
		t.Errorf("referred %d bytes, %d misses", c.ReferredBytes(), c.PrefixMisses())
	}
}

// TestPrefixKeptAcrossRefusedStep: a step the gateway refuses before its
// response header for a reason other than the reference (here an unknown
// route) leaves the session's reference alone: the next step still names
// the conversation the gateway holds.
func TestPrefixKeptAcrossRefusedStep(t *testing.T) {
	t.Parallel()
	c := dialGateway(t, serveGateway(t, serveUpstream(t).URL))
	conv := steps(3)
	req := func(route string, n int) *llmv1.GenerateRequest {
		return &llmv1.GenerateRequest{Provider: route, Model: "m", Messages: conv[:n], SessionId: "s", Tenant: "t", RememberPrefix: true}
	}
	collect(t, c, req("p", 1))
	for _, err := range c.Generate(t.Context(), req("nope", 3)) {
		if err == nil {
			t.Fatal("a step on an unknown route was served")
		}
	}
	r0 := c.ReferredBytes()
	collect(t, c, req("p", 3))
	if c.ReferredBytes() <= r0 || c.PrefixMisses() != 0 {
		t.Errorf("the step after a refused one went whole (referred %d, before %d; misses %d)", c.ReferredBytes(), r0, c.PrefixMisses())
	}
}

// TestWholeRequestRefusedOnce: a request that went out whole and is refused
// INVALID_ARGUMENT (here: no messages) yields that one error and is not
// sent again — whether the consumer reads on or stops at the error (a
// second yield after a stop would panic).
func TestWholeRequestRefusedOnce(t *testing.T) {
	t.Parallel()
	c := dialGateway(t, serveGateway(t, serveUpstream(t).URL))
	for _, tc := range []struct {
		name string
		req  *llmv1.GenerateRequest
		stop bool
	}{
		{"one-off, read on", &llmv1.GenerateRequest{Provider: "p", Model: "m"}, false},
		{"one-off, stop at the error", &llmv1.GenerateRequest{Provider: "p", Model: "m"}, true},
		{"a session's step, read on", &llmv1.GenerateRequest{Provider: "p", Model: "m", SessionId: "s", Tenant: "t", RememberPrefix: true}, false},
		{"a session's step, stop at the error", &llmv1.GenerateRequest{Provider: "p", Model: "m", SessionId: "s", Tenant: "t", RememberPrefix: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var errs []error
			for ch, err := range c.Generate(t.Context(), tc.req) {
				if ch != nil {
					t.Fatalf("a request without messages streamed %v", ch)
				}
				errs = append(errs, err)
				if tc.stop {
					break
				}
			}
			if len(errs) != 1 {
				t.Fatalf("errors %v: want exactly one (the refusal, sent once)", errs)
			}
		})
	}
}

// TestPrefixWholeKeepsEncoding: while the client sends every step whole
// (the while after a refused reference), a step the gateway holds keeps
// the session's cached encodings, since the next step goes whole too and
// reads them: it encodes only the messages after the previous step's, not
// the whole history again. After the while, held drops them (the next
// step refers to the held conversation).
func TestPrefixWholeKeepsEncoding(t *testing.T) {
	t.Parallel()
	c := dialGateway(t, serveGateway(t, serveUpstream(t).URL))
	clock := time.Unix(1_000_000, 0)
	c.now = func() time.Time { return clock }
	c.wholeUntil.Store(clock.Add(refusedBackoff).UnixNano())
	conv := steps(4)
	size := func(ms []*llmv1.Message) (n int64) {
		for _, m := range ms {
			n += int64(fieldSize(messagesField, proto.Size(m)))
		}
		return n
	}
	prev := 0
	for step := range 4 {
		if step == 3 {
			clock = clock.Add(refusedBackoff) // the while is over
		}
		msgs := conv[:1+2*step]
		enc0, reused0 := c.EncodeStats()
		collect(t, c, &llmv1.GenerateRequest{Provider: "p", Model: "m", Messages: msgs, SessionId: "s", Tenant: "t", RememberPrefix: true})
		enc, reused := c.EncodeStats()
		wantReused := size(msgs[:prev])
		if step == 3 {
			wantReused = 0 // a reference: the tail alone, as continued fields
		}
		if want := size(msgs[prev:]); enc-enc0 != want || reused-reused0 != wantReused {
			t.Errorf("step %d: encoded %d and reused %d history bytes; want %d and %d (the cache dropped while sending whole?)",
				step, enc-enc0, reused-reused0, want, wantReused)
		}
		prev = len(msgs)
	}
	if c.ReferredBytes() != size(conv[:5]) {
		t.Errorf("referred %d bytes, want %d (the step after the while refers to the one before)", c.ReferredBytes(), size(conv[:5]))
	}
	c.codec.mu.Lock()
	se := c.codec.sessions["s"]
	c.codec.mu.Unlock()
	se.mu.Lock()
	defer se.mu.Unlock()
	if se.ref == "" || se.buf != nil || se.msgs != nil {
		t.Errorf("after the while: ref %q, %d cached bytes of %d messages; want a reference and no cache", se.ref, len(se.buf), len(se.msgs))
	}
}

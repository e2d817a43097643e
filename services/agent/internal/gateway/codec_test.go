package gateway

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/internal/cputime"
	"github.com/dsh-dev/dsh/services/agent/internal/loop"
)

func history(n int) []*llmv1.Message {
	var ms []*llmv1.Message
	for i := range n {
		ms = append(ms, &llmv1.Message{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{
			{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: fmt.Sprint("message ", i)}}}}})
	}
	return ms
}

func TestHistoryCodecRoundTrip(t *testing.T) {
	t.Parallel()
	c := newHistoryCodec()
	sys := "be brief"
	ms := history(5)
	for i := range 3 { // repeated requests hit the cache and still decode identically
		// Every field of the head set: the codec copies them one by one
		// (a tenant dropped there would share one tenant's remembered
		// conversations and quota with every other).
		req := &llmv1.GenerateRequest{Provider: "p", Model: "m", System: &sys, SessionId: "s", Messages: ms[:3+i],
			Tools: []*llmv1.ToolSchema{{Name: "t", Parameters: `{"type":"object"}`}}, Stop: []string{"x"},
			Temperature: proto.Float64(0.5), MaxTokens: proto.Int32(64), Purpose: llmv1.Purpose_PURPOSE_TITLE,
			Tenant: "acme", RememberPrefix: true}
		bs, err := c.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		var got llmv1.GenerateRequest
		if err := proto.Unmarshal(bs.Materialize(), &got); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(asSent(req), &got, protocmp.Transform()); diff != "" {
			t.Fatalf("round trip %d (-want +got):\n%s", i, diff)
		}
	}
}

func TestHistoryCodecReencodesChangedMessages(t *testing.T) {
	t.Parallel()
	c := newHistoryCodec()
	ms := history(4)
	if _, err := c.Marshal(&llmv1.GenerateRequest{Provider: "p", Model: "m", SessionId: "s", Messages: ms}); err != nil {
		t.Fatal(err)
	}
	// A compaction-like change: position 1 now holds a different message.
	changed := append([]*llmv1.Message{ms[0]}, history(1)[0], ms[3])
	marshalRoundTrip(t, c, &llmv1.GenerateRequest{Provider: "p", Model: "m", SessionId: "s", Messages: changed})
	c.forget("s")
	if len(c.sessions) != 0 {
		t.Error("forget kept the session")
	}
}

// A message that fails to encode (a string field with invalid UTF-8) fails
// its request and leaves nothing behind: the next request of the session,
// which extends the same buffer, still decodes to exactly what was asked.
func TestHistoryCodecFailedMessageLeavesNoBytes(t *testing.T) {
	t.Parallel()
	c := newHistoryCodec()
	ms := history(3)
	marshalRoundTrip(t, c, &llmv1.GenerateRequest{Provider: "p", Model: "m", SessionId: "s", Messages: ms[:2]})
	bad := &llmv1.Message{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{
		{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: "a\xffb"}}}}}
	if _, err := c.Marshal(&llmv1.GenerateRequest{Provider: "p", Model: "m", SessionId: "s", Messages: append(ms[:2:2], bad)}); err == nil {
		t.Fatal("a message with invalid UTF-8 encoded")
	}
	marshalRoundTrip(t, c, &llmv1.GenerateRequest{Provider: "p", Model: "m", SessionId: "s", Messages: ms})
}

func TestHistoryCodecKeepsHandedOutBytes(t *testing.T) {
	t.Parallel()
	ms := history(4)
	tests := []struct {
		name string
		next []*llmv1.Message
	}{
		{"append", append(ms[:4:4], history(2)...)},
		{"change", []*llmv1.Message{ms[0], history(1)[0], ms[2]}},
		{"truncate then append", append(ms[:1:1], history(3)...)},
		{"empty", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newHistoryCodec()
			first := &llmv1.GenerateRequest{Provider: "p", Model: "m", SessionId: "s", Messages: ms}
			bs, err := c.Marshal(first)
			if err != nil {
				t.Fatal(err)
			}
			second := &llmv1.GenerateRequest{Provider: "p", Model: "m", SessionId: "s", Messages: tt.next}
			bs2, err := c.Marshal(second)
			if err != nil {
				t.Fatal(err)
			}
			// The first request may still be in the transport: its bytes
			// must not have changed.
			for _, x := range []struct {
				want *llmv1.GenerateRequest
				bs   interface{ Materialize() []byte }
			}{{first, bs}, {second, bs2}} {
				var got llmv1.GenerateRequest
				if err := proto.Unmarshal(x.bs.Materialize(), &got); err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(asSent(x.want), &got, protocmp.Transform()); diff != "" {
					t.Fatalf("(-want +got):\n%s", diff)
				}
			}
		})
	}
}

func BenchmarkHistoryCodec(b *testing.B) {
	ms := history(2000)
	req := &llmv1.GenerateRequest{Provider: "p", Model: "m", SessionId: "s", Messages: ms}
	b.Run("plain", func(b *testing.B) {
		for b.Loop() {
			if _, err := proto.Marshal(req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		c := newHistoryCodec()
		for b.Loop() {
			if _, err := c.Marshal(req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestClassify(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  error
		want string
	}{
		{status.Error(codes.Unavailable, "connection refused"), "TRANSPORT"},
		{status.Error(codes.DeadlineExceeded, "slow"), "TIMEOUT"},
		{status.Error(codes.NotFound, "no route"), "NO_ADAPTER"},
		{status.Error(codes.InvalidArgument, "bad"), "INVALID_REQUEST"},
		{status.Error(codes.ResourceExhausted, "grpc: received message larger than max (5000000 vs. 4194304)"), "REQUEST_TOO_LARGE"},
		{status.Error(codes.ResourceExhausted, "slow down"), "RATE_LIMIT"},
		{status.Error(codes.Internal, "boom"), "SERVER"},
	}
	for _, tc := range tests {
		f, ok := loop.AsRequestFailure(classify(tc.err))
		if !ok || f.GetCode() != tc.want || f.GetMessage() == "" {
			t.Errorf("classify(%v) = %v, want code %s", tc.err, f, tc.want)
		}
	}
}

// TestHistoryCodecSharesToolEncodings: the same schema list (the loop's
// shared one) is encoded once for every session and request; a list that
// differs in any schema pointer is encoded afresh; every request still
// decodes to exactly what was asked.
func TestHistoryCodecSharesToolEncodings(t *testing.T) {
	t.Parallel()
	c := newHistoryCodec()
	shared := []*llmv1.ToolSchema{{Name: "a", Parameters: `{"type":"object"}`}, {Name: "b", Description: "bee"}}
	roundTrip := func(req *llmv1.GenerateRequest) []byte {
		t.Helper()
		bs := marshalRoundTrip(t, c, req)
		if len(bs) < 2 {
			return nil
		}
		return bs[1].ReadOnlyData()
	}
	first := roundTrip(&llmv1.GenerateRequest{Provider: "p", Model: "m", SessionId: "s1", Tools: shared, Messages: history(2)})
	again := roundTrip(&llmv1.GenerateRequest{Provider: "p", Model: "m", SessionId: "s2", Tools: slices.Clone(shared), Messages: history(1)})
	if &first[0] != &again[0] {
		t.Fatal("the same schemas were encoded again for another session")
	}
	// Equal content but another schema object: encoded afresh, and the
	// buffer handed out before is left as it was.
	firstCopy := slices.Clone(first)
	changed := []*llmv1.ToolSchema{shared[0], {Name: "b", Description: "changed"}}
	other := roundTrip(&llmv1.GenerateRequest{Provider: "p", Model: "m", SessionId: "s1", Tools: changed, Messages: history(2)})
	if &other[0] == &first[0] || !slices.Equal(first, firstCopy) {
		t.Fatal("a changed schema list reused or overwrote the cached encoding")
	}
	roundTrip(&llmv1.GenerateRequest{Provider: "p", Model: "m", SessionId: "s1", Tools: shared[:1], Messages: history(2)})
	roundTrip(&llmv1.GenerateRequest{Provider: "p", Model: "m", SessionId: "s1", Messages: history(2)})
}

// asSent is req as the codec sends it: asking for batched responses.
func asSent(req *llmv1.GenerateRequest) *llmv1.GenerateRequest {
	req = proto.CloneOf(req)
	req.BatchChunks = true
	return req
}

// marshalRoundTrip encodes req with c, requires it to decode to exactly req
// (asking for batched responses) and returns the encoding.
func marshalRoundTrip(t *testing.T, c *historyCodec, req *llmv1.GenerateRequest) mem.BufferSlice {
	t.Helper()
	bs, err := c.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var got llmv1.GenerateRequest
	if err := proto.Unmarshal(bs.Materialize(), &got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(asSent(req), &got, protocmp.Transform()); diff != "" {
		t.Fatalf("round trip (-want +got):\n%s", diff)
	}
	return bs
}

// BenchmarkHistoryCodecStep measures the request encoding of one step of a
// session's conversation as the loop sends it: the previous step's
// conversation held by the gateway (a reference), two new messages (a tool
// call and its 1.5 KB result, the load benchmark's read step) encoded for
// the session's cache and sent in `continued`. A session is forgotten
// after 50 steps, so the cache stays the size of a live turn's. cpu-ns/op
// is the process's CPU per step (the collector's share included).
func BenchmarkHistoryCodecStep(b *testing.B) {
	c := newHistoryCodec()
	tools := []*llmv1.ToolSchema{{Name: "read", Parameters: `{"type":"object","properties":{"file_path":{"type":"string"}}}`}}
	result := strings.Repeat("a line of the file that was read\n", 45)
	var msgs []*llmv1.Message
	step := 0
	b.ReportAllocs()
	c0 := cputime.Process()
	for b.Loop() {
		if step%50 == 0 {
			c.forget("s")
			msgs = []*llmv1.Message{{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{
				{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: "read notes.txt five times"}}}}}}
		}
		id := fmt.Sprint("call_", step)
		msgs = append(msgs,
			&llmv1.Message{Role: llmv1.Role_ROLE_ASSISTANT, Content: []*llmv1.ContentBlock{
				{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: "Step."}}},
				{Block: &llmv1.ContentBlock_ToolCall{ToolCall: &llmv1.ToolCallBlock{Id: id, Name: "read", Arguments: `{"file_path":"notes.txt"}`}}}}},
			&llmv1.Message{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{
				{Block: &llmv1.ContentBlock_ToolResult{ToolResult: &llmv1.ToolResultBlock{ToolCallId: id, Content: []*llmv1.ContentBlock{
					{Block: &llmv1.ContentBlock_Text{Text: &llmv1.TextBlock{Text: result}}}}}}}}})
		req := &llmv1.GenerateRequest{Provider: "p", Model: "m", SessionId: "s", Tools: tools, Messages: msgs, RememberPrefix: true}
		cc := &callCodec{historyCodec: c}
		if _, err := cc.Marshal(req); err != nil {
			b.Fatal(err)
		}
		if step%50 != 0 && !cc.referenced.Load() {
			b.Fatal("not sent as a reference")
		}
		c.held(req, fmt.Sprint("id-", step), int(cc.histBytes.Load()), false)
		step++
	}
	b.ReportMetric(float64(cputime.Process()-c0)/float64(b.N), "cpu-ns/op")
}

package provider

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"net/http"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"github.com/dsh-dev/dsh/internal/llmstream"
)

func TestClassifyHTTP(t *testing.T) {
	t.Parallel()
	tests := []struct {
		status int
		detail string
		want   string
	}{
		{401, "", CodeAuth},
		{403, "", CodeAuth},
		{402, "Insufficient Balance", CodeQuota},
		{429, "Rate limit reached", CodeRateLimit},
		{429, "You exceeded your current quota", CodeQuota},
		{400, "This model's maximum context length is 8192 tokens", CodeContextWindowExceeded},
		{400, "prompt is too long: 200001 tokens > 200000 maximum", CodeContextWindowExceeded},
		{413, "request exceeds the available context size", CodeContextWindowExceeded},
		{400, "Your credit balance is too low", CodeQuota},
		{400, "bad schema", CodeInvalidRequest},
		{422, "bad schema", "HTTP_422"},
		{500, "", CodeServer},
		{529, "Overloaded", CodeServer},
		{404, "", "HTTP_404"},
	}
	for _, tt := range tests {
		if got := ClassifyHTTP(tt.status, tt.detail); got != tt.want {
			t.Errorf("ClassifyHTTP(%d, %q) = %s, want %s", tt.status, tt.detail, got, tt.want)
		}
	}
}

func TestClassifyDetail(t *testing.T) {
	t.Parallel()
	tests := []struct{ kind, msg, want string }{
		{"overloaded_error", "Overloaded", CodeServer},
		{"rate_limit_error", "slow", CodeRateLimit},
		{"authentication_error", "bad", CodeAuth},
		{"invalid_request_error", "prompt is too long", CodeContextWindowExceeded},
		{"invalid_request_error", "bad field", CodeInvalidRequest},
		{"insufficient_quota", "x", CodeQuota},
		{"", "", CodeServer},
	}
	for _, tt := range tests {
		if got := ClassifyDetail(tt.kind, tt.msg); got != tt.want {
			t.Errorf("ClassifyDetail(%q, %q) = %s, want %s", tt.kind, tt.msg, got, tt.want)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		h    map[string]string
		want time.Duration
	}{
		{nil, 0},
		{map[string]string{"Retry-After": "3"}, 3 * time.Second},
		{map[string]string{"Retry-After": "1.5"}, 1500 * time.Millisecond},
		{map[string]string{"Retry-After": "0"}, 0},
		{map[string]string{"Retry-After": "-4"}, 0},
		{map[string]string{"Retry-After": now.Add(time.Minute).Format(http.TimeFormat)}, time.Minute},
		{map[string]string{"Retry-After": now.Add(-time.Minute).Format(http.TimeFormat)}, 0},
		{map[string]string{"Retry-After": "soon"}, 0},
		{map[string]string{"Retry-After-Ms": "250", "Retry-After": "9"}, 250 * time.Millisecond},
	}
	for _, tt := range tests {
		h := http.Header{}
		for k, v := range tt.h {
			h.Set(k, v)
		}
		if got := RetryAfter(h, now); got != tt.want {
			t.Errorf("RetryAfter(%v) = %v, want %v", tt.h, got, tt.want)
		}
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"key sk-abcdefgh12345 bad", "key sk-[redacted] bad"},
		{"short sk-abc ok", "short sk-abc ok"},
		{"masked sk-proj-****abcd", "masked sk-[redacted]"},
		{"custom secret-token-xyz here", "custom [redacted] here"},
		{"two sk-11111111 sk-22222222", "two sk-[redacted] sk-[redacted]"},
	}
	for _, tt := range tests {
		if got := Redact(tt.in, "secret-token-xyz"); got != tt.want {
			t.Errorf("Redact(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestFailureProto(t *testing.T) {
	t.Parallel()
	f := &Failure{Code: CodeRateLimit, Message: "m", Status: 429, RetryAfter: 1500 * time.Millisecond, RequestID: "r"}
	got := f.Finish()
	want := &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Finish{Finish: &llmv1.FinishChunk{Reason: &llmv1.FinishReason{Kind: &llmv1.FinishReason_Error{Error: &llmv1.FinishError{Failure: &llmv1.LlmFailure{Code: "RATE_LIMIT", Message: "m", Status: ptr[int32](429), ProviderRetryAfterMs: ptr[int64](1500), RequestId: ptr("r")}}}}}}}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Error(diff)
	}
	if (&Failure{Code: CodeAborted}).Finish().GetFinish().GetReason().GetAborted().GetFailure().GetMessage() == "" {
		t.Error("aborted failure has an empty message")
	}
	if (&Failure{}).Proto().GetCode() != CodeUnknown {
		t.Error("empty code not defaulted")
	}
}

func ptr[T any](v T) *T { return &v }

func seq(chunks []*llmv1.StreamChunk, err error) iter.Seq2[*llmv1.StreamChunk, error] {
	return func(yield func(*llmv1.StreamChunk, error) bool) {
		for _, c := range chunks {
			if !yield(c, nil) {
				return
			}
		}
		if err != nil {
			yield(nil, err)
		}
	}
}

func start(i uint32, t llmv1.BlockType) *llmv1.StreamChunk {
	return &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_BlockStart{BlockStart: &llmv1.BlockStart{Index: i, BlockType: t}}}
}

func textDelta(i uint32, s string) *llmv1.StreamChunk {
	return &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_TextDelta{TextDelta: &llmv1.TextDelta{Index: i, Text: s}}}
}

func toolDelta(i uint32, id, name, args string) *llmv1.StreamChunk {
	d := &llmv1.ToolCallDelta{Index: i, Id: id, ArgumentsDelta: args}
	if name != "" {
		d.Name = &name
	}
	return &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_ToolCallDelta{ToolCallDelta: d}}
}

func TestNormalize(t *testing.T) {
	t.Parallel()
	stop := &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Finish{Finish: &llmv1.FinishChunk{Reason: Stop()}}}
	replay := "{}"
	errWithReplay := (&Failure{Code: CodeServer, Message: "x"}).Finish()
	errWithReplay.GetFinish().ReplayState = &replay
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name     string
		ctx      context.Context
		in       iter.Seq2[*llmv1.StreamChunk, error]
		wantCode string
		wantLast []string // text of block-ends closed by Normalize, in order
	}{
		{"clean", context.Background(), seq([]*llmv1.StreamChunk{stop}, nil), "", nil},
		{"error mid-block closes blocks", context.Background(), seq([]*llmv1.StreamChunk{start(0, llmv1.BlockType_BLOCK_TYPE_TEXT), textDelta(0, "par"), textDelta(0, "tial"), start(1, llmv1.BlockType_BLOCK_TYPE_TOOL_CALL), toolDelta(1, "c", "n", `{"a"`)}, &Failure{Code: CodeServer, Message: "boom"}), CodeServer, []string{"text:partial", `tool:c/n/{"a"`}},
		{"unknown error", context.Background(), seq(nil, errors.New("weird")), CodeUnknown, nil},
		{"no finish", context.Background(), seq([]*llmv1.StreamChunk{start(0, llmv1.BlockType_BLOCK_TYPE_TEXT)}, nil), CodeStreamClosed, []string{"text:"}},
		{"no finish after cancel", cancelled, seq(nil, nil), CodeAborted, nil},
		{"error after cancel", cancelled, seq(nil, &Failure{Code: CodeTransport, Message: "x"}), CodeAborted, nil},
		{"timeout kept after cancel", cancelled, seq(nil, &Failure{Code: CodeTimeout, Message: "x"}), CodeTimeout, nil},
		{"stragglers dropped", context.Background(), seq([]*llmv1.StreamChunk{stop, textDelta(0, "late")}, errors.New("late")), "", nil},
		{"replay state dropped from an error", context.Background(), seq([]*llmv1.StreamChunk{errWithReplay}, nil), CodeServer, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out []*llmv1.StreamChunk
			for c := range Normalize(tt.ctx, slog.New(slog.DiscardHandler), "r", tt.in) {
				out = append(out, c)
			}
			if err := llmstream.CheckStream(out); err != nil {
				t.Fatalf("grammar: %v", err)
			}
			fin := out[len(out)-1].GetFinish()
			if fin.ReplayState != nil && tt.wantCode != "" {
				t.Error("replay state on a failed finish")
			}
			code := fin.GetReason().GetError().GetFailure().GetCode() + fin.GetReason().GetAborted().GetFailure().GetCode()
			if code != tt.wantCode {
				t.Errorf("code = %q, want %q", code, tt.wantCode)
			}
			var closed []string
			for _, c := range out {
				if be := c.GetBlockEnd(); be != nil {
					if tc := be.GetBlock().GetToolCall(); tc != nil {
						closed = append(closed, "tool:"+tc.GetId()+"/"+tc.GetName()+"/"+tc.GetArguments())
					} else {
						closed = append(closed, "text:"+be.GetBlock().GetText().GetText())
					}
				}
			}
			if diff := cmp.Diff(tt.wantLast, closed); diff != "" {
				t.Errorf("closed blocks (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEmitterHoldsSplitCharacters(t *testing.T) {
	t.Parallel()
	var out []*llmv1.StreamChunk
	e := NewEmitter(func(c *llmv1.StreamChunk, _ error) bool { out = append(out, c); return true })
	i, _ := e.Open(llmv1.BlockType_BLOCK_TYPE_TEXT)
	e.Fragment(i, "", []byte("caf\xc3"))
	e.Fragment(i, "", []byte("\xa9 \xe2\x98"))
	e.End(i)
	e.Finish(Stop(), nil)
	var deltas []string
	for _, c := range out {
		if d := c.GetTextDelta(); d != nil {
			deltas = append(deltas, d.GetText())
		}
	}
	if diff := cmp.Diff([]string{"caf", "é ", "\uFFFD"}, deltas); diff != "" {
		t.Errorf("deltas (-want +got):\n%s", diff)
	}
	if got := out[len(out)-2].GetBlockEnd().GetBlock().GetText().GetText(); got != "café \uFFFD" {
		t.Errorf("assembled %q", got)
	}
	if err := llmstream.CheckStream(out); err != nil {
		t.Error(err)
	}
}

func TestUserAgent(t *testing.T) {
	t.Parallel()
	if got := DSH("1.2.3").UserAgent(); got != "dsh/1.2.3 (+https://github.com/dsh-dev/dsh)" {
		t.Errorf("UserAgent = %q", got)
	}
	if got := DSH("").UserAgent(); got != "dsh/dev (+https://github.com/dsh-dev/dsh)" {
		t.Errorf("UserAgent = %q", got)
	}
}

func TestFailureProtoValidUTF8(t *testing.T) {
	t.Parallel()
	f := &Failure{Code: CodeServer, Message: "body \xff\xfe here", RequestID: "id\xc3"}
	p := f.Proto()
	if !utf8.ValidString(p.GetMessage()) || !utf8.ValidString(p.GetRequestId()) {
		t.Fatalf("invalid UTF-8 in %v", p)
	}
	if _, err := proto.Marshal(f.Finish()); err != nil {
		t.Fatalf("marshal: %v", err)
	}
}

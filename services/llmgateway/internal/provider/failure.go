package provider

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	"google.golang.org/protobuf/proto"
)

// The provider-neutral failure codes (LlmFailure.code).
const (
	CodeAuth                  = "AUTH"
	CodeRateLimit             = "RATE_LIMIT"
	CodeQuota                 = "QUOTA"
	CodeContextWindowExceeded = "CONTEXT_WINDOW_EXCEEDED"
	CodeInvalidRequest        = "INVALID_REQUEST"
	CodeServer                = "SERVER"
	CodeTransport             = "TRANSPORT"
	CodeTimeout               = "TIMEOUT"
	CodeAborted               = "ABORTED"
	CodeStreamClosed          = "STREAM_CLOSED"
	CodeMalformedResponse     = "MALFORMED_RESPONSE"
	CodeUnknown               = "UNKNOWN"
)

// Failure is a failed model call in provider-neutral facts. It is an error so
// adapters can end their stream by yielding it.
type Failure struct {
	// Code is one of the Code constants, HTTP_<status>, or an upper-cased
	// finish reason.
	Code string
	// Message is human-readable and never empty. It never holds API keys.
	Message string
	// Status is the HTTP status of the provider response; 0 when none.
	Status int
	// RetryAfter is the delay the provider asked for; 0 when none.
	RetryAfter time.Duration
	// RequestID is the provider's request id, when known.
	RequestID string
}

func (f *Failure) Error() string { return f.Code + ": " + f.Message }

// Proto returns the LlmFailure of f.
func (f *Failure) Proto() *llmv1.LlmFailure {
	msg := f.Message
	if msg == "" {
		msg = "model call failed"
	}
	code := f.Code
	if code == "" {
		code = CodeUnknown
	}
	// Messages quote provider bodies and headers; protobuf strings must be
	// valid UTF-8 or the chunk cannot be sent at all.
	out := &llmv1.LlmFailure{Message: strings.ToValidUTF8(msg, "\uFFFD"), Code: strings.ToValidUTF8(code, "")}
	if f.Status >= 100 && f.Status <= 599 {
		out.Status = proto.Int32(int32(f.Status))
	}
	if ms := f.RetryAfter.Milliseconds(); ms > 0 {
		out.ProviderRetryAfterMs = proto.Int64(ms)
	}
	if f.RequestID != "" {
		out.RequestId = proto.String(strings.ToValidUTF8(f.RequestID, "\uFFFD"))
	}
	return out
}

// Finish returns the terminal chunk for f: finish{aborted} for ABORTED and
// finish{error} for everything else.
func (f *Failure) Finish() *llmv1.StreamChunk {
	r := &llmv1.FinishReason{}
	if f.Code == CodeAborted {
		r.Kind = &llmv1.FinishReason_Aborted{Aborted: &llmv1.FinishAborted{Failure: f.Proto()}}
	} else {
		r.Kind = &llmv1.FinishReason_Error{Error: &llmv1.FinishError{Failure: f.Proto()}}
	}
	return &llmv1.StreamChunk{Chunk: &llmv1.StreamChunk_Finish{Finish: &llmv1.FinishChunk{Reason: r}}}
}

// Failuref builds a Failure with a formatted message.
func Failuref(code, format string, args ...any) *Failure {
	return &Failure{Code: code, Message: fmt.Sprintf(format, args...)}
}

// AsFailure returns err's *Failure, or wraps an unknown error as code UNKNOWN
// (the message of an unknown error is kept; adapters never put secrets in
// errors).
func AsFailure(err error) *Failure {
	var f *Failure
	if errors.As(err, &f) {
		return f
	}
	msg := "LLM adapter failed"
	if err != nil && err.Error() != "" {
		msg = err.Error()
	}
	return &Failure{Code: CodeUnknown, Message: msg}
}

// IsContextWindowExceeded is the shared conservative classifier for
// context-window overflow wording (OpenAI, DeepSeek, Anthropic, vLLM,
// llama.cpp, Ollama styles).
func IsContextWindowExceeded(detail string) bool {
	d := strings.ToLower(detail)
	for _, s := range []string{
		"context_length_exceeded", "maximum context length", "context length exceeded",
		"context window", "prompt is too long", "exceeds the context", "exceed context",
		"input is too long", "too many input tokens", "model_context_window_exceeded",
		"reduce the length of the messages", "exceeds the available context size",
		"requested tokens exceed",
	} {
		if strings.Contains(d, s) {
			return true
		}
	}
	return false
}

// IsQuotaExceeded matches quota and billing exhaustion wording, which is not
// a rate limit: waiting does not help.
func IsQuotaExceeded(detail string) bool {
	d := strings.ToLower(detail)
	for _, s := range []string{
		"insufficient_quota", "exceeded your current quota", "quota exceeded", "insufficient balance",
		"credit balance is too low", "billing", "out of credits", "payment required",
	} {
		if strings.Contains(d, s) {
			return true
		}
	}
	return false
}

// ClassifyHTTP maps an HTTP error status and the provider's error detail to
// a failure code.
func ClassifyHTTP(status int, detail string) string {
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return CodeAuth
	case status == http.StatusPaymentRequired:
		return CodeQuota
	case status == http.StatusTooManyRequests:
		if IsQuotaExceeded(detail) {
			return CodeQuota
		}
		return CodeRateLimit
	case status == http.StatusBadRequest || status == http.StatusRequestEntityTooLarge || status == http.StatusUnprocessableEntity:
		if IsContextWindowExceeded(detail) {
			return CodeContextWindowExceeded
		}
		if IsQuotaExceeded(detail) {
			return CodeQuota
		}
		if status == http.StatusBadRequest {
			return CodeInvalidRequest
		}
	case status >= 500 && status <= 599:
		return CodeServer
	}
	return "HTTP_" + strconv.Itoa(status)
}

// ClassifyDetail maps an in-band (mid-stream) provider error to a code from
// its type/code string and message.
func ClassifyDetail(kind, message string) string {
	k := strings.ToLower(kind)
	switch {
	case IsContextWindowExceeded(k + " " + message):
		return CodeContextWindowExceeded
	case IsQuotaExceeded(k + " " + message):
		return CodeQuota
	case strings.Contains(k, "rate_limit") || strings.Contains(k, "rate limit"):
		return CodeRateLimit
	case strings.Contains(k, "auth") || strings.Contains(k, "permission"):
		return CodeAuth
	case strings.Contains(k, "invalid_request"):
		return CodeInvalidRequest
	}
	return CodeServer
}

// RetryAfter reads the provider's requested delay: retry-after-ms, then
// Retry-After as seconds or an HTTP date relative to now. It returns 0 when
// absent, unparsable or not in the future.
func RetryAfter(h http.Header, now time.Time) time.Duration {
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms > 0 && ms < 1e12 {
			return time.Duration(ms * float64(time.Millisecond))
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s > 0 && s < 1e9 {
			return time.Duration(s * float64(time.Second))
		}
		return 0
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}

// Redact removes secrets from text that may be shown or logged: every
// occurrence of each non-empty secret, and anything shaped like an "sk-" key.
func Redact(s string, secrets ...string) string {
	for _, k := range secrets {
		if len(k) >= 4 && strings.Contains(s, k) {
			s = strings.ReplaceAll(s, k, "[redacted]")
		}
	}
	for i := 0; ; {
		j := strings.Index(s[i:], "sk-")
		if j < 0 {
			return s
		}
		j += i + 3
		end := j
		for end < len(s) && (isKeyByte(s[end])) {
			end++
		}
		if end-j >= 8 {
			s = s[:j] + "[redacted]" + s[end:]
			end = j + len("[redacted]")
		}
		i = end
	}
}

func isKeyByte(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '-' || b == '_' || b == '*'
}

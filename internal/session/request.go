package session

import (
	"bytes"
	"errors"
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// Errors of the request equation.
var (
	// ErrNoStep: the events hold no step/start to build a request for.
	ErrNoStep = errors.New("session: no step/start in the log")
	// ErrNoHeader: no request/header was logged up to the step.
	ErrNoHeader = errors.New("session: no request/header in the log")
)

// CanonicalHeader returns a copy of h in canonical form (§3.7): an empty
// system prompt, tool list, stop list and message prefix are absent. It
// returns nil for nil.
func CanonicalHeader(h *sessionv1.EpochHeader) *sessionv1.EpochHeader {
	if h == nil {
		return nil
	}
	c := proto.CloneOf(h)
	CanonicalizeHeader(c)
	return c
}

// canonicalShared returns h itself when it is already canonical (the
// agent logs canonical headers), else a canonical copy: the log keeps the
// folded header without copying its tools and prefix once more.
func canonicalShared(h *sessionv1.EpochHeader) *sessionv1.EpochHeader {
	if h == nil || !isCanonical(h) {
		return CanonicalHeader(h)
	}
	return h
}

// isCanonical reports whether CanonicalizeHeader would leave h as it is
// (the same four rules, as conditions).
func isCanonical(h *sessionv1.EpochHeader) bool {
	return !(h.System != nil && *h.System == "") && !(h.Tools != nil && len(h.Tools) == 0) &&
		!(h.MessagePrefix != nil && len(h.MessagePrefix) == 0) && !(h.Config != nil && h.Config.Stop != nil && len(h.Config.Stop) == 0)
}

// CanonicalizeHeader puts a header the caller owns into the canonical form
// of [CanonicalHeader] in place, without copying it. It writes only h's own
// fields and h.Config.Stop, never the tools or prefix messages, which may
// be shared.
func CanonicalizeHeader(h *sessionv1.EpochHeader) {
	if h.System != nil && *h.System == "" {
		h.System = nil
	}
	if len(h.Tools) == 0 {
		h.Tools = nil
	}
	if len(h.MessagePrefix) == 0 {
		h.MessagePrefix = nil
	}
	if h.Config != nil && len(h.Config.Stop) == 0 {
		h.Config.Stop = nil
	}
}

// HeaderEqual reports whether two headers are equal in canonical form:
// same call config (stop element-wise), same system prompt, same tools in
// order and same message prefix. The agent logs a "change" header only when
// this is false against [Log.RequestHeader]. It is
// proto.Equal(CanonicalHeader(a), CanonicalHeader(b)) without the copies:
// a tool or prefix message shared by both (the same pointer) is equal
// without a walk, which is the common case of a step whose tools did not
// change.
func HeaderEqual(a, b *sessionv1.EpochHeader) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	if a.GetSystem() != b.GetSystem() || !proto.Equal(a.Config, b.Config) ||
		!bytes.Equal(a.ProtoReflect().GetUnknown(), b.ProtoReflect().GetUnknown()) {
		return false
	}
	return sameMessages(a.Tools, b.Tools) && sameMessages(a.MessagePrefix, b.MessagePrefix)
}

// sameMessages compares two lists element-wise, by pointer first.
func sameMessages[M proto.Message](a, b []M) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if any(a[i]) != any(b[i]) && !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// FoldRequestHeader returns the canonical form of the last request/header in
// events, or nil when there is none.
func FoldRequestHeader(events []*sessionv1.SessionEvent) *sessionv1.EpochHeader {
	for i := len(events) - 1; i >= 0; i-- {
		if rh := events[i].GetRequestHeader(); rh != nil {
			return CanonicalHeader(rh.GetHeader())
		}
	}
	return nil
}

// BuildRequest rebuilds, from the log alone, the request of the last step in
// events (the request equation of §3.7): provider, model and sampling from
// the folded header's config, its system prompt and tools, and
// messages = header.message_prefix ++ DeriveMessages(events strictly before
// the last step/start). The header is folded over all of events, because the
// request/header of a step is appended inside it, after its step/start. The
// request is a fresh copy.
func BuildRequest(events []*sessionv1.SessionEvent, sessionID string) (*llmv1.GenerateRequest, error) {
	idx := -1
	for i := len(events) - 1; i >= 0; i-- {
		if events[i].GetStepStart() != nil {
			idx = i
			break
		}
	}
	if idx < 0 {
		return nil, ErrNoStep
	}
	return buildRequest(events, idx, len(events), sessionID)
}

// BuildRequestForStep rebuilds the request of step (turn, step) from a whole
// log: the header is folded over the events up to the next step/start (or
// the end of the log), the history derived from the events strictly before
// the step's step/start.
func BuildRequestForStep(events []*sessionv1.SessionEvent, turn, step int32, sessionID string) (*llmv1.GenerateRequest, error) {
	idx := slices.IndexFunc(events, func(ev *sessionv1.SessionEvent) bool {
		s := ev.GetStepStart()
		return s != nil && s.GetTurn() == turn && s.GetStep() == step
	})
	if idx < 0 {
		return nil, fmt.Errorf("%w: step %d of turn %d", ErrNoStep, step, turn)
	}
	end := len(events)
	for i := idx + 1; i < len(events); i++ {
		if events[i].GetStepStart() != nil {
			end = i
			break
		}
	}
	return buildRequest(events, idx, end, sessionID)
}

func buildRequest(events []*sessionv1.SessionEvent, stepIdx, headerEnd int, sessionID string) (*llmv1.GenerateRequest, error) {
	h := FoldRequestHeader(events[:headerEnd])
	if h == nil {
		return nil, ErrNoHeader
	}
	derived := DeriveMessages(events[:stepIdx])
	msgs := make([]*llmv1.Message, 0, len(h.GetMessagePrefix())+len(derived))
	msgs = append(append(msgs, h.GetMessagePrefix()...), derived...)
	cfg := h.GetConfig()
	req := &llmv1.GenerateRequest{
		Provider:    cfg.GetProvider(),
		Model:       cfg.GetModel(),
		Messages:    msgs,
		System:      h.System,
		Tools:       h.GetTools(),
		Temperature: cfg.Temperature,
		MaxTokens:   cfg.MaxTokens,
		Stop:        cfg.GetStop(),
		SessionId:   sessionID,
	}
	return proto.CloneOf(req), nil
}

// CheckRequest verifies that req is exactly the request the log gives for
// its last step (see [BuildRequest]) and carries a session id. The error
// names the first mismatch.
func CheckRequest(events []*sessionv1.SessionEvent, req *llmv1.GenerateRequest) error {
	if req.GetSessionId() == "" {
		return errors.New("session: request check: the request carries no session id")
	}
	want, err := BuildRequest(events, req.GetSessionId())
	if err != nil {
		return fmt.Errorf("session: request check: %w", err)
	}
	// How the request travels to the gateway (the tenant its remembered
	// conversations are kept under, whether to remember this one, the
	// earlier one it continues) is not part of the model request.
	want.Tenant, want.RememberPrefix, want.Prefix = req.GetTenant(), req.GetRememberPrefix(), req.GetPrefix()
	if proto.Equal(want, req) {
		return nil
	}
	return fmt.Errorf("session: request check: the request diverges from the log: %s", firstMismatch(want, req))
}

func firstMismatch(want, got *llmv1.GenerateRequest) string {
	switch {
	case want.GetProvider() != got.GetProvider():
		return fmt.Sprintf("provider is %q, the log says %q", got.GetProvider(), want.GetProvider())
	case want.GetModel() != got.GetModel():
		return fmt.Sprintf("model is %q, the log says %q", got.GetModel(), want.GetModel())
	case !proto.Equal(&llmv1.GenerateRequest{System: want.System}, &llmv1.GenerateRequest{System: got.System}):
		return "system prompt differs from the folded header"
	case !proto.Equal(&llmv1.GenerateRequest{Tools: want.Tools}, &llmv1.GenerateRequest{Tools: got.Tools}):
		for i := range min(len(want.Tools), len(got.Tools)) {
			if !proto.Equal(want.Tools[i], got.Tools[i]) {
				return fmt.Sprintf("tool %d (%q) differs from the folded header", i, got.Tools[i].GetName())
			}
		}
		return fmt.Sprintf("request has %d tools, the log says %d", len(got.Tools), len(want.Tools))
	case !proto.Equal(&llmv1.GenerateRequest{Temperature: want.Temperature, MaxTokens: want.MaxTokens, Stop: want.Stop},
		&llmv1.GenerateRequest{Temperature: got.Temperature, MaxTokens: got.MaxTokens, Stop: got.Stop}):
		return "sampling (temperature, max_tokens or stop) differs from the folded header"
	}
	for i := range min(len(want.Messages), len(got.Messages)) {
		if !proto.Equal(want.Messages[i], got.Messages[i]) {
			return fmt.Sprintf("message %d differs from the derived history", i)
		}
	}
	if len(want.Messages) != len(got.Messages) {
		return fmt.Sprintf("request has %d messages, the log gives %d", len(got.Messages), len(want.Messages))
	}
	return fmt.Sprintf("purpose is %v, want %v", got.GetPurpose(), want.GetPurpose())
}

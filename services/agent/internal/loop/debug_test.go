package loop

import (
	"errors"
	"testing"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
)

// TestDebugCheckCatchesADivergentRequest proves the debug wiring: a request
// that is not the pure function of the log fails with INVARIANT.
func TestDebugCheckCatchesADivergentRequest(t *testing.T) {
	t.Parallel()
	h := &sessionv1.SessionHeader{Id: "d", Options: &sessionv1.SessionOptions{Provider: "p", Model: "m"}}
	log, err := session.NewLog(h, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &llmv1.LlmCallConfig{Provider: "p", Model: "m"}
	for _, ev := range []*sessionv1.SessionEvent{
		session.TurnStartEvent(1, session.MessageTrigger(session.UserSource())),
		session.UserMessageEvent([]*llmv1.ContentBlock{session.Text("hi")}, session.UserSource()),
		session.StepStartEvent(1, 1),
		{Payload: &sessionv1.SessionEvent_RequestHeader{RequestHeader: &sessionv1.RequestHeader{
			Header: &sessionv1.EpochHeader{Config: cfg}, Reason: sessionv1.HeaderReason_HEADER_REASON_INITIAL}}},
	} {
		if _, err := log.Append(ev); err != nil {
			t.Fatal(err)
		}
	}
	a := New(Config{Debug: true}, log)
	good := &llmv1.GenerateRequest{Provider: "p", Model: "m", SessionId: "d", Messages: log.Messages()}
	if err := a.debugCheck(good); err != nil {
		t.Fatalf("the request equation's own request failed: %v", err)
	}
	bad := &llmv1.GenerateRequest{Provider: "p", Model: "m", SessionId: "d", Messages: append(log.Messages(),
		&llmv1.Message{Role: llmv1.Role_ROLE_USER, Content: []*llmv1.ContentBlock{session.Text("not in the log")}})}
	var inv *InvariantFailure
	if err := a.debugCheck(bad); !errors.As(err, &inv) || inv.Code() != session.CodeInvariant {
		t.Fatalf("divergent request: %v, want an InvariantFailure", err)
	}
}

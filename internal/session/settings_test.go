package session

import (
	"testing"

	"google.golang.org/protobuf/proto"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

func TestSettingsFoldAndPendingRequests(t *testing.T) {
	t.Parallel()
	h := &sessionv1.SessionHeader{Id: "s", Options: &sessionv1.SessionOptions{Provider: "p", Model: "m1",
		Approval:      sessionv1.ApprovalPolicy_APPROVAL_POLICY_ON_REQUEST,
		ApprovalRules: []*sessionv1.ApprovalRule{{Tool: "bash", Action: sessionv1.RuleAction_RULE_ACTION_ASK}}}}
	l, err := NewLog(h, nil, WithTurnChecks())
	if err != nil {
		t.Fatal(err)
	}
	app := func(ev *sessionv1.SessionEvent) {
		t.Helper()
		if _, err := l.Append(ev); err != nil {
			t.Fatal(err)
		}
	}
	app(TurnStartEvent(1, MessageTrigger(UserSource())))
	before := l.Settings()
	app(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_ModelChanged{ModelChanged: &sessionv1.ModelChanged{Provider: "p2", Model: "m2", By: "user"}}})
	app(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_ApprovalAsked{ApprovalAsked: &sessionv1.ApprovalAsked{Id: "r1", ToolName: "bash", Turn: 1}}})
	if p := l.PendingRequests(); len(p) != 1 || p[0].ID != "r1" {
		t.Fatalf("pending = %v, want r1", p)
	}
	added := &sessionv1.ApprovalRule{Tool: "bash", Pattern: "ls", Action: sessionv1.RuleAction_RULE_ACTION_ALLOW}
	app(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_ApprovalDecided{ApprovalDecided: &sessionv1.ApprovalDecided{
		Id: "r1", Outcome: sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_ALLOWED_FOR_SESSION, By: "user", AddedRule: added}}})
	if p := l.PendingRequests(); len(p) != 0 {
		t.Fatalf("pending after decided = %v", p)
	}
	app(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_SandboxMode{SandboxMode: &sessionv1.SandboxModeChanged{
		Sandbox: &toolsv1.SandboxPolicy{Mode: toolsv1.SandboxMode_SANDBOX_MODE_READ_ONLY}}}})
	app(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_SessionTitle{SessionTitle: &sessionv1.SessionTitle{Title: "t", Source: "user"}}})
	app(TurnEndEvent(1, completed()))

	got := l.Settings()
	want := &sessionv1.SessionOptions{Provider: "p2", Model: "m2", Approval: sessionv1.ApprovalPolicy_APPROVAL_POLICY_ON_REQUEST,
		ApprovalRules: []*sessionv1.ApprovalRule{added, {Tool: "bash", Action: sessionv1.RuleAction_RULE_ACTION_ASK}},
		Sandbox:       &toolsv1.SandboxPolicy{Mode: toolsv1.SandboxMode_SANDBOX_MODE_READ_ONLY}}
	if !proto.Equal(got.Options, want) || got.Title != "t" || got.ModelSeq != 1 {
		t.Fatalf("settings = %v title %q modelSeq %d, want %v", got.Options, got.Title, got.ModelSeq, want)
	}
	if before.Options.GetModel() != "m1" || len(before.Options.GetApprovalRules()) != 1 {
		t.Fatalf("an earlier snapshot changed: %v", before.Options)
	}
	if l.RequestsAsked() != 1 {
		t.Fatalf("asked = %d", l.RequestsAsked())
	}
	if f := FoldSettings(h, l.Events()); !proto.Equal(f.Options, want) {
		t.Fatalf("FoldSettings = %v", f.Options)
	}
}

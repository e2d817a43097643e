package approval

import (
	"context"
	"testing"
	"time"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/session"
)

// TestApproveCallsWaitingBeforeItWaits: Approve calls waiting exactly when
// it is about to wait for an answer (the tool pipeline releases a prepared
// stream there), never for a call it decides at once.
func TestApproveCallsWaitingBeforeItWaits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		policy sessionv1.ApprovalPolicy
		tool   string
		ask    *toolsv1.PreAsk
		ok     bool
		waits  bool
	}{
		{"allowed by a rule", sessionv1.ApprovalPolicy_APPROVAL_POLICY_ON_REQUEST, "read", nil, true, false},
		{"denied by a rule", sessionv1.ApprovalPolicy_APPROVAL_POLICY_ON_REQUEST, "rm", nil, false, false},
		{"a rule asks", sessionv1.ApprovalPolicy_APPROVAL_POLICY_ON_REQUEST, "bash", nil, false, true},
		{"an interceptor asks", sessionv1.ApprovalPolicy_APPROVAL_POLICY_ON_REQUEST, "read", &toolsv1.PreAsk{Reason: "why"}, false, true},
		{"policy always", sessionv1.ApprovalPolicy_APPROVAL_POLICY_ALWAYS, "read", nil, false, true},
		{"policy never: nobody is asked", sessionv1.ApprovalPolicy_APPROVAL_POLICY_NEVER, "bash", nil, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			log, err := session.NewLog(&sessionv1.SessionHeader{Id: "s", Options: &sessionv1.SessionOptions{}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			g := NewGate(&Config{Policy: tc.policy, Rules: []*sessionv1.ApprovalRule{
				{Tool: "bash", Action: sessionv1.RuleAction_RULE_ACTION_ASK},
				{Tool: "rm", Action: sessionv1.RuleAction_RULE_ACTION_DENY},
				{Tool: "read", Action: sessionv1.RuleAction_RULE_ACTION_ALLOW}}}, log, nil)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			waited := false
			// Nobody answers: waiting cancels, so the wait ends at once (and
			// after 10 s at worst).
			ok, why := g.Approve(ctx, &toolsv1.ToolExecution{Name: tc.tool, CallId: "c", Arguments: `{}`, Context: &toolsv1.ToolContext{Cwd: "/w"}}, tc.ask, PathKeyUnknown, func() {
				waited = true
				cancel()
			})
			if ok != tc.ok || waited != tc.waits {
				t.Errorf("Approve = %v (%q), waiting called %v; want %v, waiting called %v", ok, why, waited, tc.ok, tc.waits)
			}
		})
	}
}

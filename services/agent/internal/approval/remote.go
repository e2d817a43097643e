package approval

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
)

// Remote is a deployment's dsh.agent.v1.Approver service, configured like a
// remote hook: a deadline per call and a failure mode.
type Remote struct {
	Name   string
	Client agentv1.ApproverClient
	// Timeout bounds each call; default 5 s.
	Timeout time.Duration
	// FailOpen passes to the next answerer when the approver hangs, fails
	// or answers garbage; otherwise (the default) the request settles
	// unavailable and the call is refused.
	FailOpen bool
}

// consultApprovers offers an open approval request to the remote approvers
// in order; the first allow or deny settles it. A failing approver is
// logged and then, fail-closed, settles the request unavailable.
func (g *Gate) consultApprovers(ctx context.Context, id string, ex *toolsv1.ToolExecution, reason, rule string) {
	for _, r := range g.cfg.Approvers {
		if ctx.Err() != nil {
			return
		}
		by := "approver:" + r.Name
		verdict, msg, err := r.approve(ctx, &agentv1.ApproveRequest{SessionId: g.log.Header().GetId(), Tenant: g.log.Header().GetTenant(),
			Turn: ex.GetContext().GetTurn(), Execution: ex, Reason: reason, Rule: rule})
		var ev *sessionv1.SessionEvent
		switch {
		case err != nil && ctx.Err() != nil:
			return // the turn was cancelled: the wait settles it
		case err != nil:
			detail := err.Error()
			var ue *unavailableError
			if errors.As(err, &ue) {
				detail = ue.detail
			}
			g.lg.Warn("approver failed", "approver", r.Name, "failOpen", r.FailOpen, "request", id, "err", detail)
			if r.FailOpen {
				continue
			}
			ev = decided(id, sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_UNAVAILABLE, by, fmt.Sprintf("approver %s failed: %v", r.Name, err))
		case verdict == agentv1.ApproverVerdict_APPROVER_VERDICT_ALLOW:
			ev = decided(id, sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_ALLOWED_ONCE, by, msg)
		case verdict == agentv1.ApproverVerdict_APPROVER_VERDICT_DENY:
			ev = decided(id, sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_REJECTED, by, msg)
		default:
			continue // pass
		}
		// A person may have answered meanwhile: then that answer stands.
		_, _ = g.settle(id, func(*waiter) (*sessionv1.SessionEvent, error) { return ev, nil })
		return
	}
}

// approve calls the approver under its deadline. An answer that is not a
// known verdict is an error (garbage fails like a crash).
func (r Remote) approve(ctx context.Context, req *agentv1.ApproveRequest) (agentv1.ApproverVerdict, string, error) {
	d := r.Timeout
	if d <= 0 {
		d = 5 * time.Second
	}
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	resp, err := r.Client.Approve(cctx, req)
	if err != nil {
		switch status.Code(err) {
		case codes.Unimplemented:
			return agentv1.ApproverVerdict_APPROVER_VERDICT_PASS, "", nil
		case codes.DeadlineExceeded:
			return 0, "", fmt.Errorf("no answer within %s", d)
		case codes.Unavailable:
			// The transport details (addresses) stay in the agent's log.
			return 0, "", &unavailableError{detail: status.Convert(err).Message()}
		}
		return 0, "", fmt.Errorf("%s", status.Convert(err).Message())
	}
	switch v := resp.GetVerdict(); v {
	case agentv1.ApproverVerdict_APPROVER_VERDICT_UNSPECIFIED, agentv1.ApproverVerdict_APPROVER_VERDICT_PASS,
		agentv1.ApproverVerdict_APPROVER_VERDICT_ALLOW, agentv1.ApproverVerdict_APPROVER_VERDICT_DENY:
		return v, resp.GetMessage(), nil
	default:
		return 0, "", fmt.Errorf("unknown verdict %d", v)
	}
}

// unavailableError is an approver that cannot be reached; its text (which
// the model sees) leaves out the transport details, which are logged.
type unavailableError struct{ detail string }

func (e *unavailableError) Error() string { return "unreachable" }

package agent

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"unicode"

	"google.golang.org/protobuf/proto"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/services/agent/internal/approval"
)

// byUser is the "by" of changes and answers made through the API by the
// principal of ctx: "user:<subject>", or "user" for a principal without a
// subject.
func byUser(ctx context.Context) string {
	if sub := principalOf(ctx).Subject; sub != "" {
		return approval.ByUser + ":" + sub
	}
	return approval.ByUser
}

// Respond answers a pending approval or question request.
func (s *Service) Respond(ctx context.Context, req *agentv1.RespondRequest) (*agentv1.RespondResponse, error) {
	seq, err := func() (int64, error) {
		if req.GetRequestId() == "" {
			return 0, invalidf("request_id is required (PendingRequest.id)")
		}
		if req.GetAnswer() == nil {
			return 0, invalidf("set approval or question: the answer is missing")
		}
		l, err := s.acquire(ctx, req.GetSessionId())
		if err != nil {
			return 0, err
		}
		defer s.release(l)
		return l.gate.Respond(ctx, req, byUser(ctx))
	}()
	if err != nil {
		return nil, toStatus(s.log, "Respond", err)
	}
	return &agentv1.RespondResponse{Seq: seq}, nil
}

// The paths UpdateSession accepts.
const (
	pathProvider = "options.provider"
	pathModel    = "options.model"
	pathApproval = "options.approval"
	pathRules    = "options.approval_rules"
	pathSandbox  = "options.sandbox"
	pathTitle    = "title"
)

var updatePaths = []string{pathProvider, pathModel, pathApproval, pathRules, pathSandbox, pathTitle}

// pluginTrigger is the plugin trigger typ of a zero-step turn that records
// settings events while the session is idle.
func pluginTrigger(typ string) *sessionv1.TurnTrigger {
	return &sessionv1.TurnTrigger{Kind: &sessionv1.TurnTrigger_Extension{Extension: &llmv1.Extension{Type: typ, Json: "{}"}}}
}

// updateTrigger is the trigger of the zero-step turn that records a change
// made while the session is idle.
func updateTrigger() *sessionv1.TurnTrigger { return pluginTrigger("session/update") }

// titleTrigger is the trigger of the zero-step turn that records a
// generated title while the session is idle.
func titleTrigger() *sessionv1.TurnTrigger { return pluginTrigger("session/title") }

// UpdateSession changes a session's mutable settings; each change is a
// logged event, effective at the next step.
func (s *Service) UpdateSession(ctx context.Context, req *agentv1.UpdateSessionRequest) (*agentv1.UpdateSessionResponse, error) {
	sess, err := s.update(ctx, req)
	if err != nil {
		return nil, toStatus(s.log, "UpdateSession", err)
	}
	return &agentv1.UpdateSessionResponse{Session: sess}, nil
}

func (s *Service) update(ctx context.Context, req *agentv1.UpdateSessionRequest) (*agentv1.Session, error) {
	paths := req.GetUpdateMask().GetPaths()
	if len(paths) == 0 {
		return nil, invalidf("update_mask is required: name the fields to change (%s)", strings.Join(updatePaths, ", "))
	}
	mask := map[string]bool{}
	for _, p := range paths {
		if !slices.Contains(updatePaths, p) {
			return nil, invalidf("update_mask path %q cannot be changed: use %s", p, strings.Join(updatePaths, ", "))
		}
		mask[p] = true
	}
	o := req.GetOptions()
	if (mask[pathProvider] || mask[pathModel] || mask[pathApproval] || mask[pathRules] || mask[pathSandbox]) && o == nil {
		return nil, invalidf("options is required when update_mask names options fields")
	}
	if err := checkOptionValues(o, mask[pathApproval], mask[pathRules], mask[pathSandbox]); err != nil {
		return nil, err
	}
	if mask[pathTitle] {
		if err := checkTitle(req.GetTitle()); err != nil {
			return nil, err
		}
	}
	l, err := s.acquire(ctx, req.GetSessionId())
	if err != nil {
		return nil, err
	}
	defer s.release(l)
	cur := l.log.Settings().Options
	by := byUser(ctx)
	var evs []*sessionv1.SessionEvent
	if mask[pathProvider] || mask[pathModel] {
		provider, model := cur.GetProvider(), cur.GetModel()
		if mask[pathProvider] {
			provider = o.GetProvider()
		}
		if mask[pathModel] {
			model = o.GetModel()
		}
		if provider == "" || model == "" {
			return nil, invalidf("options.provider and options.model must not be empty")
		}
		if err := s.checkProvider(ctx, provider); err != nil {
			return nil, err
		}
		evs = append(evs, &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_ModelChanged{ModelChanged: &sessionv1.ModelChanged{
			Provider: provider, Model: model, By: by}}})
	}
	if mask[pathApproval] || mask[pathRules] {
		ev := &sessionv1.ApprovalPolicyChanged{Policy: cur.GetApproval(), Rules: cur.GetApprovalRules(), By: by}
		if mask[pathApproval] {
			ev.Policy = o.GetApproval()
		}
		if mask[pathRules] {
			ev.Rules = o.GetApprovalRules()
		}
		evs = append(evs, &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_ApprovalPolicy{ApprovalPolicy: proto.CloneOf(ev)}})
	}
	if mask[pathSandbox] {
		evs = append(evs, &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_SandboxMode{SandboxMode: &sessionv1.SandboxModeChanged{
			Sandbox: proto.CloneOf(o.GetSandbox()), By: by}}})
	}
	if mask[pathTitle] {
		evs = append(evs, &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_SessionTitle{SessionTitle: &sessionv1.SessionTitle{
			Title: req.GetTitle(), Source: approval.ByUser}}})
	}
	if _, err := l.agent.Record(ctx, updateTrigger(), evs...); err != nil {
		return nil, err
	}
	return l.snapshot(), nil
}

// checkOptionValues checks the approval and sandbox options (at creation:
// all of them; at update: the masked ones).
func checkOptionValues(o *sessionv1.SessionOptions, approvalSet, rulesSet, sandboxSet bool) error {
	if approvalSet {
		switch o.GetApproval() {
		case sessionv1.ApprovalPolicy_APPROVAL_POLICY_NEVER, sessionv1.ApprovalPolicy_APPROVAL_POLICY_ON_REQUEST, sessionv1.ApprovalPolicy_APPROVAL_POLICY_ALWAYS:
		default:
			return invalidf("options.approval must be APPROVAL_POLICY_NEVER, APPROVAL_POLICY_ON_REQUEST or APPROVAL_POLICY_ALWAYS, got %v", o.GetApproval())
		}
	}
	if rulesSet {
		if err := approval.ValidateRules("options.approval_rules", o.GetApprovalRules()); err != nil {
			return &InvalidError{Msg: err.Error()}
		}
	}
	if sandboxSet {
		sb := o.GetSandbox()
		if _, ok := toolsv1.SandboxMode_name[int32(sb.GetMode())]; !ok {
			return invalidf("options.sandbox.mode %d is not a sandbox mode", sb.GetMode())
		}
		if _, ok := toolsv1.NetworkAccess_name[int32(sb.GetNetwork())]; !ok {
			return invalidf("options.sandbox.network %d is not a network access setting", sb.GetNetwork())
		}
	}
	return nil
}

// checkCreateOptions checks the approval and sandbox options of a new
// session.
func checkCreateOptions(o *sessionv1.SessionOptions) error {
	if _, ok := sessionv1.ApprovalPolicy_name[int32(o.GetApproval())]; !ok {
		return invalidf("options.approval %d is not an approval policy", o.GetApproval())
	}
	return checkOptionValues(o, false, true, true)
}

func checkTitle(t string) error {
	switch {
	case strings.TrimSpace(t) == "":
		return invalidf("title must not be empty")
	case len(t) > 200:
		return invalidf("title is %d bytes long; the limit is 200", len(t))
	case strings.IndexFunc(t, unicode.IsControl) >= 0:
		return invalidf("title must not contain control characters")
	}
	return nil
}

func (s *Service) checkProvider(ctx context.Context, provider string) error {
	if s.deps.Providers == nil {
		return nil
	}
	ids, err := s.deps.Providers.ListProviders(ctx)
	if err != nil {
		return fmt.Errorf("validate provider: %w", err)
	}
	if !slices.Contains(ids, provider) {
		return invalidf("unknown provider %q: the gateway serves %s", provider, strings.Join(ids, ", "))
	}
	return nil
}

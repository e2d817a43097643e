// Package approval is the agent's approval and question channel (semantics.md
// §7.3, §7.14; design round2.md §3): the session's policy and rules decide
// whether a tool call runs, is refused, or needs an answer; a request is
// logged (approval/asked, question/asked), offered to the deployment's remote
// Approver services, then to whoever answers through AgentService.Respond,
// and settled exactly once (approval/decided, question/answered) by the first
// valid answer, a cancel, or the deadline. Outcomes are fail-closed: only an
// allow lets the call run.
//
// A Gate serves one session. It keeps nothing that is not in the log except
// the goroutines waiting for an answer: the policy, the rules (with the ones
// ALLOW_FOR_SESSION added) and the pending set are folds of the log.
package approval

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/session"
)

// Who settles a request ("by").
const (
	ByPolicy   = "policy"
	ByCancel   = "cancel"
	ByDeadline = "deadline"
	ByUser     = "user"
)

// Errors of Respond.
var (
	// ErrUnknownRequest: no request with the id was ever asked in the session.
	ErrUnknownRequest = errors.New("no such request")
	// ErrSettled: the request was already answered, cancelled or timed out.
	ErrSettled = errors.New("request already settled")
)

// InvalidAnswerError is an answer that does not fit its request.
type InvalidAnswerError struct{ Msg string }

func (e *InvalidAnswerError) Error() string { return e.Msg }

// Code is the stable error code.
func (e *InvalidAnswerError) Code() string { return "INVALID_ARGUMENT" }

func invalid(format string, args ...any) error {
	return &InvalidAnswerError{Msg: fmt.Sprintf(format, args...)}
}

// UnansweredError is a question nobody answered.
type UnansweredError struct {
	Outcome sessionv1.ApprovalOutcome
	Reason  string
}

func (e *UnansweredError) Error() string { return e.Reason }

// Code is the stable error code.
func (e *UnansweredError) Code() string {
	if e.Outcome == sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_CANCELLED {
		return "ASK_ABORTED"
	}
	return "NO_ANSWER"
}

// Config is the deployment's approval settings, shared by every session.
type Config struct {
	// Policy applies to sessions that set none; unset means on_request.
	Policy sessionv1.ApprovalPolicy
	// Rules are evaluated after the session's own rules.
	Rules []*sessionv1.ApprovalRule
	// Timeout settles an unanswered request as unavailable; 0: no deadline.
	Timeout time.Duration
	// Approvers are consulted in order before a person is asked.
	Approvers []Remote
	Logger    *slog.Logger

	patterns patternCache // shared by every session's gate
}

// Gate is one session's approval channel.
type Gate struct {
	cfg   *Config
	log   *session.Log
	flush func(context.Context) error
	lg    *slog.Logger

	mu      sync.Mutex
	waiters map[string]*waiter
}

type waiter struct {
	asked *sessionv1.SessionEvent
	added *sessionv1.ApprovalRule      // the rule ALLOW_FOR_SESSION adds
	done  chan *sessionv1.SessionEvent // the settling event, once
}

// NewGate returns the gate of the session whose log is log; flush makes an
// answer durable before Respond returns.
func NewGate(cfg *Config, log *session.Log, flush func(context.Context) error) *Gate {
	lg := cfg.Logger
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	return &Gate{cfg: cfg, log: log, flush: flush, lg: lg.With("session", log.Header().GetId()), waiters: map[string]*waiter{}}
}

// Policy is the session's effective approval policy.
func (g *Gate) Policy() sessionv1.ApprovalPolicy {
	p := g.log.Settings().Options.GetApproval()
	if p == sessionv1.ApprovalPolicy_APPROVAL_POLICY_UNSPECIFIED {
		p = g.cfg.Policy
	}
	if p == sessionv1.ApprovalPolicy_APPROVAL_POLICY_UNSPECIFIED {
		p = sessionv1.ApprovalPolicy_APPROVAL_POLICY_ON_REQUEST
	}
	return p
}

// Approve decides whether a call may run (the approval stage of the tool
// pipeline, semantics.md §6.5 step 4). ask is a tool interceptor's ask (nil
// when none asked); without one the session's rules, then the deployment's,
// decide. pathKey is the key the tool reads its path from (PathKeyOf of
// its schema). It returns whether the call may run, or the reason it may
// not. waiting (may be nil) runs before Approve waits for a person's or an
// approver's answer, which may take hours: the tool pipeline lets go there
// of what it holds for the call.
func (g *Gate) Approve(ctx context.Context, ex *toolsv1.ToolExecution, ask *toolsv1.PreAsk, pathKey string, waiting func()) (bool, string) {
	policy := g.Policy()
	subj := SubjectFor(ex.GetName(), ex.GetArguments(), ex.GetContext().GetCwd(), pathKey)
	if subj.Folded != "" {
		// A case-insensitive decoder (encoding/json's, on a host without
		// toolsdk's check) may run the call on that key's value, not on
		// the subject the rules judged.
		return false, fmt.Sprintf("tool %s was refused: its arguments have the key %q, which differs only in case from a key the approval rules read; keys are case-sensitive", ex.GetName(), subj.Folded)
	}
	var reason, rule string
	if ask != nil {
		reason = ask.GetReason()
		if reason == "" {
			reason = "a tool interceptor asks for approval"
		}
	} else {
		d := evaluate(&g.cfg.patterns, subj, g.log.Settings().Options.GetApprovalRules(), g.cfg.Rules)
		switch d.Action {
		case sessionv1.RuleAction_RULE_ACTION_DENY:
			return false, fmt.Sprintf("tool %s was denied by the approval rule %q", ex.GetName(), d.Rule)
		case sessionv1.RuleAction_RULE_ACTION_ALLOW:
			if policy != sessionv1.ApprovalPolicy_APPROVAL_POLICY_ALWAYS {
				return true, ""
			}
			reason = "the session's approval policy is always"
		default:
			reason, rule = fmt.Sprintf("the rule %q asks before this call", d.Rule), d.Rule
		}
	}
	asked := &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_ApprovalAsked{ApprovalAsked: &sessionv1.ApprovalAsked{
		ToolName: ex.GetName(), CallId: ex.GetCallId(), Reason: reason, Rule: rule, Turn: ex.GetContext().GetTurn()}}}
	id, w, err := g.open(asked, SessionRule(subj))
	if err != nil {
		g.lg.Error("approval request could not be logged; refusing the call", "err", err)
		return false, fmt.Sprintf("tool %s needs approval and the request could not be recorded", ex.GetName())
	}
	var settled *sessionv1.SessionEvent
	if policy == sessionv1.ApprovalPolicy_APPROVAL_POLICY_NEVER {
		settled = g.settleOwn(id, w, decided(id, sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_UNAVAILABLE, ByPolicy, ""))
	} else {
		if waiting != nil {
			waiting()
		}
		g.durable(ctx)
		g.consultApprovers(ctx, id, ex, reason, rule)
		settled = g.wait(ctx, id, w, func(by string, o sessionv1.ApprovalOutcome, msg string) *sessionv1.SessionEvent {
			return decided(id, o, by, msg)
		})
	}
	d := settled.GetApprovalDecided()
	switch d.GetOutcome() {
	case sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_ALLOWED_ONCE, sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_ALLOWED_FOR_SESSION:
		return true, ""
	}
	return false, denial(ex.GetName(), d, g.cfg.Timeout)
}

// denial is the model-facing reason of a settled, refused request.
func denial(tool string, d *sessionv1.ApprovalDecided, timeout time.Duration) string {
	var s string
	switch d.GetOutcome() {
	case sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_REJECTED:
		who := "the user"
		if name, ok := strings.CutPrefix(d.GetBy(), "approver:"); ok {
			who = "the approver " + name
		}
		s = fmt.Sprintf("%s rejected tool %s", who, tool)
	case sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_CANCELLED:
		s = fmt.Sprintf("the approval request for tool %s was cancelled", tool)
	default:
		switch d.GetBy() {
		case ByPolicy:
			s = fmt.Sprintf("tool %s needs approval, but the session's approval policy is never: nobody was asked", tool)
		case ByDeadline:
			s = fmt.Sprintf("tool %s needs approval and nobody answered within %s", tool, timeout)
		default:
			s = fmt.Sprintf("tool %s needs approval and no approval channel could answer (%s)", tool, d.GetBy())
		}
	}
	if d.GetMessage() != "" {
		s += ": " + d.GetMessage()
	}
	return s
}

func decided(id string, o sessionv1.ApprovalOutcome, by, msg string) *sessionv1.SessionEvent {
	return &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_ApprovalDecided{ApprovalDecided: &sessionv1.ApprovalDecided{
		Id: id, Outcome: o, By: by, Message: msg}}}
}

func unanswered(id string, o sessionv1.ApprovalOutcome, by string) *sessionv1.SessionEvent {
	return &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_QuestionAnswered{QuestionAnswered: &sessionv1.QuestionAnswered{
		Id: id, Unanswered: o, By: by}}}
}

// Ask asks the questions of an ask_user_question call and waits for the
// answers (semantics.md §7.14). With approval policy never, or when the
// deadline passes or the turn is cancelled, it returns an *UnansweredError.
func (g *Gate) Ask(ctx context.Context, ex *toolsv1.ToolExecution, questions []*sessionv1.Question) ([]*sessionv1.QuestionAnswer, error) {
	asked := &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_QuestionAsked{QuestionAsked: &sessionv1.QuestionAsked{
		CallId: ex.GetCallId(), Questions: questions, Turn: ex.GetContext().GetTurn()}}}
	id, w, err := g.open(asked, nil)
	if err != nil {
		return nil, fmt.Errorf("record the question: %w", err)
	}
	var settled *sessionv1.SessionEvent
	if g.Policy() == sessionv1.ApprovalPolicy_APPROVAL_POLICY_NEVER {
		settled = g.settleOwn(id, w, unanswered(id, sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_UNAVAILABLE, ByPolicy))
	} else {
		g.durable(ctx)
		settled = g.wait(ctx, id, w, func(by string, o sessionv1.ApprovalOutcome, _ string) *sessionv1.SessionEvent {
			return unanswered(id, o, by)
		})
	}
	qa := settled.GetQuestionAnswered()
	switch {
	case qa.GetUnanswered() == sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_UNSPECIFIED:
		return qa.GetAnswers(), nil
	case qa.GetUnanswered() == sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_CANCELLED:
		return nil, &UnansweredError{Outcome: qa.GetUnanswered(), Reason: "the question was cancelled before anyone answered"}
	case qa.GetBy() == ByPolicy:
		return nil, &UnansweredError{Outcome: qa.GetUnanswered(), Reason: "nobody can answer questions in this session (approval policy never); decide yourself and say what you assumed"}
	default:
		return nil, &UnansweredError{Outcome: qa.GetUnanswered(), Reason: fmt.Sprintf("nobody answered within %s; decide yourself and say what you assumed", g.cfg.Timeout)}
	}
}

// open logs a request with a fresh id and registers its waiter, atomically
// with respect to Respond.
func (g *Gate) open(asked *sessionv1.SessionEvent, added *sessionv1.ApprovalRule) (string, *waiter, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	id := fmt.Sprintf("req-%d", g.log.RequestsAsked()+1)
	switch p := asked.GetPayload().(type) {
	case *sessionv1.SessionEvent_ApprovalAsked:
		p.ApprovalAsked.Id = id
	case *sessionv1.SessionEvent_QuestionAsked:
		p.QuestionAsked.Id = id
	}
	ev, err := g.log.Append(asked)
	if err != nil {
		return "", nil, err
	}
	w := &waiter{asked: ev, added: added, done: make(chan *sessionv1.SessionEvent, 1)}
	g.waiters[id] = w
	return id, w, nil
}

// durable makes an open request durable: a person may take minutes to
// answer, and a request clients were shown must survive a crash (the repair
// then settles it as cancelled rather than it vanishing).
func (g *Gate) durable(ctx context.Context) {
	if g.flush == nil {
		return
	}
	if err := g.flush(context.WithoutCancel(ctx)); err != nil {
		g.lg.Warn("could not make an open request durable", "err", err)
	}
}

// settle appends the settling event of request id unless it is settled
// already; build sees the asked event and may refuse the answer.
func (g *Gate) settle(id string, build func(w *waiter) (*sessionv1.SessionEvent, error)) (*sessionv1.SessionEvent, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	w, ok := g.waiters[id]
	if !ok {
		if g.wasAsked(id) {
			return nil, fmt.Errorf("request %s: %w", id, ErrSettled)
		}
		return nil, fmt.Errorf("request %q: %w", id, ErrUnknownRequest)
	}
	ev, err := build(w)
	if err != nil {
		return nil, err
	}
	out, err := g.log.Append(ev)
	if err != nil {
		return nil, fmt.Errorf("record the answer to %s: %w", id, err)
	}
	delete(g.waiters, id)
	w.done <- out
	return out, nil
}

// settleOwn settles a request its own goroutine decided (policy, cancel,
// deadline, approver); if an answer won the race, that answer stands.
func (g *Gate) settleOwn(id string, w *waiter, ev *sessionv1.SessionEvent) *sessionv1.SessionEvent {
	if _, err := g.settle(id, func(*waiter) (*sessionv1.SessionEvent, error) { return ev, nil }); err != nil && !errors.Is(err, ErrSettled) {
		// The log refused the settlement: the caller still gets the
		// fail-closed outcome (the request stays open in the log until the
		// turn's repair).
		g.lg.Error("could not record a request's settlement", "request", id, "err", err)
		g.mu.Lock()
		delete(g.waiters, id)
		g.mu.Unlock()
		return ev
	}
	return <-w.done
}

// wait blocks until an answer, a cancel or the deadline settles request id.
func (g *Gate) wait(ctx context.Context, id string, w *waiter, own func(by string, o sessionv1.ApprovalOutcome, msg string) *sessionv1.SessionEvent) *sessionv1.SessionEvent {
	var deadline <-chan time.Time
	if g.cfg.Timeout > 0 {
		t := time.NewTimer(g.cfg.Timeout)
		defer t.Stop()
		deadline = t.C
	}
	select {
	case ev := <-w.done:
		return ev
	case <-ctx.Done():
		return g.settleOwn(id, w, own(ByCancel, sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_CANCELLED, ""))
	case <-deadline:
		return g.settleOwn(id, w, own(ByDeadline, sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_UNAVAILABLE, ""))
	}
}

// wasAsked reports whether the log holds a request with the id.
func (g *Gate) wasAsked(id string) bool {
	for _, ev := range g.log.Events() {
		if ev.GetApprovalAsked().GetId() == id || ev.GetQuestionAsked().GetId() == id {
			return true
		}
	}
	return false
}

// Respond answers request id on behalf of by (e.g. "user" or
// "user:<subject>"): the first valid answer settles it, and the settling
// event is durable when Respond returns. It returns the event's seq.
func (g *Gate) Respond(ctx context.Context, req *agentv1.RespondRequest, by string) (int64, error) {
	ev, err := g.settle(req.GetRequestId(), func(w *waiter) (*sessionv1.SessionEvent, error) {
		return answer(req, w, by)
	})
	if err != nil {
		return 0, err
	}
	if g.flush != nil {
		if err := g.flush(ctx); err != nil {
			return 0, fmt.Errorf("make the answer durable: %w", err)
		}
	}
	return ev.GetSeq(), nil
}

// answer builds the settling event of a Respond, checking that the answer
// fits the request.
func answer(req *agentv1.RespondRequest, w *waiter, by string) (*sessionv1.SessionEvent, error) {
	id := req.GetRequestId()
	if a := w.asked.GetApprovalAsked(); a != nil {
		ap := req.GetApproval()
		if ap == nil {
			return nil, invalid("request %s is an approval of tool %s: answer it with approval, not a question answer", id, a.GetToolName())
		}
		switch ap.GetDecision() {
		case agentv1.ApprovalDecision_APPROVAL_DECISION_ALLOW_ONCE:
			return decided(id, sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_ALLOWED_ONCE, by, ap.GetMessage()), nil
		case agentv1.ApprovalDecision_APPROVAL_DECISION_REJECT:
			return decided(id, sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_REJECTED, by, ap.GetMessage()), nil
		case agentv1.ApprovalDecision_APPROVAL_DECISION_ALLOW_FOR_SESSION:
			ev := decided(id, sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_ALLOWED_FOR_SESSION, by, ap.GetMessage())
			ev.GetApprovalDecided().AddedRule = proto.CloneOf(w.added)
			return ev, nil
		default:
			return nil, invalid("approval.decision must be ALLOW_ONCE, ALLOW_FOR_SESSION or REJECT")
		}
	}
	q := w.asked.GetQuestionAsked()
	qr := req.GetQuestion()
	if qr == nil {
		return nil, invalid("request %s is a question: answer it with question answers, not an approval", id)
	}
	if err := checkAnswers(q.GetQuestions(), qr.GetAnswers()); err != nil {
		return nil, err
	}
	answers := make([]*sessionv1.QuestionAnswer, len(qr.GetAnswers()))
	for i, a := range qr.GetAnswers() {
		answers[i] = proto.CloneOf(a)
	}
	return &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_QuestionAnswered{QuestionAnswered: &sessionv1.QuestionAnswered{
		Id: id, Answers: answers, By: by}}}, nil
}

// checkAnswers checks one answer per question: a known id, labels among the
// question's options (one unless multi_select), or free text instead.
func checkAnswers(qs []*sessionv1.Question, as []*sessionv1.QuestionAnswer) error {
	byID := map[string]*sessionv1.Question{}
	for _, q := range qs {
		byID[q.GetId()] = q
	}
	seen := map[string]bool{}
	for i, a := range as {
		q, ok := byID[a.GetId()]
		switch {
		case !ok:
			return invalid("question.answers[%d]: no question has id %q", i, a.GetId())
		case seen[a.GetId()]:
			return invalid("question.answers[%d]: question %q is answered twice", i, a.GetId())
		case a.Custom != nil && len(a.GetSelected()) > 0:
			return invalid("question.answers[%d]: give selected options or custom text, not both", i)
		case a.Custom == nil && len(a.GetSelected()) == 0:
			return invalid("question.answers[%d]: select an option or give custom text", i)
		case len(a.GetSelected()) > 1 && !q.GetMultiSelect():
			return invalid("question.answers[%d]: question %q takes one option", i, a.GetId())
		}
		seen[a.GetId()] = true
		for _, s := range a.GetSelected() {
			if !slices.ContainsFunc(q.GetOptions(), func(o *sessionv1.QuestionOption) bool { return o.GetLabel() == s }) {
				return invalid("question.answers[%d]: %q is not an option of question %q", i, s, a.GetId())
			}
		}
	}
	for _, q := range qs {
		if !seen[q.GetId()] {
			return invalid("question %q has no answer: answer every question", q.GetId())
		}
	}
	return nil
}

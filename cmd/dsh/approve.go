package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/dsh-dev/dsh/cmd/dsh/internal/render"
	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
)

// asker is the chat's side of approvals and questions: it queues the
// session's open requests (from the event stream), shows the first one as a
// card and turns the next input lines into a Respond.
type asker struct {
	c     agentv1.AgentServiceClient
	id    string
	scr   *screen
	calls map[string]*sessionv1.ToolCall // call id -> tool/call, for the card
	queue []*openRequest
}

type openRequest struct {
	id       string
	approval *sessionv1.ApprovalAsked
	question *sessionv1.QuestionAsked
	answers  []*sessionv1.QuestionAnswer // collected so far (one per question)
	shown    bool
}

func newAsker(c agentv1.AgentServiceClient, id string, scr *screen, pending []*agentv1.PendingRequest) *asker {
	a := &asker{c: c, id: id, scr: scr, calls: map[string]*sessionv1.ToolCall{}}
	for _, p := range pending {
		a.queue = append(a.queue, &openRequest{id: p.GetId(), approval: p.GetApproval(), question: p.GetQuestion()})
	}
	return a
}

// active reports whether input lines are answers now.
func (a *asker) active() bool { return len(a.queue) > 0 }

// event tracks requests; it reports whether the caller should re-show the
// normal prompt (never while a request is open).
func (a *asker) event(ctx context.Context, ev *sessionv1.SessionEvent) {
	switch p := ev.GetPayload().(type) {
	case *sessionv1.SessionEvent_ToolCall:
		a.calls[p.ToolCall.GetCallId()] = p.ToolCall
	case *sessionv1.SessionEvent_ApprovalAsked:
		a.queue = append(a.queue, &openRequest{id: p.ApprovalAsked.GetId(), approval: p.ApprovalAsked})
	case *sessionv1.SessionEvent_QuestionAsked:
		a.queue = append(a.queue, &openRequest{id: p.QuestionAsked.GetId(), question: p.QuestionAsked})
	case *sessionv1.SessionEvent_ApprovalDecided:
		a.settled(p.ApprovalDecided.GetId(), outcomeText(p.ApprovalDecided.GetOutcome(), p.ApprovalDecided.GetBy()))
	case *sessionv1.SessionEvent_QuestionAnswered:
		what := "answered"
		if u := p.QuestionAnswered.GetUnanswered(); u != sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_UNSPECIFIED {
			what = outcomeText(u, p.QuestionAnswered.GetBy())
		}
		a.settled(p.QuestionAnswered.GetId(), what)
	}
	a.show()
}

func outcomeText(o sessionv1.ApprovalOutcome, by string) string {
	names := map[sessionv1.ApprovalOutcome]string{
		sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_ALLOWED_ONCE:        "allowed",
		sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_ALLOWED_FOR_SESSION: "allowed for this session",
		sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_REJECTED:            "rejected",
		sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_CANCELLED:           "cancelled",
		sessionv1.ApprovalOutcome_APPROVAL_OUTCOME_UNAVAILABLE:         "unavailable",
	}
	return names[o] + " by " + by
}

func (a *asker) settled(id, what string) {
	for i, r := range a.queue {
		if r.id == id {
			a.queue = append(a.queue[:i], a.queue[i+1:]...)
			a.scr.println(a.scr.dim("  ↳ " + what))
			a.scr.setAsking(len(a.queue) > 0)
			return
		}
	}
}

// show draws the first open request's card once.
func (a *asker) show() {
	if len(a.queue) == 0 {
		return
	}
	r := a.queue[0]
	a.scr.setAsking(true)
	if r.shown {
		return
	}
	r.shown = true
	if ap := r.approval; ap != nil {
		a.scr.println(a.scr.bold("⚠ approval needed · " + ap.GetToolName()))
		if c := a.calls[ap.GetCallId()]; c != nil {
			a.scr.println("  " + callSummary(c))
		}
		if ap.GetReason() != "" {
			a.scr.println(a.scr.dim("  why: " + ap.GetReason()))
		}
		a.scr.println(a.scr.dim("  [y] allow once · [a] always this session · [n] refuse · or type a message to refuse with it"))
		a.scr.ask("allow? ")
		return
	}
	a.showQuestion(r)
}

func (a *asker) showQuestion(r *openRequest) {
	q := r.question.GetQuestions()[len(r.answers)]
	head := "? "
	if q.GetHeader() != "" {
		head += "[" + q.GetHeader() + "] "
	}
	a.scr.println(a.scr.bold(head + q.GetQuestion()))
	if q.GetDetail() != "" {
		a.scr.println(a.scr.dim("  " + q.GetDetail()))
	}
	for i, o := range q.GetOptions() {
		line := fmt.Sprintf("  %d. %s", i+1, o.GetLabel())
		if o.GetDescription() != "" {
			line += a.scr.dim(" — " + o.GetDescription())
		}
		a.scr.println(line)
	}
	hint := "  type your answer"
	if len(q.GetOptions()) > 0 {
		hint = "  a number, or type your own answer"
		if q.GetMultiSelect() {
			hint = "  numbers (e.g. 1,3), or type your own answer"
		}
	}
	a.scr.println(a.scr.dim(hint))
	a.scr.ask("answer? ")
}

// callSummary is a one-line view of a call's arguments: the command for
// bash, the path for file tools, the JSON otherwise.
func callSummary(c *sessionv1.ToolCall) string {
	var args map[string]any
	if json.Unmarshal([]byte(c.GetArguments()), &args) == nil {
		if cmd, ok := args["command"].(string); ok {
			return "$ " + render.OneLine(cmd, 300)
		}
		for _, k := range []string{"file_path", "path"} {
			if p, ok := args[k].(string); ok {
				return p
			}
		}
	}
	return render.OneLine(c.GetArguments(), 300)
}

// answer handles an input line while a request is open.
func (a *asker) answer(ctx context.Context, line string) {
	r := a.queue[0]
	line = strings.TrimSpace(line)
	if line == "" {
		r.shown = false
		a.show()
		return
	}
	req := &agentv1.RespondRequest{SessionId: a.id, RequestId: r.id}
	if r.approval != nil {
		ap := &agentv1.ApprovalResponse{}
		switch strings.ToLower(line) {
		case "y", "yes":
			ap.Decision = agentv1.ApprovalDecision_APPROVAL_DECISION_ALLOW_ONCE
		case "a", "always":
			ap.Decision = agentv1.ApprovalDecision_APPROVAL_DECISION_ALLOW_FOR_SESSION
		case "n", "no":
			ap.Decision = agentv1.ApprovalDecision_APPROVAL_DECISION_REJECT
		default:
			ap.Decision, ap.Message = agentv1.ApprovalDecision_APPROVAL_DECISION_REJECT, line
		}
		req.Answer = &agentv1.RespondRequest_Approval{Approval: ap}
	} else {
		q := r.question.GetQuestions()[len(r.answers)]
		r.answers = append(r.answers, parseAnswer(q, line))
		if len(r.answers) < len(r.question.GetQuestions()) {
			a.showQuestion(r)
			return
		}
		req.Answer = &agentv1.RespondRequest_Question{Question: &agentv1.QuestionResponse{Answers: r.answers}}
	}
	if _, err := a.c.Respond(ctx, req); err != nil {
		a.scr.println("answer failed: " + rpcError("respond", err).Error())
		r.answers, r.shown = nil, false
		a.show()
	}
	// The settling event removes the request from the queue.
}

// parseAnswer reads option numbers ("2", "1,3") or free text.
func parseAnswer(q *sessionv1.Question, line string) *sessionv1.QuestionAnswer {
	if opts := q.GetOptions(); len(opts) > 0 {
		fields := strings.FieldsFunc(line, func(r rune) bool { return r == ',' || r == ' ' })
		var sel []string
		for _, f := range fields {
			n, err := strconv.Atoi(f)
			if err != nil || n < 1 || n > len(opts) {
				sel = nil
				break
			}
			sel = append(sel, opts[n-1].GetLabel())
		}
		if len(sel) == 1 || (len(sel) > 1 && q.GetMultiSelect()) {
			return &sessionv1.QuestionAnswer{Id: q.GetId(), Selected: sel}
		}
	}
	return &sessionv1.QuestionAnswer{Id: q.GetId(), Custom: &line}
}

// slashUpdate handles /model and /approval; it reports whether line was one.
func slashUpdate(ctx context.Context, c agentv1.AgentServiceClient, id, line string, say func(string)) bool {
	cmd, arg, _ := strings.Cut(line, " ")
	arg = strings.TrimSpace(arg)
	req := &agentv1.UpdateSessionRequest{SessionId: id, Options: &sessionv1.SessionOptions{}, UpdateMask: &fieldmaskpb.FieldMask{}}
	switch cmd {
	case "/model":
		if arg == "" {
			say("usage: /model MODEL or /model PROVIDER/MODEL")
			return true
		}
		if p, m, ok := strings.Cut(arg, "/"); ok {
			req.Options.Provider, req.Options.Model = p, m
			req.UpdateMask.Paths = []string{"options.provider", "options.model"}
		} else {
			req.Options.Model = arg
			req.UpdateMask.Paths = []string{"options.model"}
		}
	case "/approval":
		p, ok := map[string]sessionv1.ApprovalPolicy{"never": sessionv1.ApprovalPolicy_APPROVAL_POLICY_NEVER,
			"on-request": sessionv1.ApprovalPolicy_APPROVAL_POLICY_ON_REQUEST, "always": sessionv1.ApprovalPolicy_APPROVAL_POLICY_ALWAYS}[arg]
		if !ok {
			say("usage: /approval never|on-request|always")
			return true
		}
		req.Options.Approval = p
		req.UpdateMask.Paths = []string{"options.approval"}
	default:
		return false
	}
	resp, err := c.UpdateSession(ctx, req)
	if err != nil {
		say(rpcError("update session", err).Error())
		return true
	}
	o := resp.GetSession().GetEffectiveOptions()
	say(fmt.Sprintf("model %s/%s · approval %s (from the next step)", o.GetProvider(), o.GetModel(), policyText(o.GetApproval())))
	return true
}

func policyText(p sessionv1.ApprovalPolicy) string {
	switch p {
	case sessionv1.ApprovalPolicy_APPROVAL_POLICY_NEVER:
		return "never"
	case sessionv1.ApprovalPolicy_APPROVAL_POLICY_ON_REQUEST:
		return "on-request"
	case sessionv1.ApprovalPolicy_APPROVAL_POLICY_ALWAYS:
		return "always"
	}
	return "deployment default"
}

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"

	"google.golang.org/protobuf/proto"

	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent/internal/loop"
	"github.com/dsh-dev/dsh/services/agent/internal/subagent"
)

// The service's side of delegation (services/agent/internal/subagent): a
// child is an ordinary session of this service, created with the parent's
// tenant, cwd and options, parent_session, delegation_depth = parent + 1 and
// the SubagentSpec in its header.

// kids tracks the running children of each parent (GetSession's
// running_children); it has its own lock because snapshots are taken under
// Service.mu.
type kids struct {
	mu sync.Mutex
	m  map[string]map[string]bool // parent -> running child ids
}

func (k *kids) add(parent, child string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[string]map[string]bool{}
	}
	if k.m[parent] == nil {
		k.m[parent] = map[string]bool{}
	}
	k.m[parent][child] = true
}

func (k *kids) remove(parent, child string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.m[parent], child)
	if len(k.m[parent]) == 0 {
		delete(k.m, parent)
	}
}

// has reports whether parent has running children.
func (k *kids) has(parent string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m[parent]) > 0
}

func (k *kids) of(parent string) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]string, 0, len(k.m[parent]))
	for id := range k.m[parent] {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// delegation implements subagent.Sessions on the service.
type delegation struct{ s *Service }

// liveByID is a live session without taking a reference (the delegating
// parent is live while its tool call runs).
func (s *Service) liveByID(id string) (*liveSession, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l, ok := s.live[id]; ok {
		return l, nil
	}
	return nil, fmt.Errorf("session %s: %w", id, subagent.ErrNoSession)
}

func (d delegation) Depth(id string) (int32, error) {
	l, err := d.s.liveByID(id)
	if err != nil {
		return 0, err
	}
	return l.log.Header().GetDelegationDepth(), nil
}

func (d delegation) ToolNames(id string) []string {
	l, err := d.s.liveByID(id)
	if err != nil || d.s.deps.Tools == nil {
		return nil
	}
	h := l.log.Header()
	var out []string
	for _, sc := range d.s.toolsFor(h).Schemas(h.GetOptions().GetToolhosts()) {
		if sc.GetName() != subagent.CaptureTool {
			out = append(out, sc.GetName())
		}
	}
	return out
}

// toolsFor is a session's tools: the registry behind its child settings.
func (s *Service) toolsFor(h *sessionv1.SessionHeader) loop.Tools {
	return subagent.Restrict(s.deps.Tools, h.GetSubagent())
}

// schemaPrompt tells a child with an output schema how to finish.
const schemaPrompt = "When you have the result, call " + subagent.CaptureTool +
	" with it (its parameters are the required schema), then reply with a one-line summary."

func subagentTrigger() *sessionv1.TurnTrigger {
	return session.InjectionTrigger(session.PluginSource("subagent"))
}

func (d delegation) Start(ctx context.Context, req subagent.Request) (subagent.Child, error) {
	s := d.s
	parent, err := s.liveByID(req.ParentID)
	if err != nil {
		return nil, err
	}
	ph := parent.log.Header()
	opts := proto.CloneOf(ph.GetOptions())
	if opts == nil {
		opts = &sessionv1.SessionOptions{}
	}
	if req.Persona != "" {
		opts.Persona = req.Persona
	}
	if req.OutputSchema != "" {
		opts.SystemPrompt = joinNonEmpty(opts.GetSystemPrompt(), schemaPrompt)
	}
	// A child never sees more tools than its parent: without a filter of
	// its own it inherits the parent's (a filter of its own was checked
	// against the parent's tools).
	tools := req.Tools
	if len(tools) == 0 {
		tools = ph.GetSubagent().GetTools()
	}
	h := &sessionv1.SessionHeader{Id: s.cfg.NewID(), CreatedAt: s.cfg.Now().UnixMilli(), Cwd: ph.GetCwd(),
		ParentSession: ph.GetId(), DelegationDepth: req.Depth, Options: opts, Tenant: ph.GetTenant(),
		Subagent: &sessionv1.SubagentSpec{Description: req.Description, Mode: req.Mode, Tools: tools,
			OutputSchema: req.OutputSchema, ToolCallId: req.ToolCallID}}
	var seed []*sessionv1.SessionEvent
	if req.Mode == sessionv1.SubagentMode_SUBAGENT_MODE_FORK {
		seed = forkPrefix(parent.log.Events())
		if len(seed) > 0 {
			n := int64(len(seed))
			h.SeedLength = &n
		}
	}
	if _, err := s.start(ctx, h, seed); err != nil {
		return nil, err
	}
	child, err := s.liveByID(h.GetId())
	if err != nil {
		return nil, err
	}
	start := &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_SubagentStart{SubagentStart: &sessionv1.SubagentStart{
		ChildSession: h.GetId(), Description: req.Description, Mode: req.Mode, Background: req.Background,
		ToolCallId: req.ToolCallID, Turn: req.Turn, TaskId: req.TaskID}}}
	// Durable before the child runs: after a crash the parent's log names
	// every child it started.
	if err := parent.record(ctx, start, true); err != nil {
		s.dropChild(context.WithoutCancel(ctx), child)
		return nil, fmt.Errorf("record subagent/start: %w", err)
	}
	s.kids.add(ph.GetId(), h.GetId())
	if _, err := child.agent.Send(loop.Item{Content: []*llmv1.ContentBlock{session.Text(req.Prompt)},
		Source: session.AgentSource(ph.GetId())}); err != nil {
		s.kids.remove(ph.GetId(), h.GetId())
		s.dropChild(context.WithoutCancel(ctx), child)
		return nil, fmt.Errorf("queue the prompt: %w", err)
	}
	s.log.Info("subagent started", "parent", ph.GetId(), "child", h.GetId(), "mode", req.Mode.String(), "depth", req.Depth)
	return &childRun{l: child}, nil
}

// record appends a subagent event to the parent: into its open turn (the
// delegating call's; made durable now when durable is set, otherwise with the
// call's result), or, when the parent is idle (a background child ending),
// as a zero-step turn made durable at once.
func (l *liveSession) record(ctx context.Context, ev *sessionv1.SessionEvent, durable bool) error {
	if _, open := l.log.OpenTurn(); open {
		if _, err := l.log.Append(proto.CloneOf(ev)); err == nil {
			if durable {
				return l.flush(ctx)
			}
			return nil
		}
		// The turn closed meanwhile: record it in a turn of its own.
	}
	_, err := l.agent.Record(ctx, subagentTrigger(), ev)
	return err
}

// forkPrefix is the parent's contiguous prefix up to and including its last
// turn/end (§7.7); empty when there is none.
func forkPrefix(evs []*sessionv1.SessionEvent) []*sessionv1.SessionEvent {
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].GetTurnEnd() != nil {
			out := make([]*sessionv1.SessionEvent, i+1)
			for j := range out {
				out[j] = proto.CloneOf(evs[j])
			}
			return out
		}
	}
	return nil
}

func joinNonEmpty(a, b string) string {
	if a == "" {
		return b
	}
	return a + "\n\n" + b
}

func (d delegation) End(ctx context.Context, req subagent.Request, c subagent.Child, out subagent.Outcome) {
	s := d.s
	s.kids.remove(req.ParentID, c.ID())
	end := &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_SubagentEnd{SubagentEnd: &sessionv1.SubagentEnd{
		ChildSession: c.ID(), Outcome: out.StopReason, Usage: out.Usage, Error: out.Error, ToolCallId: req.ToolCallID}}}
	if parent, err := s.liveByID(req.ParentID); err == nil {
		if err := parent.record(ctx, end, false); err != nil && !errors.Is(err, loop.ErrDisposed) {
			s.log.Error("record subagent/end", "parent", req.ParentID, "child", c.ID(), "err", err)
		}
	}
	if cr, ok := c.(*childRun); ok {
		s.dropChild(ctx, cr.l)
	}
}

// dropChild disposes a finished child: it leaves memory at once unless a
// client holds it (then the idle janitor unloads it later).
func (s *Service) dropChild(ctx context.Context, l *liveSession) {
	s.mu.Lock()
	if s.live[l.id] != l || l.refs > 0 {
		s.mu.Unlock()
		return
	}
	delete(s.live, l.id)
	s.mu.Unlock()
	s.retire(ctx, l)
}

func (d delegation) Notify(id, text string) {
	l, err := d.s.liveByID(id)
	if err != nil {
		return
	}
	if err := l.agent.Inject([]*llmv1.ContentBlock{session.Text(text)}, session.PluginSource("subagent"), nil); err != nil &&
		!errors.Is(err, loop.ErrDisposed) {
		d.s.log.Warn("subagent completion notice", "session", id, "err", err)
	}
}

// childRun is a running child.
type childRun struct{ l *liveSession }

func (c *childRun) ID() string { return c.l.id }

func (c *childRun) Wait(ctx context.Context) subagent.Outcome {
	done := make(chan struct{})
	go func() {
		_ = c.l.agent.WaitIdle(context.Background())
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		c.l.agent.Cancel(fmt.Errorf("the delegating turn was cancelled: %w", context.Cause(ctx)))
		<-done
	}
	h := c.l.log.Header()
	return outcomeOf(c.l.log.EventsFrom(h.GetSeedLength()), h.GetSubagent().GetOutputSchema())
}

// outcomeOf reads a child's result from its log: the last turn's end
// reason, its last assistant text, the summed usage and, with a schema, the
// last accepted structured_output value.
func outcomeOf(evs []*sessionv1.SessionEvent, schema string) subagent.Outcome {
	out := subagent.Outcome{StopReason: "interrupted", Usage: &llmv1.TokenUsage{}}
	calls := map[string]string{} // call id -> structured_output arguments
	for _, ev := range evs {
		switch p := ev.GetPayload().(type) {
		case *sessionv1.SessionEvent_AssistantMessage:
			addUsage(out.Usage, p.AssistantMessage.GetUsage())
			var txt string
			for _, b := range p.AssistantMessage.GetContent() {
				txt += b.GetText().GetText()
			}
			if txt != "" {
				out.Output = txt
			}
		case *sessionv1.SessionEvent_SubagentEnd:
			addUsage(out.Usage, p.SubagentEnd.GetUsage())
		case *sessionv1.SessionEvent_ToolCall:
			if p.ToolCall.GetName() == subagent.CaptureTool {
				calls[p.ToolCall.GetCallId()] = p.ToolCall.GetArguments()
			}
		case *sessionv1.SessionEvent_ToolResult:
			if a, ok := calls[p.ToolResult.GetCallId()]; ok && !p.ToolResult.GetIsError() && schema != "" {
				out.Structured = json.RawMessage(a)
			}
		case *sessionv1.SessionEvent_TurnEnd:
			out.StopReason, out.Error = endReason(p.TurnEnd.GetReason())
		}
	}
	return out
}

func endReason(r *sessionv1.TurnEndReason) (string, string) {
	switch k := r.GetKind().(type) {
	case *sessionv1.TurnEndReason_Completed:
		return "completed", ""
	case *sessionv1.TurnEndReason_Aborted:
		return "aborted", "the subagent's turn was cancelled"
	case *sessionv1.TurnEndReason_Error:
		return "error", k.Error.GetMessage()
	case *sessionv1.TurnEndReason_Disposed:
		return "disposed", "the subagent was disposed"
	case *sessionv1.TurnEndReason_MaxTokens:
		return "max-tokens", "the subagent hit its output token limit"
	case *sessionv1.TurnEndReason_Rejected:
		return "rejected", k.Rejected.GetReason()
	case *sessionv1.TurnEndReason_Interrupted:
		return "interrupted", "the subagent's turn was interrupted"
	case *sessionv1.TurnEndReason_Extension:
		return k.Extension.GetType(), ""
	}
	return "error", "unknown end"
}

func addUsage(sum, u *llmv1.TokenUsage) {
	if u == nil {
		return
	}
	sum.InputTokens += u.GetInputTokens()
	sum.OutputTokens += u.GetOutputTokens()
	if u.CacheReadTokens != nil {
		sum.CacheReadTokens = proto.Int64(sum.GetCacheReadTokens() + u.GetCacheReadTokens())
	}
	if u.CacheWriteTokens != nil {
		sum.CacheWriteTokens = proto.Int64(sum.GetCacheWriteTokens() + u.GetCacheWriteTokens())
	}
	if u.ReasoningTokens != nil {
		sum.ReasoningTokens = proto.Int64(sum.GetReasoningTokens() + u.GetReasoningTokens())
	}
}

// usageSum sums a log's own usage and its children's (subagent/end)
// incrementally: each call folds only the events appended since the last
// one, so a session's snapshot (every GetSession, WaitIdle and
// ListSessions) no longer walks its whole log.
type usageSum struct {
	mu            sync.Mutex
	n             int // events folded so far
	own, children *llmv1.TokenUsage
}

// of returns the sums over evs, a snapshot of the log whose first n events
// earlier calls folded (the log is append-only). The results are the
// caller's own copies.
func (u *usageSum) of(evs []*sessionv1.SessionEvent) (own, children *llmv1.TokenUsage) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.own == nil {
		u.own, u.children = &llmv1.TokenUsage{}, &llmv1.TokenUsage{}
	}
	for _, ev := range evs[min(u.n, len(evs)):] {
		addUsage(u.own, ev.GetAssistantMessage().GetUsage())
		addUsage(u.children, ev.GetSubagentEnd().GetUsage())
	}
	u.n = max(u.n, len(evs))
	return proto.CloneOf(u.own), proto.CloneOf(u.children)
}

// closeOrphanedStarts pairs every subagent/start of a loaded log that has no
// subagent/end (the agent stopped while the child ran: a crash, or a
// shutdown that disposed the parent first) with a subagent/end "interrupted",
// so the parent's log stays paired (§7.7) beside the repaired child.
func (l *liveSession) closeOrphanedStarts(ctx context.Context) {
	open := map[string]*sessionv1.SubagentStart{}
	var order []string
	for _, ev := range l.log.Events() {
		if st := ev.GetSubagentStart(); st != nil {
			open[st.GetChildSession()] = st
			order = append(order, st.GetChildSession())
		}
		if en := ev.GetSubagentEnd(); en != nil {
			delete(open, en.GetChildSession())
		}
	}
	var ends []*sessionv1.SessionEvent
	for _, id := range order {
		if st, ok := open[id]; ok {
			delete(open, id)
			ends = append(ends, &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_SubagentEnd{SubagentEnd: &sessionv1.SubagentEnd{
				ChildSession: id, Outcome: "interrupted", Usage: &llmv1.TokenUsage{}, ToolCallId: st.GetToolCallId(),
				Error: "the agent stopped while the subagent ran"}}})
		}
	}
	if len(ends) == 0 {
		return
	}
	if _, err := l.agent.Record(ctx, subagentTrigger(), ends...); err != nil {
		l.s.log.Error("close interrupted subagents", "session", l.id, "err", err)
	}
}

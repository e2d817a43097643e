package agent_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
)

// brain scripts a model that serves several sessions at once: each request
// is answered from the queue of the last user text it carries (the parent's
// prompt, a child's delegated prompt), so parallel children get their own
// answers whatever order they ask in.
type brain struct {
	mu     sync.Mutex
	queues map[string][]fakes.Response
	seen   map[string][]*llmv1.GenerateRequest
}

func newBrain(e *env) *brain { return brainOn(e.gw) }

func brainOn(gw *fakes.Gateway) *brain {
	b := &brain{queues: map[string][]fakes.Response{}, seen: map[string][]*llmv1.GenerateRequest{}}
	gw.Default = b.answer
	return b
}

func (b *brain) on(prompt string, rs ...fakes.Response) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.queues[prompt] = append(b.queues[prompt], rs...)
}

func (b *brain) requests(prompt string) []*llmv1.GenerateRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.seen[prompt]
}

func lastUserText(req *llmv1.GenerateRequest) string {
	for i := len(req.GetMessages()) - 1; i >= 0; i-- {
		m := req.GetMessages()[i]
		if m.GetRole() != llmv1.Role_ROLE_USER {
			continue
		}
		for _, c := range m.GetContent() {
			if t := c.GetText().GetText(); t != "" && !strings.HasPrefix(t, "Background subagent task") {
				return t
			}
		}
	}
	return ""
}

func (b *brain) answer(req *llmv1.GenerateRequest) fakes.Response {
	key := lastUserText(req)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seen[key] = append(b.seen[key], req)
	q := b.queues[key]
	if len(q) == 0 {
		return fakes.Response{Chunks: fakes.Text("unscripted: " + key)}
	}
	b.queues[key] = q[1:]
	return q[0]
}

func reply(s string) fakes.Response { return fakes.Response{Chunks: fakes.Text(s)} }

func calls(cs ...fakes.Call) fakes.Response {
	return fakes.Response{Chunks: fakes.ToolCalls("", cs...)}
}

// newSubagentEnv is an env with deterministic ids (child-1, child-2, ...)
// and an echo tool.
func newSubagentEnv(t *testing.T, mutate func(*env)) (*env, *brain) {
	t.Helper()
	var n atomic.Int64
	echo := fakes.Tool{Name: "echo", Run: func(_ context.Context, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
		return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{fakes.TextContent("echo " + ex.GetArguments())}}
	}}
	e := newEnvFull(t, func(e *env) {
		e.cfg.NewID = func() string { return fmt.Sprintf("child-%d", n.Add(1)) }
		e.cfg.Now = func() time.Time { return time.UnixMilli(1_700_000_000_000) }
		if mutate != nil {
			mutate(e)
		}
	}, echo)
	return e, newBrain(e)
}

// lineage renders the golden form of a delegation: the parent's log and
// then each child's.
func (e *env) lineage(t *testing.T, parent string, children ...string) string {
	t.Helper()
	var b strings.Builder
	for _, id := range append([]string{parent}, children...) {
		s := e.waitIdle(id)
		h := s.GetHeader()
		fmt.Fprintf(&b, "== %s parent=%q depth=%d tenant=%s seed=%d spec=%s\n", id, h.GetParentSession(), h.GetDelegationDepth(),
			h.GetTenant(), h.GetSeedLength(), specText(h.GetSubagent()))
		b.WriteString(renderSubagent(e.events(id)))
	}
	return b.String()
}

func specText(s *sessionv1.SubagentSpec) string {
	if s == nil {
		return "-"
	}
	return fmt.Sprintf("%s/%q/tools=%v/schema=%v", strings.TrimPrefix(s.GetMode().String(), "SUBAGENT_MODE_"), s.GetDescription(),
		s.GetTools(), s.GetOutputSchema() != "")
}

func renderSubagent(evs []*sessionv1.SessionEvent) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(renderApproval(evs), "\n") {
		b.WriteString(line)
	}
	out := b.String()
	for _, ev := range evs {
		if ev.GetSubagentStart() != nil || ev.GetSubagentEnd() != nil {
			want := fmt.Sprintf("%d %s \n", ev.GetSeq(), typeOf(ev))
			out = strings.Replace(out, want, fmt.Sprintf("%d %s %s\n", ev.GetSeq(), typeOf(ev), payloadJSON(ev)), 1)
		}
	}
	return out
}

func typeOf(ev *sessionv1.SessionEvent) string {
	if ev.GetSubagentStart() != nil {
		return "subagent/start"
	}
	return "subagent/end"
}

func goldenSub(t *testing.T, name, got string) { t.Helper(); golden(t, "../subagent/"+name, got) }

func TestSubagentSpawn(t *testing.T) {
	e, b := newSubagentEnv(t, nil)
	b.on("research it", calls(fakes.Call{ID: "c1", Name: "subagent", Args: `{"description":"look up","prompt":"find the answer"}`}),
		reply("the parent says: 42"))
	b.on("find the answer", reply("42"))
	e.create("p")
	e.send("p", "research it")
	got := e.lineage(t, "p", "child-1")
	goldenSub(t, "spawn", got)
	// A spawned child saw none of the parent's conversation.
	for _, r := range b.requests("find the answer") {
		for _, m := range r.GetMessages() {
			if strings.Contains(fmt.Sprint(m), "research it") {
				t.Fatalf("the spawned child saw the parent's prompt: %v", m)
			}
		}
	}
	list, err := e.client.ListSessions(t.Context(), &agentv1.ListSessionsRequest{ParentSession: "p"})
	if err != nil || len(list.GetSessions()) != 1 || list.GetSessions()[0].GetHeader().GetId() != "child-1" {
		t.Fatalf("ListSessions(parent p) = %v, %v; want child-1", list, err)
	}
	s, err := e.client.GetSession(t.Context(), &agentv1.GetSessionRequest{SessionId: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.GetSession().GetRunningChildren()) != 0 {
		t.Fatalf("running children after the turn: %v", s.GetSession().GetRunningChildren())
	}
	if got := s.GetSession().GetChildrenUsage(); got.GetInputTokens() != 10 || got.GetOutputTokens() != 5 {
		t.Fatalf("children usage = %v, want the child's 10/5", got)
	}
}

func TestSubagentFork(t *testing.T) {
	e, b := newSubagentEnv(t, nil)
	b.on("first", reply("first answer"))
	b.on("fork it", calls(fakes.Call{ID: "c1", Name: "subagent_fork", Args: `{"description":"continue","prompt":"go on from there"}`}),
		reply("forked: done"))
	b.on("go on from there", reply("continued"))
	e.create("p")
	e.send("p", "first")
	e.waitIdle("p")
	e.send("p", "fork it")
	goldenSub(t, "fork", e.lineage(t, "p", "child-1"))
	reqs := b.requests("go on from there")
	if len(reqs) != 1 || !strings.Contains(fmt.Sprint(reqs[0].GetMessages()), "first answer") ||
		strings.Contains(fmt.Sprint(reqs[0].GetMessages()), "fork it") {
		t.Fatalf("the fork saw %v; want the prefix through turn 1 only", reqs)
	}
}

func TestSubagentRefusals(t *testing.T) {
	cases := []struct {
		name, tool, args string
		depth            int32
		code             string
	}{
		{"depth_limit", "subagent", `{"description":"d","prompt":"p"}`, -1, "DEPTH_LIMIT"},
		{"unknown_tool_in_filter", "subagent", `{"description":"d","prompt":"p","tools":["echo","rm_rf"]}`, 0, "UNKNOWN_TOOL"},
		{"invalid_output_schema", "subagent", `{"description":"d","prompt":"p","output_schema":{"type":"object","properties":{"a":{"type":"string","pattern":"x"}},"required":["b"]}}`, 0, "INVALID_OUTPUT_SCHEMA"},
		{"fork_persona_unsupported", "subagent_fork", `{"description":"d","prompt":"p","persona":"pirate"}`, 0, "UNSUPPORTED_CAPABILITY"},
		{"unknown_capability", "subagent", `{"description":"d","prompt":"p","max_turns":3}`, 0, "UNSUPPORTED_CAPABILITY"},
		{"empty_prompt", "subagent", `{"description":"d","prompt":" "}`, 0, "INVALID_ARGUMENTS"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e, b := newSubagentEnv(t, func(e *env) { e.cfg.MaxSubagentDepth = c.depth })
			b.on("go", calls(fakes.Call{ID: "c1", Name: c.tool, Args: c.args}), reply("ok"))
			e.create("p")
			e.send("p", "go")
			got := e.lineage(t, "p")
			if !strings.Contains(got, "code="+c.code) {
				t.Fatalf("want an error result %s:\n%s", c.code, got)
			}
			goldenSub(t, "refuse_"+c.name, got)
			list, _ := e.client.ListSessions(t.Context(), &agentv1.ListSessionsRequest{ParentSession: "p"})
			if len(list.GetSessions()) != 0 {
				t.Fatalf("a refused delegation created a child: %v", list.GetSessions())
			}
		})
	}
}

// A child at the deepest allowed level cannot delegate further.
func TestSubagentDepthLimitNested(t *testing.T) {
	e, b := newSubagentEnv(t, func(e *env) { e.cfg.MaxSubagentDepth = 1 })
	b.on("go", calls(fakes.Call{ID: "c1", Name: "subagent", Args: `{"description":"d1","prompt":"level one"}`}), reply("parent done"))
	b.on("level one", calls(fakes.Call{ID: "c2", Name: "subagent", Args: `{"description":"d2","prompt":"level two"}`}), reply("gave up"))
	e.create("p")
	e.send("p", "go")
	goldenSub(t, "depth_limit", e.lineage(t, "p", "child-1"))
}

func TestSubagentToolFilter(t *testing.T) {
	e, b := newSubagentEnv(t, nil)
	b.on("go", calls(fakes.Call{ID: "c1", Name: "subagent", Args: `{"description":"d","prompt":"only echo","tools":["echo"]}`}), reply("done"))
	b.on("only echo", calls(fakes.Call{ID: "k1", Name: "echo", Args: `{}`}, fakes.Call{ID: "k2", Name: "ask_user_question", Args: `{}`}),
		reply("filtered"))
	e.create("p")
	e.send("p", "go")
	goldenSub(t, "tool_filter", e.lineage(t, "p", "child-1"))
	for _, r := range b.requests("only echo") {
		if len(r.GetTools()) != 1 || r.GetTools()[0].GetName() != "echo" {
			t.Fatalf("the filtered child was offered %v", r.GetTools())
		}
	}
}

const schemaArgs = `{"description":"d","prompt":"structured please","output_schema":{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"],"additionalProperties":false}}`

func TestSubagentOutputSchema(t *testing.T) {
	t.Run("satisfied", func(t *testing.T) {
		e, b := newSubagentEnv(t, nil)
		b.on("go", calls(fakes.Call{ID: "c1", Name: "subagent", Args: schemaArgs}), reply("done"))
		b.on("structured please", calls(fakes.Call{ID: "s1", Name: "structured_output", Args: `{"n":"x"}`}),
			calls(fakes.Call{ID: "s2", Name: "structured_output", Args: `{"n":7}`}), reply("reported 7"))
		e.create("p")
		e.send("p", "go")
		got := e.lineage(t, "p", "child-1")
		if !strings.Contains(got, `\"structured\":{\"n\":7}`) {
			t.Fatalf("want the structured value:\n%s", got)
		}
		goldenSub(t, "schema_satisfied", got)
		tools := b.requests("structured please")[0].GetTools()
		i := slices.IndexFunc(tools, func(s *llmv1.ToolSchema) bool { return s.GetName() == "structured_output" })
		if i < 0 || !strings.Contains(tools[i].GetParameters(), `"additionalProperties":false`) {
			t.Fatalf("the capture tool is missing or not the schema verbatim: %v", tools)
		}
	})
	t.Run("not_satisfied", func(t *testing.T) {
		e, b := newSubagentEnv(t, nil)
		b.on("go", calls(fakes.Call{ID: "c1", Name: "subagent", Args: schemaArgs}), reply("done"))
		b.on("structured please", reply("seven, I think"))
		e.create("p")
		e.send("p", "go")
		got := e.lineage(t, "p", "child-1")
		if strings.Contains(got, `\"structured\"`) || !strings.Contains(got, "structured_error") {
			t.Fatalf("want no structured value:\n%s", got)
		}
		goldenSub(t, "schema_not_satisfied", got)
	})
}

func TestSubagentCancelForeground(t *testing.T) {
	e, b := newSubagentEnv(t, nil)
	b.on("go", calls(fakes.Call{ID: "c1", Name: "subagent", Args: `{"description":"slow","prompt":"take forever"}`}))
	b.on("take forever", fakes.Response{Chunks: fakes.TextBlock(0, "thinking"), Block: true})
	e.create("p")
	e.send("p", "go")
	waitFor(t, func() bool {
		s, err := e.client.GetSession(t.Context(), &agentv1.GetSessionRequest{SessionId: "p"})
		return err == nil && len(s.GetSession().GetRunningChildren()) == 1
	})
	// The child's model call is open and its partial text logged.
	waitFor(t, func() bool { return len(e.events("child-1")) == 7 })
	if _, err := e.client.Cancel(t.Context(), &agentv1.CancelRequest{SessionId: "p"}); err != nil {
		t.Fatal(err)
	}
	got := e.lineage(t, "p", "child-1")
	goldenSub(t, "cancel_foreground", got)
	if !strings.Contains(got, `"outcome":"aborted"`) {
		t.Fatalf("want the child aborted:\n%s", got)
	}
}

// The e2e of delegation: the model starts two background children in one
// response, waits for both with subagent_output and combines the answers;
// the client lists the children and streams one while it runs.
func TestSubagentBackgroundTwoChildren(t *testing.T) {
	e, b := newSubagentEnv(t, nil)
	left, right := make(chan struct{}), make(chan struct{})
	b.on("combine two", calls(
		fakes.Call{ID: "c1", Name: "subagent", Args: `{"description":"left","prompt":"left half","run_in_background":true}`},
		fakes.Call{ID: "c2", Name: "subagent_fork", Args: `{"description":"right","prompt":"right half","run_in_background":true}`}),
		calls(fakes.Call{ID: "c3", Name: "subagent_output", Args: `{"task_id":"subagent-1","wait":true,"timeout_ms":20000}`},
			fakes.Call{ID: "c4", Name: "subagent_output", Args: `{"task_id":"subagent-2","wait":true,"timeout_ms":20000}`}),
		reply("LEFT+RIGHT"))
	b.on("left half", fakes.Response{Wait: left, Chunks: fakes.Text("LEFT")})
	b.on("right half", fakes.Response{Wait: right, Chunks: fakes.Text("RIGHT")})
	e.create("p")
	e.send("p", "combine two")
	// Both children run at once and are visible to the client.
	waitFor(t, func() bool { return len(b.requests("left half")) == 1 && len(b.requests("right half")) == 1 })
	list, err := e.client.ListSessions(t.Context(), &agentv1.ListSessionsRequest{ParentSession: "p"})
	if err != nil || len(list.GetSessions()) != 2 {
		t.Fatalf("children while running = %v, %v", list, err)
	}
	for _, s := range list.GetSessions() {
		if s.GetStatus() != agentv1.AgentStatus_AGENT_STATUS_RUNNING {
			t.Fatalf("child %s is %v while its model call is open", s.GetHeader().GetId(), s.GetStatus())
		}
	}
	stream, err := e.client.StreamEvents(t.Context(), &agentv1.StreamEventsRequest{SessionId: "child-1"})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || first.GetEvent().GetTurnStart() == nil {
		t.Fatalf("streaming a running child: %v, %v", first, err)
	}
	// Release the children one by one once the parent waits on their
	// outputs (a stable log): their completion notices then queue behind
	// that tool batch.
	parentHas := func(s string) func() bool {
		return func() bool { return strings.Contains(renderSubagent(e.events("p")), s) }
	}
	waitFor(t, parentHas("tool/call c3 subagent_output"))
	close(left)
	waitFor(t, parentHas(`"childSession":"child-1","outcome"`))
	close(right)
	got := e.lineage(t, "p", "child-1", "child-2")
	goldenSub(t, "background_two_children", got)
	if !strings.Contains(got, `"LEFT+RIGHT"`) {
		t.Fatalf("the parent did not combine the answers:\n%s", got)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 20 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A crash while a foreground child runs: after the restart both logs are
// repaired consistently — the parent's delegating call is
// TOOL_OUTCOME_UNKNOWN and the child's turn is closed as interrupted — and
// the parent continues.
func TestSubagentCrashMidDelegation(t *testing.T) {
	gw := &fakes.Gateway{}
	b := brainOn(gw)
	b.on("delegate then crash", calls(fakes.Call{ID: "c1", Name: "subagent", Args: `{"description":"deep","prompt":"deep work"}`}))
	b.on("deep work", fakes.Response{Chunks: fakes.TextBlock(0, "half")[:2], Block: true})
	host := fakes.NewToolHost()
	gwAddr := fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, gw) })
	thAddr := fakes.Serve(t, func(s *grpc.Server) { toolsv1.RegisterToolHostServer(s, host) })
	dir := t.TempDir()
	c := startChild(t, gwAddr, thAddr, dir, "sqlite")
	ctx := t.Context()
	if _, err := c.client.CreateSession(ctx, &agentv1.CreateSessionRequest{SessionId: "p",
		Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.client.Send(ctx, &agentv1.SendRequest{SessionId: "p", Content: []*llmv1.ContentBlock{session.Text("delegate then crash")}}); err != nil {
		t.Fatal(err)
	}
	// The child's model call is open: its step is durable (checkpoint
	// before each request), as are the parent's tool/call and subagent/start.
	waitUntil(t, "the child's model call", func() bool { return len(b.requests("deep work")) == 1 })
	c.kill(t)

	c = startChild(t, gwAddr, thAddr, dir, "sqlite")
	list, err := c.client.ListSessions(ctx, &agentv1.ListSessionsRequest{ParentSession: "p"})
	if err != nil || len(list.GetSessions()) != 1 {
		t.Fatalf("children after the crash: %v, %v", list, err)
	}
	childID := list.GetSessions()[0].GetHeader().GetId()
	var out strings.Builder
	for _, id := range []string{"p", childID} {
		evs := streamAll(t, c.client, id)
		if err := session.CheckLog(evs); err != nil {
			t.Fatalf("%s: invariants after repair: %v", id, err)
		}
		fmt.Fprintf(&out, "== %s\n%s", id, renderSubagent(evs))
	}
	got := strings.ReplaceAll(out.String(), childID, "CHILD")
	goldenSub(t, "crash_mid_delegation", got)
	if !strings.Contains(got, "code="+session.ToolOutcomeUnknownCode) || !strings.Contains(got, "TurnEndReason_Interrupted") {
		t.Fatalf("want the parent's call unknown and the child's turn interrupted:\n%s", got)
	}
	// The parent resumes.
	b.on("carry on", reply("resumed"))
	if _, err := c.client.Send(ctx, &agentv1.SendRequest{SessionId: "p", Content: []*llmv1.ContentBlock{session.Text("carry on")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.client.WaitIdle(ctx, &agentv1.WaitIdleRequest{SessionId: "p"}); err != nil {
		t.Fatal(err)
	}
	if evs := streamAll(t, c.client, "p"); !strings.Contains(renderSubagent(evs), `assistant/message "resumed"`) {
		t.Fatalf("the parent did not resume:\n%s", renderSubagent(evs))
	}
}

// A child is of its parent's tenant, and another tenant can neither see it
// nor find it through the parent filter (the attacker's view).
func TestSubagentTenancy(t *testing.T) {
	var n atomic.Int64
	e := newEnvAuth(t, probeAuth(t), func(c *agent.Config) {
		c.NewID = func() string { return fmt.Sprintf("child-%d", n.Add(1)) }
	})
	b := newBrain(e)
	b.on("delegate", calls(fakes.Call{ID: "c1", Name: "subagent", Args: `{"description":"d","prompt":"tenant work"}`}), reply("done"))
	b.on("tenant work", reply("acme answer"))
	acme, beta := as(t.Context(), "acme"), as(t.Context(), "beta")
	if _, err := e.client.CreateSession(acme, &agentv1.CreateSessionRequest{SessionId: "p",
		Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Send(acme, &agentv1.SendRequest{SessionId: "p", Content: []*llmv1.ContentBlock{session.Text("delegate")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.WaitIdle(acme, &agentv1.WaitIdleRequest{SessionId: "p"}); err != nil {
		t.Fatal(err)
	}
	got, err := e.client.GetSession(acme, &agentv1.GetSessionRequest{SessionId: "child-1"})
	if err != nil || got.GetSession().GetHeader().GetTenant() != "acme" || got.GetSession().GetHeader().GetParentSession() != "p" {
		t.Fatalf("the child as acme sees it: %v, %v", got, err)
	}
	if _, err := e.client.GetSession(beta, &agentv1.GetSessionRequest{SessionId: "child-1"}); status.Code(err) != codes.NotFound {
		t.Fatalf("beta reading acme's child: %v, want NotFound", err)
	}
	list, err := e.client.ListSessions(beta, &agentv1.ListSessionsRequest{ParentSession: "p"})
	if err != nil || len(list.GetSessions()) != 0 {
		t.Fatalf("beta listing acme's children: %v, %v", list, err)
	}
	stream, err := e.client.StreamEvents(beta, &agentv1.StreamEventsRequest{SessionId: "child-1", NoFollow: true})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.NotFound {
		t.Fatalf("beta streaming acme's child: %v, want NotFound", err)
	}
}

// Shutting the agent down disposes a parent's running background child:
// the child's turn is ended by the agent (not left for crash repair).
func TestSubagentDisposeParentDisposesChildren(t *testing.T) {
	e, b := newSubagentEnv(t, func(e *env) { e.shutdown = time.Second })
	b.on("go", calls(fakes.Call{ID: "c1", Name: "subagent", Args: `{"description":"bg","prompt":"forever","run_in_background":true}`}),
		reply("started it"))
	b.on("forever", fakes.Response{Block: true})
	e.create("p")
	e.send("p", "go")
	e.waitIdle("p")
	waitFor(t, func() bool { return len(b.requests("forever")) == 1 })
	e.restart()
	evs := e.events("child-1")
	end := evs[len(evs)-1].GetTurnEnd()
	// Disposed by the child's own retirement or aborted by the parent's
	// (whichever runs first): either way ended by the agent.
	if end == nil || (end.GetReason().GetDisposed() == nil && end.GetReason().GetAborted() == nil) {
		t.Fatalf("the child's last event is %v; want a turn/end written at disposal, not by crash repair", evs[len(evs)-1])
	}
}

// A restricted child cannot widen its tools by delegating without a filter:
// the grandchild inherits the child's filter.
func TestSubagentFilterIsInherited(t *testing.T) {
	e, b := newSubagentEnv(t, nil)
	b.on("go", calls(fakes.Call{ID: "c1", Name: "subagent", Args: `{"description":"d","prompt":"narrow","tools":["echo","subagent"]}`}), reply("done"))
	b.on("narrow", calls(fakes.Call{ID: "c2", Name: "subagent", Args: `{"description":"d2","prompt":"grandchild"}`}), reply("narrow done"))
	b.on("grandchild", calls(fakes.Call{ID: "c3", Name: "ask_user_question", Args: `{"questions":[{"id":"q","question":"?"}]}`}), reply("gc done"))
	e.create("p")
	e.send("p", "go")
	e.waitIdle("p")
	gc := e.waitIdle("child-2").GetHeader()
	if got := gc.GetSubagent().GetTools(); len(got) != 2 || got[0] != "echo" || got[1] != "subagent" {
		t.Fatalf("grandchild filter %v, want the child's [echo subagent]", got)
	}
	for _, r := range b.requests("grandchild") {
		for _, tool := range r.GetTools() {
			if tool.GetName() != "echo" && tool.GetName() != "subagent" {
				t.Fatalf("the grandchild was offered %s", tool.GetName())
			}
		}
	}
	if got := renderSubagent(e.events("child-2")); !strings.Contains(got, "c3 error=true code=UNKNOWN_TOOL") {
		t.Fatalf("the grandchild's call outside the filter ran:\n%s", got)
	}
}

// TestSubagentRefusedRemoteCallEndsItsStream: a child's call to a remote
// tool outside its filter is prepared (the filter's PrepareCalls passes the
// batch on) but never begun: its PrepareExecute stream ends (Release ends it
// with the batch; the turn's end would too), and the host never runs it.
func TestSubagentRefusedRemoteCallEndsItsStream(t *testing.T) {
	e, b := newSubagentEnv(t, nil)
	b.on("go", calls(fakes.Call{ID: "c1", Name: "subagent", Args: `{"description":"d","prompt":"narrow","tools":["subagent"]}`}), reply("done"))
	b.on("narrow", calls(fakes.Call{ID: "k1", Name: "echo", Args: `{}`}), reply("refused"))
	// The child's model request after its batch waits (bounded) until the
	// host holds no stream: the batch's Release ended it, not the end of
	// the child's turn (still open here), which would end it too.
	answer, waited := e.gw.Default, make(chan error, 1)
	e.gw.Default = func(req *llmv1.GenerateRequest) fakes.Response {
		if lastUserText(req) == "narrow" && len(b.requests("narrow")) == 1 {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			waited <- e.host.WaitStreamsEnded(ctx)
			cancel()
		}
		return answer(req)
	}
	e.create("p")
	e.send("p", "go")
	e.waitIdle("p")
	if got := renderSubagent(e.events("child-1")); !strings.Contains(got, "k1 error=true code=UNKNOWN_TOOL") {
		t.Fatalf("the child's call outside the filter:\n%s", got)
	}
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("when the child asked its model after the batch: %v", err)
		}
	default:
		t.Fatal("the child never asked its model after the batch")
	}
	if n := e.host.Counts().PrepareExecute; n != 1 || slices.Contains(e.host.Executed(), "k1") {
		t.Fatalf("%d PrepareExecute streams, executed %v; want the refused call prepared once and never run", n, e.host.Executed())
	}
}

package loop_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"iter"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent/internal/fakes"
	"github.com/dsh-dev/dsh/services/agent/internal/gateway"
	"github.com/dsh-dev/dsh/services/agent/internal/hooks"
	"github.com/dsh-dev/dsh/services/agent/internal/loop"
	"github.com/dsh-dev/dsh/services/agent/internal/prompt"
	"github.com/dsh-dev/dsh/services/agent/internal/toolpipe"
)

var update = flag.Bool("update", false, "rewrite golden files")

var epoch = time.UnixMilli(1_767_225_600_000)

type pipeTools struct{ p *toolpipe.Pipeline }

func (t pipeTools) Schemas(h []string) []*llmv1.ToolSchema { return t.p.Schemas(h) }
func (t pipeTools) PrepareCalls(ctx context.Context, h []string, ex []*toolsv1.ToolExecution) []*toolsv1.PreparedCall {
	return t.p.PrepareCalls(ctx, h, ex)
}
func (t pipeTools) Begin(ctx context.Context, h []string, ex *toolsv1.ToolExecution) loop.ToolCall {
	return t.p.Begin(ctx, h, ex)
}
func (t pipeTools) Release(ex []*toolsv1.ToolExecution) { t.p.Release(ex) }

// harness is one agent wired to a fake gateway and a fake toolhost over
// loopback gRPC, in debug mode, with a durability checkpoint that records
// how much of the log is durable.
type harness struct {
	t       *testing.T
	gw      *fakes.Gateway
	client  *gateway.Client // the gateway client under the checked LLM
	host    *fakes.ToolHost
	hooks   *hooks.Set
	log     *session.Log
	agent   *loop.Agent
	durable atomic.Int64
	flushes atomic.Int64
	// marshalled holds each durable event deterministically marshalled
	// when it became durable (guarded by mu): finish marshals them again,
	// and any difference is an event changed after it was logged (the log
	// shares a logged chunk's blocks with the assistant message).
	marshalled [][]byte

	release chan struct{} // closed by a scenario to let a gate tool finish

	mu         sync.Mutex
	slept      []time.Duration
	violations []string
	errs       []error
}

type option func(*harness, *loop.Config)

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func newHarness(t *testing.T, tools []fakes.Tool, opts ...option) *harness {
	t.Helper()
	return newHarnessFrom(t, nil, tools, opts...)
}

// newHarnessFrom is newHarness over a log seeded with seed (a resumed
// session).
func newHarnessFrom(t *testing.T, seed []*sessionv1.SessionEvent, tools []fakes.Tool, opts ...option) *harness {
	t.Helper()
	h := &harness{t: t, gw: &fakes.Gateway{}, hooks: &hooks.Set{}, release: make(chan struct{})}
	h.host = fakes.NewToolHost(tools...)
	gwAddr := fakes.Serve(t, func(s *grpc.Server) { llmv1.RegisterLlmGatewayServer(s, h.gw) })
	thAddr := fakes.Serve(t, func(s *grpc.Server) { toolsv1.RegisterToolHostServer(s, h.host) })
	pipe := toolpipe.New(toolpipe.Config{Hosts: []toolpipe.Host{{Name: "fake", Client: toolsv1.NewToolHostClient(dial(t, thAddr))}}})
	if err := pipe.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pipe.Close)
	hdr := &sessionv1.SessionHeader{Id: "s1", CreatedAt: epoch.UnixMilli(), Cwd: "/work",
		Options: &sessionv1.SessionOptions{Provider: "fake", Model: "m1"}}
	log, err := session.NewLog(hdr, seed, session.WithClock(func() time.Time { return epoch }), session.WithTurnChecks())
	if err != nil {
		t.Fatal(err)
	}
	h.log = log
	h.client = gateway.New(dial(t, gwAddr))
	cfg := loop.Config{
		LLM:    &checkedLLM{h: h, inner: h.client},
		Tools:  pipeTools{pipe},
		Hooks:  h.hooks,
		Prompt: mustPrompt(t, prompt.Config{}),
		Flush: func(context.Context) error {
			h.flushes.Add(1)
			evs := log.Events()
			h.recordDurable(evs)
			h.durable.Store(int64(len(evs)))
			return nil
		},
		Debug:   true,
		OnError: func(_, _ int32, err error) { h.mu.Lock(); h.errs = append(h.errs, err); h.mu.Unlock() },
	}
	for _, o := range opts {
		o(h, &cfg)
	}
	h.agent = loop.New(cfg, log)
	h.agent.Start(t.Context(), "startup")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := h.agent.Dispose(ctx); err != nil {
			t.Errorf("dispose: %v", err)
		}
	})
	return h
}

// recordDurable marshals the events of evs not yet recorded (they are
// durable now).
func (h *harness) recordDurable(evs []*sessionv1.SessionEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ev := range evs[min(len(h.marshalled), len(evs)):] {
		b, err := deterministic.Marshal(ev)
		if err != nil {
			h.violations = append(h.violations, fmt.Sprintf("marshal %s: %v", session.TypeName(ev), err))
		}
		h.marshalled = append(h.marshalled, b)
	}
}

var deterministic = proto.MarshalOptions{Deterministic: true}

func (h *harness) violate(s string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.violations = append(h.violations, s)
}

// checkedLLM asserts that everything logged before a request is durable
// when the request is dispatched.
type checkedLLM struct {
	h     *harness
	inner loop.BatchLLM
}

func (c *checkedLLM) Generate(ctx context.Context, req *llmv1.GenerateRequest) iter.Seq2[*llmv1.StreamChunk, error] {
	c.checkDurable()
	return c.inner.Generate(ctx, req)
}

// GenerateBatches keeps the loop on the path it takes with the real
// gateway client (loop.BatchLLM: one event per response).
func (c *checkedLLM) GenerateBatches(ctx context.Context, req *llmv1.GenerateRequest) iter.Seq2[[]*llmv1.StreamChunk, error] {
	c.checkDurable()
	return c.inner.GenerateBatches(ctx, req)
}

func (c *checkedLLM) checkDurable() {
	if d, n := c.h.durable.Load(), c.h.log.Len(); d < n {
		c.h.violate("model request dispatched before the log was durable")
	}
	// No batch runs while the model is asked: every PrepareExecute stream
	// of the last batch has ended, whichever way its call ended (while the
	// turn, whose end would close them all, is still open).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.h.host.WaitStreamsEnded(ctx); err != nil {
		c.h.violate("model request while the last batch left a stream open: " + err.Error())
	}
}

// requireCallDurable is called by tool bodies: their tool/call must be
// durable before they run.
func (h *harness) requireCallDurable(callID string) {
	for _, ev := range h.log.Events() {
		if tc := ev.GetToolCall(); tc != nil && tc.GetCallId() == callID && ev.GetSeq() >= h.durable.Load() {
			h.violate("tool body " + callID + " ran before its tool/call was durable")
		}
	}
}

func (h *harness) send(text string) {
	h.t.Helper()
	if _, err := h.agent.Send(loop.Item{Content: []*llmv1.ContentBlock{session.Text(text)}}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) waitIdle() {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), 20*time.Second)
	defer cancel()
	if err := h.agent.WaitIdle(ctx); err != nil {
		h.t.Fatalf("wait idle: %v\n%s", err, render(h.log.Events()))
	}
}

// waitFor polls until cond holds over the log.
func (h *harness) waitFor(what string, cond func([]*sessionv1.SessionEvent) bool) {
	h.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond(h.log.Events()) {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting for %s\n%s", what, render(h.log.Events()))
		}
		time.Sleep(time.Millisecond)
	}
}

func hasType(typ string, n int) func([]*sessionv1.SessionEvent) bool {
	return func(evs []*sessionv1.SessionEvent) bool {
		c := 0
		for _, ev := range evs {
			if session.TypeName(ev) == typ {
				c++
			}
		}
		return c >= n
	}
}

func hasToolCall(id string) func([]*sessionv1.SessionEvent) bool {
	return func(evs []*sessionv1.SessionEvent) bool {
		for _, ev := range evs {
			if ev.GetToolCall().GetCallId() == id {
				return true
			}
		}
		return false
	}
}

// finish checks the invariants every scenario shares and compares the log
// with the golden file.
func (h *harness) finish(name string) {
	h.t.Helper()
	events := h.log.Events()
	if err := session.CheckLog(events); err != nil {
		h.t.Errorf("invariants: %v", err)
	}
	if _, open := h.log.OpenTurn(); open {
		h.t.Errorf("a turn is still open")
	}
	if h.durable.Load() != h.log.Len() {
		h.t.Errorf("durable %d of %d events after the last turn/end", h.durable.Load(), h.log.Len())
	}
	h.mu.Lock()
	for i, was := range h.marshalled[:min(len(h.marshalled), len(events))] {
		if now, err := deterministic.Marshal(events[i]); err != nil || !bytes.Equal(now, was) {
			h.t.Errorf("event %d (%s) changed after it was durable (%v):\nnow %v", i, session.TypeName(events[i]), err, events[i])
		}
	}
	for _, v := range h.violations {
		h.t.Errorf("durability: %s", v)
	}
	for _, e := range h.errs {
		var inv *loop.InvariantFailure
		if errors.As(e, &inv) {
			h.t.Errorf("debug check: %v", e)
		}
	}
	h.mu.Unlock()
	got := render(events)
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			h.t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		h.t.Fatalf("read golden (run with -update): %v", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		h.t.Errorf("%s mismatch (-want +got):\n%s", path, diff)
	}
}

func text(s string) *llmv1.ContentBlock { return session.Text(s) }

func okResult(s string) *toolsv1.ToolExecutionResult {
	return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{text(s)}}
}

// echo is a tool that checks durability and echoes its args; its host
// prepares a call view.
func echo(h **harness, name string, parallel bool) fakes.Tool {
	return fakes.Tool{Name: name, Parallel: parallel, Run: func(_ context.Context, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
		(*h).requireCallDurable(ex.GetCallId())
		return okResult(name + " " + ex.GetArguments())
	}, View: func(ex *toolsv1.ToolExecution) *toolsv1.ToolCallView {
		return &toolsv1.ToolCallView{Card: &toolsv1.ToolCallView_Generic{Generic: &toolsv1.GenericCallView{Title: name, RawInput: ex.GetArguments()}}}
	}}
}

func TestLoopScenarios(t *testing.T) {
	t.Parallel()
	type scenario struct {
		name  string
		tools func(h **harness) []fakes.Tool
		opts  []option
		run   func(t *testing.T, h *harness)
	}
	noTools := func(**harness) []fakes.Tool { return nil }
	scenarios := []scenario{
		{
			name:  "plain_answer",
			tools: noTools,
			run: func(t *testing.T, h *harness) {
				h.gw.Script(fakes.Response{Chunks: fakes.Text("Hello there.")})
				h.send("hi")
				h.waitIdle()
				reqs := h.gw.Requests()
				if len(reqs) != 1 || len(reqs[0].GetMessages()) != 1 || reqs[0].GetSessionId() != "s1" {
					t.Errorf("requests = %v", reqs)
				}
			},
		},
		{
			name:  "multi_step_tools",
			tools: func(h **harness) []fakes.Tool { return []fakes.Tool{echo(h, "echo", false)} },
			run: func(t *testing.T, h *harness) {
				h.gw.Script(
					fakes.Response{Chunks: fakes.ToolCalls("Let me check.", fakes.Call{ID: "c1", Name: "echo", Args: `{"x":1}`})},
					fakes.Response{Chunks: fakes.ToolCalls("", fakes.Call{ID: "c2", Name: "echo", Args: `{"x":2}`},
						fakes.Call{ID: "c3", Name: "nosuch", Args: `{}`})},
					fakes.Response{Chunks: fakes.Text("Done.")},
				)
				h.send("do it")
				h.waitIdle()
				reqs := h.gw.Requests()
				if len(reqs) != 3 || len(reqs[2].GetMessages()) != 6 {
					t.Errorf("want 3 requests, the last with 6 messages; got %d", len(reqs))
				}
				checkSharedBlocks(t, h.log.Events())
			},
		},
		{
			name: "parallel_and_exclusive",
			tools: func(h **harness) []fakes.Tool {
				var mu sync.Mutex
				running := 0
				both := make(chan struct{})
				read := fakes.Tool{Name: "read", Parallel: true, Run: func(ctx context.Context, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
					(*h).requireCallDurable(ex.GetCallId())
					mu.Lock()
					running++
					if running == 2 {
						close(both)
					}
					mu.Unlock()
					if ex.GetCallId() == "p1" || ex.GetCallId() == "p2" {
						select { // p1 and p2 must overlap
						case <-both:
						case <-time.After(10 * time.Second):
							return &toolsv1.ToolExecutionResult{IsError: true, Content: []*llmv1.ContentBlock{text("Error: no overlap")}}
						}
					}
					mu.Lock()
					running--
					mu.Unlock()
					return okResult("read " + ex.GetArguments())
				}}
				return []fakes.Tool{read, echo(h, "write", false)}
			},
			run: func(t *testing.T, h *harness) {
				h.gw.Script(
					fakes.Response{Chunks: fakes.ToolCalls("", fakes.Call{ID: "p1", Name: "read", Args: `{"f":"a"}`},
						fakes.Call{ID: "p2", Name: "read", Args: `{"f":"b"}`}, fakes.Call{ID: "x1", Name: "write", Args: `{"f":"c"}`},
						fakes.Call{ID: "p3", Name: "read", Args: `{"f":"c"}`})},
					fakes.Response{Chunks: fakes.Text("All read.")},
				)
				h.send("read and write")
				h.waitIdle()
			},
		},
		{
			name: "steering_mid_turn",
			tools: func(h **harness) []fakes.Tool {
				return []fakes.Tool{{Name: "gate", Run: func(ctx context.Context, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
					select {
					case <-(*h).release:
					case <-ctx.Done():
						return nil
					}
					return okResult("opened")
				}}}
			},
			run: func(t *testing.T, h *harness) {
				h.gw.Script(
					fakes.Response{Chunks: fakes.ToolCalls("", fakes.Call{ID: "g1", Name: "gate", Args: `{}`})},
					fakes.Response{Chunks: fakes.Text("Done, and also the extra thing.")},
				)
				h.send("open the gate")
				h.waitFor("tool/call g1", hasToolCall("g1"))
				if _, err := h.agent.Steer(loop.Item{Content: []*llmv1.ContentBlock{text("also do the extra thing")}}); err != nil {
					t.Fatal(err)
				}
				close(h.release)
				h.waitIdle()
				reqs := h.gw.Requests()
				last := reqs[len(reqs)-1].GetMessages()
				if got := last[len(last)-1].GetContent()[0].GetText().GetText(); got != "also do the extra thing" {
					t.Errorf("last message of the second request = %q, want the steering", got)
				}
			},
		},
		{
			name:  "inject_idle",
			tools: noTools,
			run: func(t *testing.T, h *harness) {
				if err := h.agent.Inject([]*llmv1.ContentBlock{text("<system-reminder>file a.go changed</system-reminder>")}, session.PluginSource("watcher"), nil); err != nil {
					t.Fatal(err)
				}
				h.gw.Script(fakes.Response{Chunks: fakes.Text("Noted.")})
				h.send("what changed?")
				h.waitIdle()
				if n := len(h.gw.Requests()[0].GetMessages()); n != 2 {
					t.Errorf("request has %d messages, want the context and the prompt", n)
				}
			},
		},
		{
			name: "inject_during_batch",
			tools: func(h **harness) []fakes.Tool {
				return []fakes.Tool{{Name: "gate", Run: func(ctx context.Context, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
					select {
					case <-(*h).release:
					case <-ctx.Done():
						return nil
					}
					return okResult("opened")
				}}}
			},
			run: func(t *testing.T, h *harness) {
				h.gw.Script(
					fakes.Response{Chunks: fakes.ToolCalls("", fakes.Call{ID: "g1", Name: "gate", Args: `{}`})},
					fakes.Response{Chunks: fakes.Text("Saw the notice.")},
				)
				h.send("open the gate")
				h.waitFor("tool/call g1", hasToolCall("g1"))
				if err := h.agent.Inject([]*llmv1.ContentBlock{text("notice: build finished")}, session.PluginSource("ci"), nil); err != nil {
					t.Fatal(err)
				}
				close(h.release)
				h.waitIdle()
			},
		},
		{
			name:  "cancel_before_first_step",
			tools: noTools,
			opts: []option{func(h *harness, _ *loop.Config) {
				h.hooks.PreStep.Use(func(context.Context, *hooks.Step) ([]*toolsv1.HookContext, error) {
					h.agent.Cancel(nil)
					return nil, nil
				})
			}},
			run: func(t *testing.T, h *harness) {
				h.send("never answered")
				h.waitIdle()
				if n := len(h.gw.Requests()); n != 0 {
					t.Errorf("%d model requests after a cancel before the first step", n)
				}
			},
		},
		{
			name:  "cancel_during_streaming",
			tools: noTools,
			run: func(t *testing.T, h *harness) {
				h.gw.Script(fakes.Response{Chunks: fakes.TextBlock(0, "partial")[:2], Block: true})
				h.send("write a long essay")
				h.waitFor("two chunks", hasType(session.TypeAssistantChunk, 2))
				if !h.agent.Cancel(nil) {
					t.Error("cancel was not effective")
				}
				h.waitIdle()
			},
		},
		{
			name: "cancel_during_batch",
			tools: func(h **harness) []fakes.Tool {
				return []fakes.Tool{{Name: "slow", Run: func(ctx context.Context, ex *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
					<-ctx.Done()
					return nil
				}}, echo(h, "echo", false)}
			},
			run: func(t *testing.T, h *harness) {
				h.gw.Script(fakes.Response{Chunks: fakes.ToolCalls("", fakes.Call{ID: "s1", Name: "slow", Args: `{}`},
					fakes.Call{ID: "e1", Name: "echo", Args: `{}`}, fakes.Call{ID: "e2", Name: "echo", Args: `{}`})})
				h.send("run slow things")
				h.waitFor("tool/call s1", hasToolCall("s1"))
				h.waitFor("s1 body started", func([]*sessionv1.SessionEvent) bool { return len(h.host.Executed()) == 1 })
				h.agent.Cancel(nil)
				h.waitIdle()
				if got := h.host.Executed(); len(got) != 1 {
					t.Errorf("executed %v; unstarted calls must not run", got)
				}
			},
		},
		{
			name:  "request_error_retried",
			tools: noTools,
			opts:  []option{withRetry},
			run: func(t *testing.T, h *harness) {
				h.gw.Script(
					fakes.Response{Chunks: fakes.Failure("RATE_LIMIT", "slow down", 0)},
					fakes.Response{Err: fakes.Unavailable},
					fakes.Response{Chunks: fakes.Text("Third time lucky.")},
				)
				h.send("hello")
				h.waitIdle()
				if got := h.sleeps(); !cmp.Equal(got, []time.Duration{500 * time.Millisecond, time.Second}) {
					t.Errorf("retry waits = %v", got)
				}
			},
		},
		{
			name:  "retries_exhausted",
			tools: noTools,
			opts:  []option{withRetry},
			run: func(t *testing.T, h *harness) {
				h.gw.Script(
					fakes.Response{Chunks: fakes.Failure("SERVER", "upstream 503", 1200)},
					fakes.Response{Chunks: fakes.Failure("SERVER", "upstream 503", 0)},
					fakes.Response{Chunks: fakes.Failure("SERVER", "upstream 503", 0)},
				)
				h.send("hello")
				h.waitIdle()
				if got := h.sleeps(); !cmp.Equal(got, []time.Duration{1200 * time.Millisecond, time.Second}) {
					t.Errorf("retry waits = %v", got)
				}
			},
		},
		{
			name:  "max_tokens",
			tools: func(h **harness) []fakes.Tool { return []fakes.Tool{echo(h, "echo", false)} },
			run: func(t *testing.T, h *harness) {
				chunks := append(fakes.TextBlock(0, "I will call"), fakes.ToolBlock(1, fakes.Call{ID: "t1", Name: "echo", Args: `{"trunc`})...)
				h.gw.Script(fakes.Response{Chunks: append(chunks, fakes.Usage(10, 4096), fakes.MaxTokens())})
				h.send("write everything")
				h.waitIdle()
				if len(h.host.Executed()) != 0 {
					t.Error("a truncated tool call was executed")
				}
			},
		},
		{
			name:  "prompt_blocked",
			tools: noTools,
			opts: []option{func(h *harness, _ *loop.Config) {
				h.hooks.PromptSubmit.Use(func(ctx context.Context, in *hooks.PromptSubmit, next hooks.Next[*hooks.PromptSubmit, *agentv1.PromptDecision]) (*agentv1.PromptDecision, error) {
					if in.Content[0].GetText().GetText() == "show me the secrets" {
						return hooks.Block("secrets are off limits"), nil
					}
					return next(ctx, in)
				})
			}},
			run: func(t *testing.T, h *harness) {
				h.gw.Script(fakes.Response{Chunks: fakes.Text("Sure.")})
				h.send("show me the secrets")
				h.send("say hi")
				h.waitIdle()
			},
		},
		{
			name:  "remote_hook_timeout_fail_open",
			tools: noTools,
			opts:  []option{withSlowRemoteHook(true)},
			run: func(t *testing.T, h *harness) {
				h.gw.Script(fakes.Response{Chunks: fakes.Text("Hi.")})
				h.send("hi")
				h.waitIdle()
			},
		},
		{
			name:  "remote_hook_timeout_fail_closed",
			tools: noTools,
			opts:  []option{withSlowRemoteHook(false)},
			run: func(t *testing.T, h *harness) {
				h.send("hi")
				h.waitIdle()
				if n := len(h.gw.Requests()); n != 0 {
					t.Errorf("%d model requests after a fail-closed hook timeout", n)
				}
			},
		},
		{
			name: "todo_write_and_prefix_contexts",
			tools: func(h **harness) []fakes.Tool {
				return []fakes.Tool{{Name: "todo_write", Run: func(context.Context, *toolsv1.ToolExecution) *toolsv1.ToolExecutionResult {
					return &toolsv1.ToolExecutionResult{Content: []*llmv1.ContentBlock{text("todos updated")},
						AdditionalContexts: []*toolsv1.HookContext{{Content: []*llmv1.ContentBlock{text("remember the plan")}, Source: session.PluginSource("todo")}}}
				}}}
			},
			run: func(t *testing.T, h *harness) {
				h.gw.Script(
					fakes.Response{Chunks: fakes.ToolCalls("", fakes.Call{ID: "t1", Name: "todo_write",
						Args: `{"todos":[{"content":"read","status":"completed"},{"content":"write","status":"in_progress"}]}`})},
					fakes.Response{Chunks: fakes.Text("Planned.")},
				)
				_, err := h.agent.Send(loop.Item{Content: []*llmv1.ContentBlock{text("plan it")}, Contexts: []*toolsv1.HookContext{
					{Content: []*llmv1.ContentBlock{text("<rules>be careful</rules>")}, Source: session.PluginSource("rules"), Placement: toolsv1.ContextPlacement_CONTEXT_PLACEMENT_PROMPT_PREFIX},
					{Content: []*llmv1.ContentBlock{text("open files: a.go")}, Source: session.PluginSource("ide")},
				}})
				if err != nil {
					t.Fatal(err)
				}
				h.waitIdle()
			},
		},
		{
			name:  "continuation_and_terminal_stop",
			tools: noTools,
			opts: []option{func(h *harness, _ *loop.Config) {
				h.hooks.TurnContinuation.Use(func(ctx context.Context, in *hooks.Continuation, next hooks.Next[*hooks.Continuation, *agentv1.ContinuationDecision]) (*agentv1.ContinuationDecision, error) {
					d, err := next(ctx, in)
					if d.GetStop() != nil && h.log.Len() < 20 { // continue once with a nudge
						return &agentv1.ContinuationDecision{Action: &agentv1.ContinuationDecision_Continue{Continue: &agentv1.ContinueTurn{
							Reason: &agentv1.ContinueReason{Content: []*llmv1.ContentBlock{text("keep going")}, Source: session.PluginSource("goal")}}}}, nil
					}
					return d, err
				})
				h.hooks.TurnStop.Use(func(ctx context.Context, in *hooks.TurnStop) (bool, error) {
					if h.log.Len() >= 20 {
						h.agent.Steer(loop.Item{Content: []*llmv1.ContentBlock{text("discarded by the terminal stop")}})
						return true, nil
					}
					return false, nil
				})
			}},
			run: func(t *testing.T, h *harness) {
				h.gw.Script(fakes.Response{Chunks: fakes.Text("one")}, fakes.Response{Chunks: fakes.Text("two")})
				h.send("work")
				h.waitIdle()
			},
		},
	}
	// Every scenario runs twice: with a host that serves PrepareExecute (a
	// batch of one call is prepared and executed on one stream) and with
	// one that refuses it (PrepareCalls and Execute). Both match the golden
	// log, and their logs are byte for byte the same (deterministically
	// marshalled events): the log does not tell the paths apart.
	// The comparison means something only when the first run used the
	// stream: a scenario with a one-call remote batch (its refusing host
	// was asked PrepareExecute) must have used it, and some scenario must.
	var streamed atomic.Int32
	t.Cleanup(func() {
		if streamed.Load() == 0 {
			t.Error("no scenario ran a call on a PrepareExecute stream")
		}
	})
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			var logs [2][][]byte
			var asked [2]int // PrepareExecute calls answered
			for i, refuse := range []bool{false, true} {
				var hp *harness
				opts := sc.opts
				if refuse {
					opts = append([]option{func(h *harness, _ *loop.Config) { h.host.RefusePrepareExecute() }}, opts...)
				}
				h := newHarness(t, sc.tools(&hp), opts...)
				hp = h
				sc.run(t, h)
				h.finish(sc.name)
				// No call leaves its PrepareExecute stream open, whichever
				// way it ended.
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				if err := h.host.WaitStreamsEnded(ctx); err != nil {
					t.Error(err)
				}
				cancel()
				for _, ev := range h.log.Events() {
					b, err := deterministic.Marshal(ev)
					if err != nil {
						t.Fatal(err)
					}
					logs[i] = append(logs[i], b)
				}
				asked[i] = h.host.Counts().PrepareExecute
				if n := asked[i]; refuse && n > 1 {
					t.Errorf("%d PrepareExecute calls to a host that refused the first", n)
				}
			}
			if asked[1] > 0 && asked[0] == 0 {
				t.Errorf("a one-call remote batch (the refusing host was asked PrepareExecute) ran without a PrepareExecute stream")
			}
			if asked[0] > 0 {
				streamed.Add(1)
			}
			if !slices.EqualFunc(logs[0], logs[1], bytes.Equal) {
				t.Errorf("the log through PrepareExecute differs from the log through PrepareCalls and Execute")
			}
		})
	}
}

// withRetry installs the default retry policy with a recorded, instant sleep
// and no jitter.
func withRetry(h *harness, _ *loop.Config) {
	p := hooks.DefaultRetryPolicy()
	p.Rand = func() float64 { return 0.5 }
	p.Sleep = func(_ context.Context, d time.Duration) error {
		h.mu.Lock()
		h.slept = append(h.slept, d)
		h.mu.Unlock()
		return nil
	}
	h.hooks.RequestError.Use(p.Link())
}

func (h *harness) sleeps() []time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]time.Duration(nil), h.slept...)
}

// slowHooks is a remote AgentHooks whose prompt-submit never answers in time.
type slowHooks struct {
	agentv1.UnimplementedAgentHooksServer
}

func (slowHooks) PromptSubmit(ctx context.Context, _ *agentv1.PromptSubmitRequest) (*agentv1.PromptSubmitResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func withSlowRemoteHook(failOpen bool) option {
	return func(h *harness, _ *loop.Config) {
		addr := fakes.Serve(h.t, func(s *grpc.Server) { agentv1.RegisterAgentHooksServer(s, slowHooks{}) })
		(&hooks.Remote{Name: "policy", Client: agentv1.NewAgentHooksClient(dial(h.t, addr)), Timeout: 50 * time.Millisecond, FailOpen: failOpen}).Install(h.hooks)
	}
}

func mustPrompt(t testing.TB, cfg prompt.Config) *prompt.Assembler {
	t.Helper()
	p, err := prompt.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// checkSharedBlocks asserts that each block of a tool step's assistant
// message is the very block of its block-end chunk in the logged chunk
// events (llmstream.Assembler.Shared, no hook: the log keeps one copy).
func checkSharedBlocks(t *testing.T, events []*sessionv1.SessionEvent) {
	t.Helper()
	bySeq := map[int64]*sessionv1.SessionEvent{}
	for _, ev := range events {
		bySeq[ev.GetSeq()] = ev
	}
	checked := 0
	for _, ev := range events {
		m := ev.GetAssistantMessage()
		if m == nil || len(m.GetContent()) == 0 || m.GetContent()[len(m.GetContent())-1].GetToolCall() == nil {
			continue
		}
		ends := map[uint32]*llmv1.ContentBlock{}
		for _, seq := range ev.GetSourceEventSeqs().GetSeqs() {
			c := bySeq[seq].GetAssistantChunk()
			for _, ch := range append([]*llmv1.StreamChunk{c.GetChunk()}, c.GetChunks()...) {
				if e := ch.GetBlockEnd(); e != nil {
					ends[e.GetIndex()] = e.GetBlock()
				}
			}
		}
		for i, b := range m.GetContent() {
			if ends[uint32(i)] != b {
				t.Errorf("assistant/message %d: block %d is not its logged block-end's block (a copy)", ev.GetSeq(), i)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Error("no tool step's assistant/message found")
	}
}

// answering is a Tools wrapper that answers calls to one tool itself (as
// the subagent tool filter answers a call outside it): Begin never reaches
// the pipeline that prepared the call.
type answering struct {
	loop.Tools
	tool string
}

func (a answering) Begin(ctx context.Context, h []string, ex *toolsv1.ToolExecution) loop.ToolCall {
	if ex.GetName() == a.tool {
		return answered{}
	}
	return a.Tools.Begin(ctx, h, ex)
}

type answered struct{}

func (answered) Dispatch(context.Context, func(context.Context) error) {}
func (answered) Finish(context.Context) *toolsv1.ToolExecutionResult {
	return toolpipe.ErrorResult("answered by the wrapper", "", "")
}

// TestUnbegunCallReleasesItsStream: a one-call batch whose call the Tools
// wrapper answers itself ends its prepared PrepareExecute stream when the
// batch ends, while the turn goes on (checkedLLM waits for that before the
// next model request), and the host never runs the call.
func TestUnbegunCallReleasesItsStream(t *testing.T) {
	t.Parallel()
	var hp *harness
	h := newHarness(t, []fakes.Tool{echo(&hp, "echo", false)}, func(_ *harness, cfg *loop.Config) {
		cfg.Tools = answering{Tools: cfg.Tools, tool: "echo"}
	})
	hp = h
	h.gw.Script(fakes.Response{Chunks: fakes.ToolCalls("", fakes.Call{ID: "c1", Name: "echo", Args: `{}`})},
		fakes.Response{Chunks: fakes.Text("done")})
	h.send("go")
	h.waitIdle()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, v := range h.violations {
		t.Error(v)
	}
	if n := h.host.Counts(); n.PrepareExecute != 1 || len(h.host.Executed()) != 0 {
		t.Errorf("host answered %+v and ran %v; want the call prepared on a stream and never run", n, h.host.Executed())
	}
}

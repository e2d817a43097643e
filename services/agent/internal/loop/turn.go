package loop

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	toolsv1 "github.com/dsh-dev/dsh/gen/go/dsh/tools/v1"
	"github.com/dsh-dev/dsh/internal/llmstream"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/internal/telemetry"
	"github.com/dsh-dev/dsh/services/agent/internal/hooks"
	"github.com/dsh-dev/dsh/services/agent/internal/prompt"
)

// turnState is what runTurn's body leaves for the close path.
type turnState struct {
	step      int32 // current step number (0 before the first)
	stepOpen  bool
	maxTokens bool
	rejected  *string
	failure   *llmv1.LlmFailure // final model-request failure
	terminal  bool
}

// requestFailed carries a final model-request failure out of the body.
type requestFailed struct{ failure *llmv1.LlmFailure }

func (e *requestFailed) Error() string { return e.failure.GetCode() + ": " + e.failure.GetMessage() }

// checkpoint returns errCancelled once the turn is cancelled.
func checkpoint(ctx context.Context) error {
	if ctx.Err() != nil {
		return errCancelled
	}
	return nil
}

// runTurn runs one claimed send after its turn/start, closes the turn and
// flushes. It reports whether agent/turn-stop made the turn terminal.
func (a *Agent) runTurn(ctx context.Context, cancel context.CancelCauseFunc, turn int32, item Item) bool {
	ctx, span := telemetry.StartTurn(ctx, a.ID(), turn, item.QueuedBy)
	st := &turnState{}
	err := a.turnBody(ctx, turn, item, st)

	// Retire the turn's cancellation authority, then classify and close.
	a.mu.Lock()
	a.turnCancel = nil
	a.mu.Unlock()
	var reason *sessionv1.TurnEndReason
	switch {
	case ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrDisposed):
		reason = &sessionv1.TurnEndReason{Kind: &sessionv1.TurnEndReason_Disposed{Disposed: &sessionv1.EndDisposed{}}}
	case ctx.Err() != nil:
		reason = &sessionv1.TurnEndReason{Kind: &sessionv1.TurnEndReason_Aborted{Aborted: &sessionv1.EndAborted{}}}
	case err != nil:
		reason = a.failTurn(turn, st, err)
	case st.rejected != nil:
		reason = &sessionv1.TurnEndReason{Kind: &sessionv1.TurnEndReason_Rejected{Rejected: &sessionv1.EndRejected{Reason: *st.rejected}}}
	case st.maxTokens:
		reason = &sessionv1.TurnEndReason{Kind: &sessionv1.TurnEndReason_MaxTokens{MaxTokens: &sessionv1.EndMaxTokens{}}}
	default:
		reason = completedReason()
	}
	cancel(nil)
	endTurnSpan(span, reason)
	if st.stepOpen {
		if _, aerr := a.appendOwned(session.StepEndEvent(turn, st.step)); aerr != nil {
			a.reportError(turn, st.step, aerr)
		}
	}
	if _, aerr := a.append(session.TurnEndEvent(turn, reason)); aerr != nil {
		a.reportError(turn, st.step, aerr)
	}
	if ferr := a.flush(ctx); ferr != nil {
		a.reportError(turn, st.step, fmt.Errorf("flush after turn/end: %w", ferr))
	}
	return st.terminal
}

func endTurnSpan(span trace.Span, r *sessionv1.TurnEndReason) {
	name, msg := "completed", ""
	switch k := r.GetKind().(type) {
	case *sessionv1.TurnEndReason_Aborted:
		name = "aborted"
	case *sessionv1.TurnEndReason_Disposed:
		name = "disposed"
	case *sessionv1.TurnEndReason_MaxTokens:
		name = "max-tokens"
	case *sessionv1.TurnEndReason_Rejected:
		name, msg = "rejected", k.Rejected.GetReason()
	case *sessionv1.TurnEndReason_Error:
		name, msg = "error", k.Error.GetMessage()
		if f := k.Error.GetFailure(); f != nil {
			msg = f.GetCode() + ": " + f.GetMessage()
		}
	}
	telemetry.EndTurn(span, name, msg)
}

// failTurn builds the error reason and reports the failure once.
func (a *Agent) failTurn(turn int32, st *turnState, err error) *sessionv1.TurnEndReason {
	a.reportError(turn, st.step, err)
	e := &sessionv1.EndError{Step: st.step}
	var rf *requestFailed
	if errors.As(err, &rf) {
		e.Failure = rf.failure
	} else {
		e.Message = err.Error()
		var coded interface{ Code() string }
		if errors.As(err, &coded) {
			e.Code = coded.Code()
		}
	}
	return &sessionv1.TurnEndReason{Kind: &sessionv1.TurnEndReason_Error{Error: e}}
}

// turnBody is semantics.md §4.6 between turn/start and the close.
func (a *Agent) turnBody(ctx context.Context, turn int32, item Item, st *turnState) error {
	if err := checkpoint(ctx); err != nil {
		return err
	}
	src := sourceOr(item.Source, "")
	dec, err := a.hk.PromptSubmit.Run(ctx,
		&hooks.PromptSubmit{Subject: a.subj, Turn: turn, Content: item.Content, Source: src, Contexts: item.Contexts},
		func(_ context.Context, in *hooks.PromptSubmit) (*agentv1.PromptDecision, error) {
			return hooks.Allow(in.Contexts), nil
		})
	if err != nil {
		return fmt.Errorf("agent/prompt-submit: %w", err)
	}
	if err := checkpoint(ctx); err != nil {
		return err
	}
	if b := dec.GetBlock(); b != nil {
		ev := &sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_PromptBlocked{PromptBlocked: &sessionv1.PromptBlocked{
			Content: item.Content, Source: src, Reason: b.GetReason()}}}
		if _, err := a.append(ev); err != nil {
			return err
		}
		reason := b.GetReason()
		st.rejected = &reason
		return nil
	}
	content := item.Content
	if al := dec.GetAllow(); al.GetReplaceContent() {
		content = al.GetContent()
	}
	baked, envelope, separate := bakePrefix(content, dec.GetAllow().GetAdditionalContexts())
	um := session.UserMessageEvent(baked, src)
	um.GetUserMessage().Envelope = envelope
	if _, err := a.append(um); err != nil {
		return err
	}
	if err := a.appendContexts(separate, "prompt-submit"); err != nil {
		return err
	}

	if err := a.refreshWorkspace(ctx); err != nil {
		return err
	}
	sections, err := a.hk.PromptSections.Run(ctx, &hooks.PromptSections{Subject: a.subj, Turn: turn},
		func(context.Context, *hooks.PromptSections) ([]prompt.Section, error) { return nil, nil })
	if err != nil {
		return fmt.Errorf("agent/prompt-sections: %w", err)
	}
	a.sections = sections

	var prior []*llmv1.LlmFailure
	overflowRetries := 0
	var stepSpan trace.Span
	endStep := func() {
		if stepSpan != nil {
			stepSpan.End()
			stepSpan = nil
		}
	}
	defer endStep()
	for step := int32(1); ; step++ {
		endStep()
		if _, err := a.drainSteering(turn); err != nil {
			return err
		}
		system, tools, defaultPrefix, err := a.assemble()
		if err != nil {
			return err
		}
		if err := checkpoint(ctx); err != nil {
			return err
		}
		if !a.prefixSet {
			prefix, err := a.hk.SessionPrefix.Run(ctx, &hooks.SessionPrefix{Subject: a.subj, Prefix: defaultPrefix},
				func(_ context.Context, in *hooks.SessionPrefix) ([]*llmv1.Message, error) { return in.Prefix, nil })
			if err != nil {
				return fmt.Errorf("agent/session-prefix: %w", err)
			}
			if err := checkpoint(ctx); err != nil {
				return err
			}
			a.prefix, a.prefixSet = session.CloneAll(prefix), true
		}
		cs, err := a.hk.PreStep.Run(ctx, &hooks.Step{Subject: a.subj, Turn: turn, Step: step})
		if err != nil {
			return fmt.Errorf("agent/pre-step: %w", err)
		}
		if err := a.appendContexts(cs, "pre-step"); err != nil {
			return err
		}
		if err := checkpoint(ctx); err != nil {
			return err
		}
		// The boundary snapshot and step/start are one atomic step with
		// respect to concurrent injections, so the request equation holds.
		a.mu.Lock()
		boundary := a.log.Messages()
		_, err = a.appendLockedHow(session.StepStartEvent(turn, step), a.log.AppendOwned)
		a.mu.Unlock()
		if err != nil {
			return err
		}
		st.step, st.stepOpen = step, true
		var sctx context.Context
		sctx, stepSpan = telemetry.StartStep(ctx, a.ID(), turn, step)
		if err := checkpoint(ctx); err != nil {
			return err
		}
		out, err := a.runStep(sctx, turn, step, boundary, system, tools)
		if err != nil {
			failure, isRequest := AsRequestFailure(err)
			if !isRequest {
				return err
			}
			if _, err := a.appendOwned(session.StepEndEvent(turn, step)); err != nil {
				return err
			}
			st.stepOpen = false
			if err := checkpoint(ctx); err != nil {
				return err
			}
			if failure.GetCode() == codeContextWindowExceeded {
				retry, err := a.recoverOverflow(ctx, turn, step, &overflowRetries)
				if err != nil {
					return err
				}
				if retry {
					continue
				}
			}
			d, herr := a.hk.RequestError.Run(ctx, &hooks.RequestError{
				Subject: a.subj, Turn: turn, Step: step, Err: err, Failure: failure, PriorFailures: prior,
				Append: func(ev *sessionv1.SessionEvent) error { _, err := a.append(ev); return err },
			}, func(context.Context, *hooks.RequestError) (*agentv1.RequestErrorDecision, error) {
				return hooks.Fail(), nil
			})
			if herr != nil && ctx.Err() == nil {
				a.lg.Warn("agent/request-error listener failed; failing the request", "err", herr)
				d = hooks.Fail()
			}
			if err := checkpoint(ctx); err != nil {
				return err
			}
			if d.GetRetry() != nil {
				prior = append(prior, failure)
				continue
			}
			return &requestFailed{failure: failure}
		}
		prior, overflowRetries = nil, 0
		if out.maxTokens {
			st.maxTokens = true
		}
		steered, err := a.drainSteering(turn)
		if err != nil {
			return err
		}
		cs, err = a.hk.PostStep.Run(ctx, &hooks.Step{Subject: a.subj, Turn: turn, Step: step})
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("agent/post-step: %w", err)
		}
		if err := a.appendContexts(cs, "post-step"); err != nil {
			return err
		}
		if err := checkpoint(ctx); err != nil {
			return err
		}
		if err := a.afterStep(ctx, turn, step); err != nil {
			return err
		}
		if _, err := a.appendOwned(session.StepEndEvent(turn, step)); err != nil {
			return err
		}
		st.stepOpen = false
		dflt := hooks.Stop()
		if out.hadToolCalls || steered > 0 {
			dflt = hooks.Continue()
		}
		d, err := a.hk.TurnContinuation.Run(ctx, &hooks.Continuation{Subject: a.subj, Turn: turn, Default: dflt},
			func(_ context.Context, in *hooks.Continuation) (*agentv1.ContinuationDecision, error) {
				return in.Default, nil
			})
		if err != nil {
			return fmt.Errorf("agent/turn-continuation: %w", err)
		}
		if err := checkpoint(ctx); err != nil {
			return err
		}
		if r := d.GetContinue().GetReason(); r != nil {
			a.mu.Lock()
			a.steering = append(a.steering, Item{Content: r.GetContent(), Source: sourceOr(r.GetSource(), "turn-continuation")})
			a.mu.Unlock()
		}
		a.mu.Lock()
		cont := d.GetContinue() != nil || len(a.steering) > 0
		a.mu.Unlock()
		stop, err := a.hk.TurnStop.Run(ctx, &hooks.TurnStop{Subject: a.subj, Turn: turn})
		if err != nil {
			return fmt.Errorf("agent/turn-stop: %w", err)
		}
		if err := checkpoint(ctx); err != nil {
			return err
		}
		if stop {
			st.terminal = true
			a.mu.Lock()
			a.releaseLocked(a.steering...)
			a.steering = nil
			a.mu.Unlock()
			cont = false
		}
		if !cont {
			return nil
		}
	}
}

// bakePrefix splits hook contexts by placement: prompt-prefix contexts are
// baked into the content with an envelope; the rest stay separate.
func bakePrefix(content []*llmv1.ContentBlock, contexts []*toolsv1.HookContext) ([]*llmv1.ContentBlock, *sessionv1.PromptEnvelope, []*toolsv1.HookContext) {
	var prefix, separate []*toolsv1.HookContext
	for _, c := range contexts {
		if c.GetPlacement() == toolsv1.ContextPlacement_CONTEXT_PLACEMENT_PROMPT_PREFIX {
			prefix = append(prefix, c)
		} else {
			separate = append(separate, c)
		}
	}
	if len(prefix) == 0 {
		return content, nil, separate
	}
	env := &sessionv1.PromptEnvelope{DisplayContent: content}
	var baked []*llmv1.ContentBlock
	for _, c := range prefix {
		baked = append(baked, c.GetContent()...)
		env.PrefixContexts = append(env.PrefixContexts, &sessionv1.PromptPrefixContext{Source: sourceOr(c.GetSource(), "hook"), Meta: c.Meta})
	}
	baked = append(baked, session.Text("\n\n## My request:\n"))
	baked = append(baked, content...)
	return baked, env, separate
}

// appendContexts appends separate hook contexts as context/message events.
func (a *Agent) appendContexts(cs []*toolsv1.HookContext, plugin string) error {
	for _, c := range cs {
		if len(c.GetContent()) == 0 {
			continue
		}
		if _, err := a.append(contextEvent(c.GetContent(), sourceOr(c.GetSource(), plugin), c.Meta)); err != nil {
			return err
		}
	}
	return nil
}

// drainSteering appends every pending steering item (steering/message, then
// its separate contexts) and returns how many it drained.
func (a *Agent) drainSteering(turn int32) (int, error) {
	a.mu.Lock()
	items := a.steering
	a.releaseLocked(items...)
	a.steering = nil
	a.mu.Unlock()
	for _, it := range items {
		baked, env, separate := bakePrefix(it.Content, it.Contexts)
		ev := &sessionv1.SessionEvent{SurfaceOp: session.AppendOp(), RequestId: it.RequestID, Payload: &sessionv1.SessionEvent_SteeringMessage{
			SteeringMessage: &sessionv1.SteeringMessage{Turn: turn, Content: baked, Source: sourceOr(it.Source, ""), Envelope: env}}}
		if _, err := a.append(ev); err != nil {
			return 0, err
		}
		if err := a.appendContexts(separate, "steering"); err != nil {
			return 0, err
		}
	}
	return len(items), nil
}

func (a *Agent) visibleHosts() []string { return a.h.GetOptions().GetToolhosts() }

// assemble returns the system prompt, the visible tools in their order and
// the default session prefix.
func (a *Agent) assemble() (string, []*llmv1.ToolSchema, []*llmv1.Message, error) {
	var tools []*llmv1.ToolSchema
	if a.cfg.Tools != nil {
		tools = a.cfg.Tools.Schemas(a.visibleHosts())
	}
	if a.cfg.Prompt == nil {
		return "", tools, nil, nil
	}
	o := a.log.Settings().Options
	in := prompt.Input{
		Provider: o.GetProvider(), Model: o.GetModel(), Cwd: a.h.GetCwd(),
		Persona: o.GetPersona(), SystemPrompt: o.GetSystemPrompt(), Tools: tools, Workspace: a.ws, Sections: a.sections,
		ApprovalNever: a.cfg.Approval != nil && a.cfg.Approval.Policy() == sessionv1.ApprovalPolicy_APPROVAL_POLICY_NEVER,
	}
	// Assembly is a pure function of its input: a step whose input is the
	// previous step's (the usual case) reuses its result.
	if c := a.asm; c != nil && sameInput(c.in, in) {
		return c.out.System, c.out.Tools, c.out.Prefix, nil
	}
	asm, err := a.cfg.Prompt.Assemble(in)
	if err != nil {
		a.asm = nil
		return "", nil, nil, fmt.Errorf("assemble system prompt: %w", err)
	}
	a.asm = &asmCache{in: in, out: asm}
	return asm.System, asm.Tools, asm.Prefix, nil
}

// asmCache is the driver's last prompt assembly and its input (nil while
// idle: an idle session holds ≤ 10 KiB).
type asmCache struct {
	in  prompt.Input
	out prompt.Assembly
}

// sameInput reports whether two assembly inputs are the same: equal
// strings and flags, the very same tool schemas and workspace context (the
// registry and the workspace refresh hand out shared immutable messages,
// replaced rather than edited on a change), and equal sections.
func sameInput(x, y prompt.Input) bool {
	return x.Provider == y.Provider && x.Model == y.Model && x.Cwd == y.Cwd && x.Persona == y.Persona &&
		x.SystemPrompt == y.SystemPrompt && x.ApprovalNever == y.ApprovalNever && x.Workspace == y.Workspace &&
		slices.Equal(x.Tools, y.Tools) && slices.Equal(x.Sections, y.Sections)
}

// refreshWorkspace re-reads the workspace context at a turn's start; a
// changed version drops the cached prefix so the next step assembles (and
// logs, as a new request/header) the new context. A failed read keeps the
// last context: a broken toolhost never fails a turn.
func (a *Agent) refreshWorkspace(ctx context.Context) error {
	if a.cfg.Workspace == nil {
		return nil
	}
	ws, err := a.cfg.Workspace.Context(ctx, a.h.GetCwd(), a.h.GetOptions().GetWorkspaceRoot(), a.visibleHosts())
	if err != nil {
		if cerr := checkpoint(ctx); cerr != nil {
			return cerr
		}
		a.lg.Warn("workspace context unavailable; keeping the last one", "session", a.ID(), "err", err)
		return nil
	}
	if a.ws == nil || ws.GetVersion() != a.ws.GetVersion() {
		a.ws, a.prefixSet = ws, false
	}
	return nil
}

// stepOutcome is what a successful step tells the turn.
type stepOutcome struct {
	hadToolCalls bool
	maxTokens    bool
}

// callConfigSeed is §4.7 step 1.
// A session/model logged after the latest request/header switches the
// route from this step on.
func (a *Agent) callConfigSeed() *llmv1.LlmCallConfig {
	set := a.log.Settings()
	o := set.Options
	if a.headerLogged {
		if h := a.log.RequestHeader(); h != nil {
			cfg := proto.CloneOf(h.GetConfig())
			if set.ModelSeq > a.log.RequestHeaderSeq() {
				cfg.Provider, cfg.Model = o.GetProvider(), o.GetModel()
			}
			return cfg
		}
	}
	return &llmv1.LlmCallConfig{Provider: o.GetProvider(), Model: o.GetModel(), Temperature: o.Temperature, MaxTokens: o.MaxTokens}
}

// errNoRoute is the ordinary step error of an empty provider or model.
var errNoRoute = errors.New("no provider/model configured for the request")

// runStep is semantics.md §4.7 after step/start.
func (a *Agent) runStep(ctx context.Context, turn, step int32, boundary []*llmv1.Message, system string, tools []*llmv1.ToolSchema) (stepOutcome, error) {
	cfg, err := a.hk.Request.Run(ctx, &hooks.Request{Subject: a.subj, Turn: turn, Step: step, Config: a.callConfigSeed()},
		func(_ context.Context, in *hooks.Request) (*llmv1.LlmCallConfig, error) { return in.Config, nil })
	if err != nil {
		return stepOutcome{}, fmt.Errorf("agent/request: %w", err)
	}
	if err := checkpoint(ctx); err != nil {
		return stepOutcome{}, err
	}
	if cfg.GetProvider() == "" || cfg.GetModel() == "" {
		return stepOutcome{}, errNoRoute
	}
	header := &sessionv1.EpochHeader{Config: proto.CloneOf(cfg), Tools: tools, MessagePrefix: a.prefix}
	if system != "" {
		header.System = proto.String(system)
	}
	session.CanonicalizeHeader(header) // header, its config and the slices are this step's own
	if err := a.logHeader(header); err != nil {
		return stepOutcome{}, err
	}
	// Without a prefix the request's messages are the boundary itself (the
	// log's slice, capped at its length, so nothing appended to it can
	// reach the log): copying it was a slice of the whole conversation per
	// step.
	msgs := boundary
	if len(a.prefix) > 0 {
		msgs = make([]*llmv1.Message, 0, len(a.prefix)+len(boundary))
		msgs = append(append(msgs, a.prefix...), boundary...)
	}
	req := &llmv1.GenerateRequest{
		Provider: cfg.GetProvider(), Model: cfg.GetModel(), Messages: msgs, System: header.System, Tools: tools,
		Temperature: cfg.Temperature, MaxTokens: cfg.MaxTokens, Stop: cfg.GetStop(), SessionId: a.ID(),
		Tenant: a.h.GetTenant(), RememberPrefix: true,
	}
	if a.cfg.Debug {
		if err := a.debugCheck(req); err != nil {
			return stepOutcome{}, err
		}
	}
	if err := a.flush(ctx); err != nil {
		return stepOutcome{}, fmt.Errorf("checkpoint before the model request: %w", err)
	}
	if err := checkpoint(ctx); err != nil {
		return stepOutcome{}, err
	}

	asm, seqs, err := a.stream(ctx, turn, step, req)
	if err != nil {
		return stepOutcome{}, err
	}
	if err := checkpoint(ctx); err != nil {
		return stepOutcome{}, err
	}
	finish := asm.Finish()
	if f := finish.GetError().GetFailure(); finish.GetError() != nil {
		return stepOutcome{}, &RequestFailure{Failure: failureOr(f, "ERROR")}
	}
	if finish.GetAborted() != nil {
		return stepOutcome{}, &RequestFailure{Failure: failureOr(finish.GetAborted().GetFailure(), "ABORTED")}
	}
	assembled, err := asm.Message()
	if err != nil {
		return stepOutcome{}, fmt.Errorf("assemble the response: %w", err)
	}
	maxTokens := finish.GetMaxTokens() != nil
	stripped := false
	if maxTokens {
		assembled, stripped = stripToolCalls(assembled)
	}
	prov := &llmv1.AssistantProvenance{Provider: cfg.GetProvider(), Model: cfg.GetModel()}
	usage := asm.Usage()
	// A hook gets its own copy (it may change or keep it); with none the
	// result is the assembled message itself.
	in := &hooks.StepResult{Subject: a.subj, Turn: turn, Step: step, Message: assembled}
	if a.hk.StepResult.Len() > 0 {
		in.Message = proto.CloneOf(assembled)
	}
	res, err := a.hk.StepResult.Run(ctx, in,
		func(_ context.Context, in *hooks.StepResult) (*llmv1.Message, error) { return in.Message, nil })
	if err != nil || ctx.Err() != nil {
		// Every successful provider call leaves exactly one assistant/message
		// (built here, no hook saw it: the log takes it as it is).
		if _, aerr := a.appendOwned(session.AssistantMessageEvent(turn, step, nil, prov, usage, seqs)); aerr != nil {
			return stepOutcome{}, aerr
		}
		if err != nil {
			return stepOutcome{}, fmt.Errorf("agent/step-result: %w", err)
		}
		return stepOutcome{}, errCancelled
	}
	if maxTokens {
		var s bool
		res, s = stripToolCalls(res)
		stripped = stripped || s
	}
	if rs := asm.ReplayState(); rs != nil && !stripped && (res == assembled || proto.Equal(&llmv1.Message{Content: res.GetContent()}, &llmv1.Message{Content: assembled.GetContent()})) {
		prov.ReplayState = rs
	}
	var calls []*llmv1.ToolCallBlock
	if !maxTokens {
		for _, b := range res.GetContent() {
			if tc := b.GetToolCall(); tc != nil {
				calls = append(calls, tc)
			}
		}
	}
	// With no hook the content is the assembler's: blocks built from
	// deltas, and closed blocks shared with the logged chunk events, which
	// nothing mutates either (the batch below only reads the calls'
	// strings): the log takes it without copying it.
	add := a.log.Append
	if res == assembled {
		add = a.log.AppendOwned
	}
	a.mu.Lock()
	_, err = a.appendLockedHow(session.AssistantMessageEvent(turn, step, res.GetContent(), prov, usage, seqs), add)
	if err == nil && len(calls) > 0 {
		a.inBatch = true
	}
	a.mu.Unlock()
	if err != nil {
		return stepOutcome{}, err
	}
	if len(calls) == 0 {
		return stepOutcome{maxTokens: maxTokens}, nil
	}
	err = a.runBatch(ctx, turn, step, calls)
	a.mu.Lock()
	a.inBatch = false
	deferred := a.batchFIFO
	a.batchFIFO = nil
	a.mu.Unlock()
	for _, ev := range deferred {
		if _, aerr := a.append(ev); aerr != nil {
			return stepOutcome{}, errors.Join(err, aerr)
		}
	}
	if err != nil {
		return stepOutcome{}, err
	}
	return stepOutcome{hadToolCalls: true}, nil
}

// stream runs one model call, appending every chunk, under a model-call span.
func (a *Agent) stream(ctx context.Context, turn, step int32, req *llmv1.GenerateRequest) (asm *llmstream.Assembler, seqs []int64, err error) {
	// Shared: the chunks are logged (immutable) before they are pushed, so
	// the assembled message keeps their closed blocks and usage rather
	// than a second copy of each for as long as the session is loaded.
	asm, seqs = &llmstream.Assembler{Shared: true}, make([]int64, 0, 16)
	mctx, span := telemetry.StartModelCall(ctx, a.ID(), req.GetProvider(), req.GetModel())
	defer func() {
		finish := asm.Finish()
		if f, ok := AsRequestFailure(err); ok {
			finish = &llmv1.FinishReason{Kind: &llmv1.FinishReason_Error{Error: &llmv1.FinishError{Failure: f}}}
		} else if err != nil {
			finish = &llmv1.FinishReason{Kind: &llmv1.FinishReason_Aborted{Aborted: &llmv1.FinishAborted{
				Failure: &llmv1.LlmFailure{Code: "ABORTED", Message: err.Error()}}}}
		}
		telemetry.EndModelCall(span, req.GetModel(), asm.Usage(), finish)
	}()
	for batch, err := range batches(mctx, a.cfg.LLM, req) {
		if err != nil {
			if ctx.Err() != nil {
				return asm, seqs, errCancelled
			}
			return asm, seqs, err
		}
		if ctx.Err() != nil {
			return asm, seqs, errCancelled
		}
		// The chunks received together are one event. They are this
		// call's own (LLM: never mutated once yielded): the log takes
		// them as they are, and the assembler shares what it keeps of
		// them (a block-end's block, the usage, the finish reason).
		ev, err := a.appendOwned(session.ChunkEvent(turn, step, batch))
		if err != nil {
			return asm, seqs, err
		}
		seqs = append(seqs, ev.GetSeq())
		for _, chunk := range batch {
			asm.Push(chunk)
		}
	}
	return asm, seqs, nil
}

func failureOr(f *llmv1.LlmFailure, code string) *llmv1.LlmFailure {
	if f != nil && f.GetCode() != "" && f.GetMessage() != "" {
		return f
	}
	return &llmv1.LlmFailure{Code: code, Message: "model request failed without details"}
}

func stripToolCalls(m *llmv1.Message) (*llmv1.Message, bool) {
	out := &llmv1.Message{Role: m.GetRole(), Provenance: m.GetProvenance()}
	for _, b := range m.GetContent() {
		if b.GetToolCall() != nil {
			continue
		}
		out.Content = append(out.Content, b)
	}
	return out, len(out.Content) != len(m.GetContent())
}

// logHeader appends request/header per the logging rule of §3.7. The log
// keeps the header this agent logged as it is (canonical, appended owned),
// so the next step's header shares its tools and prefix by pointer and the
// comparison needs no walk.
func (a *Agent) logHeader(h *sessionv1.EpochHeader) error {
	latest := a.log.RequestHeader()
	var reason sessionv1.HeaderReason
	switch {
	case !a.headerLogged && latest == nil:
		reason = sessionv1.HeaderReason_HEADER_REASON_INITIAL
	case !a.headerLogged:
		reason = sessionv1.HeaderReason_HEADER_REASON_RESUME
	case !session.HeaderEqual(latest, h):
		reason = sessionv1.HeaderReason_HEADER_REASON_CHANGE
	default:
		return nil
	}
	// h is this step's own (runStep: a fresh header and a copy of the
	// hook's config); what it shares — the registry's tool schemas and the
	// agent's prefix copy — is never mutated: the log takes it without the
	// copy Append makes, which was a deep copy of every tool schema.
	_, err := a.appendOwned(&sessionv1.SessionEvent{Payload: &sessionv1.SessionEvent_RequestHeader{
		RequestHeader: &sessionv1.RequestHeader{Header: h, Reason: reason}}})
	if err == nil {
		a.headerLogged = true
	}
	return err
}

// InvariantFailure is the loud debug-mode error of a broken invariant or a
// request that is not a pure function of the log.
type InvariantFailure struct{ Err error }

func (e *InvariantFailure) Error() string { return "debug invariant check failed: " + e.Err.Error() }
func (e *InvariantFailure) Unwrap() error { return e.Err }

// Code is the stable error code.
func (e *InvariantFailure) Code() string { return session.CodeInvariant }

func (a *Agent) debugCheck(req *llmv1.GenerateRequest) error {
	events := a.log.Events()
	// The checker is fed incrementally: every event is checked once, in
	// order, exactly as CheckLog would, without re-walking the whole log
	// before every request (quadratic over a long session).
	var err error
	for _, ev := range events[a.checked:] {
		if err = a.checker.Check(ev); err != nil {
			break
		}
	}
	a.checked = len(events)
	if err != nil {
		a.lg.Error("DEBUG: session invariant broken", "err", err)
		return &InvariantFailure{Err: err}
	}
	if err := session.CheckRequest(events, req); err != nil {
		a.lg.Error("DEBUG: request is not a pure function of the log", "err", err)
		return &InvariantFailure{Err: err}
	}
	return nil
}
